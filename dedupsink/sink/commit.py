"""The driver's commit of one window: a new store version, then the ports' publication.

Each step is safe to crash after (docs/ARCHITECTURE.md, "The commit protocol"):

1. Read the version the tasks classified against (the *base*; the one this process wrote last
   needs no read) and finish its publication if a crash interrupted it.
2. A batch already committed (a re-run after the sink commit) discards its staged files.
3. Claim the store (``store/ownership.py``): wait for a live owner's lease, fail if another
   query is using the store or if this run was fenced.
4. Settle keys several partitions found new (``settle``).
5. Build the window's transaction (``window_updates``, ``store/transaction``) and create the next
   version only if absent: the *commit point*.
   A writer that lost the race gets ``StoreConflictError`` naming the winner.
6. Publish the ports from the version's publication record, discard the staging folder, and
   every ``GARBAGE_EVERY`` versions delete garbage and sweep leftovers of failed attempts.
7. Record the window in the store's history (``store/history.py``), created only if absent;
   every ``GARBAGE_EVERY`` versions, before the garbage collection deletes old manifests,
   compact the history and write the rows a crash after a commit point left out.
8. With ``compactEvery=N``, every N-th version: compact the port tables
   (``ports/compaction.py``). The window is committed and published by then: a compaction that
   fails is logged and skipped, never failing the window.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import pyarrow as pa

from dedupsink.engine.classify import stamp_dtype
from dedupsink.engine.settings import TIME_BUCKET_MODES
from dedupsink.errors import DedupError, StoreConflictError, StoreOwnershipError
from dedupsink.options import ASSUME_SAME_EXPIRY, bool_text
from dedupsink.ports.base import Call, PortFormat
from dedupsink.ports.formats import compactor_for
from dedupsink.ports.output import Output
from dedupsink.runtime import RUNTIME
from dedupsink.sink.plan import SinkPlan
from dedupsink.sink.settle import SettlingTask, settle_window, staged_files
from dedupsink.sink.task import TaskSummary
from dedupsink.sink.window_updates import (
    WindowCommit,
    cross_partition,
    empty_port_files,
    files_written_by_commit,
)
from dedupsink.store.format import Manifest
from dedupsink.store.history import record_window
from dedupsink.store.ownership import Writer, claim, describe_owner
from dedupsink.store.records import StateUse, WindowCounts, now_ms
from dedupsink.store.retry import WAITS, StoreWaits
from dedupsink.store.store import GARBAGE_EVERY, BucketStore

log = logging.getLogger("dedupsink")

# Versions this process published, by output (immutable facts: a published version stays
# published), so a commit need not ask the filesystem about the version it published itself a
# window ago.
_published: set[tuple[str, str, int]] = RUNTIME.cache("sink.published", set)
# Query runs that have swept the staging folders of earlier runs, by output. A run stages in
# folders of its own, so what a run killed before its commit staged for a window is left to the
# first commit of the next run (or to the garbage collection every 16 versions).
_swept: set[tuple[str, str]] = RUNTIME.cache("sink.swept_runs", set)


@dataclass
class CommitReport:
    """What a commit did, for the log line and for tests."""

    version: int  # the store version the commit created (or found, for a re-run)
    batch_id: int
    query_id: str
    counts: WindowCounts = field(default_factory=WindowCounts)
    already_committed: bool = False
    cross_partition_duplicates: int = 0
    store_files: int = 0
    store_bytes: int = 0
    remembered: int = 0
    expired_unfolded: int = 0  # keys at or below the expiry point awaiting a fold
    cache_hit_rate: float | None = None
    assume_same_expiry: bool | None = None  # None in the modes the setting does not apply to
    state: StateUse = field(default_factory=StateUse)
    # What each task's process held after its last task of the window: host:pid -> use.
    held: dict[str, StateUse] = field(default_factory=dict)
    # Requests retried by the tasks and the whole commit, publication included.
    store_waits: StoreWaits = field(default_factory=StoreWaits)

    def held_text(self) -> str:
        return ", ".join(
            f"{process} {use.private / 1e6:.1f} MB private + {use.mapped / 1e6:.1f} MB mapped"
            for process, use in sorted(self.held.items())
        )

    def _awaiting_fold(self) -> str:
        return f" (+{self.expired_unfolded} expired awaiting fold)" if self.expired_unfolded else ""

    def line(self) -> str:
        hit = "n/a" if self.cache_hit_rate is None else f"{self.cache_hit_rate:.0%}"
        setting = ""
        if self.assume_same_expiry is not None:
            setting = f" | {ASSUME_SAME_EXPIRY}={bool_text(self.assume_same_expiry)}"
        return (
            f"dedup window {self.version} (batch {self.batch_id}): "
            f"{self.counts.text()} | store "
            f"{self.store_files} files {self.store_bytes / 1e6:.1f} MB {self.remembered} keys"
            f"{self._awaiting_fold()} | {self.state.text()} | cache hits {hit}{setting}"
            f" | {self.store_waits.text()}"
        )


def commit_window(
    plan: SinkPlan, summaries: Sequence[TaskSummary | None], batch_id: int
) -> CommitReport | None:
    commit_started_at = time.time()
    done = sorted((s for s in summaries if s is not None), key=lambda s: s.identity.partition)
    if not done:
        return None
    identity = done[0].identity
    waits = WAITS.now()
    store, output = plan.store, plan.output
    writer = plan.writer(identity.query_id, identity.run)
    base = _base_version(store, done, writer, batch_id)
    plan = replace(plan, settings=plan.settings.laid_out_as(base.settings))
    ports = plan.ports
    ports.create_deferred_tables(plan.schema)
    finish_publication(ports, base)
    if any(s.skipped for s in done) or base.queries.get(writer.query, -1) >= batch_id:
        return _discard_rerun(store, output, done, base, writer, batch_id)
    claim(store, base, writer)
    settling = [_settling_task(s) for s in done]
    try:
        moves = settle_window(output, settling, stamp_dtype(plan.settings))
        written = files_written_by_commit(plan, store, base, done, settling, moves)
        schema_files = empty_port_files(plan, output, base, done)
        window = WindowCommit(
            plan,
            base,
            writer,
            batch_id,
            done,
            schema_files,
            now_ms(),
            WAITS.now() - waits,
            commit_started_at,
        )
        transaction = window.transaction(written, cross_partition(done, moves))
        committed = transaction.commit(store, window.now_ms)
    except (StoreConflictError, FileNotFoundError):
        # An earlier attempt of this very commit may have passed its commit point (and removed
        # the staged keys this one reads): finish its publication instead.
        latest = store.read()
        if latest is None or latest.queries.get(writer.query, -1) < batch_id:
            raise
        finish_publication(ports, latest)
        return _discard_rerun(store, output, done, latest, writer, batch_id)
    staged = staged_files(settling, moves) + [f.path for f in schema_files]
    beside = [
        partial(_discard_staging, output, committed, done[0].folder, staged),
        partial(record_window, store, committed),
    ]
    publish(ports, committed, beside)
    _after_publication(plan, committed, done, writer)
    report = _report(plan, committed, done, writer, batch_id)
    report.store_waits = sum((s.store_waits for s in done), WAITS.now() - waits)
    log.info(report.line())
    compact_after(plan, committed)
    log.debug("dedup window %s: state held by process %s", report.version, report.held_text())
    return report


def _discard_staging(output: Output, committed: Manifest, folder: str, staged: list[str]) -> None:
    """Step 6's first part: the window's staging folder, and what it staged in the tables'
    folders but did not publish; at a collection, only the latter (the collection sweeps the
    staging folders, but not the tables' folders)."""
    unpublished = _unpublished(staged, committed)
    if committed.version % GARBAGE_EVERY:
        output.discard_staging(folder, unpublished)
    else:
        output.discard_outside(folder, unpublished)


def _after_publication(
    plan: SinkPlan, committed: Manifest, done: list[TaskSummary], writer: Writer
) -> None:
    """The rest of steps 6 and 7, once the window is published, its staging discarded and its
    history row recorded: sequence dedup's folded window files, and the garbage."""
    store, output = plan.store, plan.output
    if plan.settings.by_sequence:
        store.discard_window_files(_folded_at_once(done, committed))
    _collect_garbage(store, output, committed, writer.run)


def compact_after(plan: SinkPlan, committed: Manifest) -> None:
    """Step 8: every ``compactEvery`` versions, compact the port tables. The window is
    committed and published: a compaction that fails is logged and left to the next time."""
    every = plan.options.compact_every
    if not every or committed.version % every:
        return
    from dedupsink.ports.compaction import compact_ports  # a query's every N-th commit only

    try:
        compact_ports(compactor_for(plan.ports), plan.options.compact_target_size.nbytes)
    except (DedupError, OSError, pa.ArrowException) as exc:
        log.warning(
            "dedup port compaction after version %s skipped (the window is committed): %s",
            committed.version,
            exc,
        )


def _base_version(
    store: BucketStore, done: list[TaskSummary], writer: Writer, batch_id: int
) -> Manifest:
    """The version every task classified against (they must agree)."""
    bases = sorted({(s.base_version, s.store_id) for s in done})
    if len(bases) > 1:
        versions = ", ".join(str(v) for v, _ in bases)
        latest = store.read()
        owner = None if latest is None else latest.owner
        if owner is not None and owner.query != writer.query:
            # A live query wrote between this batch's tasks: name it, as a claim would have.
            raise StoreOwnershipError(
                f"store {store.url} is in use by {describe_owner(owner)}: it committed "
                f"while the tasks of {writer.describe()} ran (they read "
                f"versions {versions}). Two queries cannot write one store at once: stop one "
                "of them."
            )
        raise StoreConflictError(
            f"the tasks of batch {batch_id} classified against different versions of store "
            f"{store.url} ({versions}): another writer committed "
            "while they ran. Restart the query to re-run the batch."
        )
    version, store_id = bases[0]
    return store.read_base(version, store_id)


def finish_publication(ports: PortFormat, manifest: Manifest) -> None:
    """Publish a committed version's ports if a crash interrupted it (idempotent)."""
    publication = manifest.publication
    key = (ports.output.url, manifest.store_id, manifest.version)
    if publication is None or key in _published:
        return
    if not ports.is_published(publication, manifest.store_id):
        ports.publish(publication, manifest.store_id)
    _published.add(key)


def publish(ports: PortFormat, manifest: Manifest, beside: Sequence[Call] = ()) -> None:
    """Publish a version just committed, making the calls ``beside`` with its last requests."""
    if manifest.publication is None:
        ports.output.storage.together(beside)
        return
    ports.publish(manifest.publication, manifest.store_id, beside)
    _published.add((ports.output.url, manifest.store_id, manifest.version))


def _unpublished(staged: list[str], manifest: Manifest) -> list[str]:
    """The staged files a window's publication does not leave where they are: all but the
    files a table format published in place."""
    publication = manifest.publication
    kept = set() if publication is None else {m.target for m in publication.moves if m.in_place}
    return [name for name in staged if name not in kept]


def _discard_rerun(
    store: BucketStore,
    output: Output,
    done: list[TaskSummary],
    base: Manifest,
    writer: Writer,
    batch_id: int,
) -> CommitReport:
    settling = [_settling_task(s) for s in done]
    # An earlier attempt of this commit may have published these very files in place.
    output.discard_staging(done[0].folder, _unpublished(staged_files(settling, []), base))
    last = base.last_window
    committed_here = last is not None and (last.query, last.batch) == (writer.query, batch_id)
    if base.publication is not None and committed_here:
        # The attempt that committed this batch died before removing its staging folder (or
        # before collecting garbage): do it now.
        output.storage.delete_folder(output.path(base.publication.folder))
        record_window(store, base)
        _collect_garbage(store, output, base, writer.run)
    log.info("dedup batch %s of %s was already committed; re-run discarded", batch_id, writer.query)
    return CommitReport(base.version, batch_id, writer.query, already_committed=True)


def _settling_task(summary: TaskSummary) -> SettlingTask:
    identity = summary.identity
    return SettlingTask(
        identity.partition,
        identity.attempt,
        summary.folder,
        summary.settlement,
        summary.counts.unique,
        summary.files,
    )


def _folded_at_once(done: list[TaskSummary], committed: Manifest) -> list[str]:
    """The tasks' window files this version both added and dropped (sequence dedup's fold):
    live in no version, so no reader ever reads them."""
    written = [s.written.window_file.name for s in done if s.written and s.written.window_file]
    return [name for name in written if name not in committed.files]


def _collect_garbage(store: BucketStore, output: Output, manifest: Manifest, run: str) -> None:
    first_of_run = (output.url, run) not in _swept
    _swept.add((output.url, run))
    if manifest.version % GARBAGE_EVERY == 0:
        store.collect_garbage(manifest)
    elif not first_of_run:
        return
    output.remove_stale_staging(manifest.version)


def _report(
    plan: SinkPlan, committed: Manifest, done: list[TaskSummary], writer: Writer, batch_id: int
) -> CommitReport:
    hits = sum(s.cache.hits for s in done if s.cache)
    misses = sum(s.cache.misses for s in done if s.cache)
    last = committed.last_window
    settings = plan.settings
    return CommitReport(
        version=committed.version,
        batch_id=batch_id,
        query_id=writer.query,
        counts=last.counts if last else WindowCounts(),
        cross_partition_duplicates=last.cross_partition_duplicates if last else 0,
        store_files=len(committed.files),
        store_bytes=sum(f.nbytes for f in committed.files.values()),
        remembered=committed.remembered_keys,
        expired_unfolded=committed.expired_unfolded_keys,
        cache_hit_rate=hits / (hits + misses) if hits + misses else None,
        state=last.state if last else StateUse(),
        held={s.process: s.state for s in done if s.process},
        assume_same_expiry=(
            settings.assume_same_expiry if settings.mode in TIME_BUCKET_MODES else None
        ),
    )
