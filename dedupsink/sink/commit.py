"""The driver's commit of one window: a new store version, then the ports' publication.

Each step is safe to crash after (docs/ARCHITECTURE.md, "The commit protocol"):

1. Read the version the tasks classified against (the *base*; the one this process wrote last
   needs no read) and finish its publication if a crash interrupted it.
2. A batch already committed (a re-run after the sink commit) discards its staged files.
3. Claim the store (``store/ownership.py``): wait for a live owner's lease, fail if another
   query is using the store or if this run was fenced.
4. Settle keys several partitions found new (``settle``).
5. Build the next version (``nextversion``) and create it only if absent: the *commit point*.
   A writer that lost the race gets ``StoreConflictError`` naming the winner.
6. Publish the ports from the version's publication record, discard the staging folder, and
   every ``GARBAGE_EVERY`` versions delete garbage and sweep leftovers of failed attempts.
7. Record the window in the store's history (``store/history.py``), created only if absent;
   every ``GARBAGE_EVERY`` versions, before the garbage collection deletes old manifests,
   compact the history and write the rows a crash after a commit point left out.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from dedupsink.engine.classify import PORTS, CommittedState, NewKeys, bucket_of, stamp_dtype
from dedupsink.engine.settings import TIME_BUCKET_MODES
from dedupsink.errors import StoreConflictError, StoreOwnershipError
from dedupsink.options import ASSUME_SAME_EXPIRY, bool_text
from dedupsink.ports.base import PortFormat
from dedupsink.ports.encoding import port_schema
from dedupsink.ports.output import Output, PortFile
from dedupsink.sink.compaction import KeysContext, WrittenKeys, fold_producers, write_window_file
from dedupsink.sink.nextversion import WindowUpdate, next_version
from dedupsink.sink.plan import SinkPlan
from dedupsink.sink.settle import Holder, Moved, StagedKeys, settle_window, staged_files
from dedupsink.sink.task import TaskSummary
from dedupsink.store.cache import manager_for
from dedupsink.store.format import Manifest
from dedupsink.store.history import record_window
from dedupsink.store.ownership import Writer, claim, describe_owner, now_ms
from dedupsink.store.records import WindowCounts
from dedupsink.store.store import GARBAGE_EVERY, BucketStore

log = logging.getLogger("dedupsink")

# Versions this process published, by output (immutable facts: a published version stays
# published), so a commit need not ask the filesystem about the version it published itself a
# window ago.
_published: set[tuple[str, str, int]] = set()
# Query runs that have swept the staging folders of earlier runs, by output. A run stages in
# folders of its own, so what a run killed before its commit staged for a window is left to the
# first commit of the next run (or to the garbage collection every 16 versions).
_swept: set[tuple[str, str]] = set()


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
    cache_hit_rate: float | None = None
    assume_same_expiry: bool | None = None  # None in the modes the setting does not apply to
    windows: int = 0  # windows the store has committed, this one included (as the CLI counts)

    def line(self) -> str:
        hit = "n/a" if self.cache_hit_rate is None else f"{self.cache_hit_rate:.0%}"
        setting = ""
        if self.assume_same_expiry is not None:
            setting = f" | {ASSUME_SAME_EXPIRY}={bool_text(self.assume_same_expiry)}"
        return (
            f"dedup window {self.windows} (batch {self.batch_id}, version {self.version}): "
            f"{self.counts.text()} | store "
            f"{self.store_files} files {self.store_bytes / 1e6:.1f} MB {self.remembered} keys"
            f" | cache hits {hit}{setting}"
        )


def commit_window(
    plan: SinkPlan, summaries: Sequence[TaskSummary | None], batch_id: int
) -> CommitReport | None:
    done = sorted((s for s in summaries if s is not None), key=lambda s: s.identity.partition)
    if not done:
        return None
    identity = done[0].identity
    store, output = plan.store, plan.output
    writer = plan.writer(identity.query_id, identity.run)
    base = _base_version(store, done, writer, batch_id)
    ports = plan.ports
    ports.create_deferred_tables(plan.schema)
    finish_publication(ports, base)
    if any(s.skipped for s in done) or base.queries.get(writer.query, -1) >= batch_id:
        return _discard_rerun(store, output, done, base, writer, batch_id)
    claim(store, base, writer)
    holders = [_holder(s) for s in done]
    try:
        moves = settle_window(output, holders, stamp_dtype(plan.settings))
        promoted = _apply_moves(plan, store, base, done, holders, moves)
        if plan.settings.by_sequence:
            promoted += _fold_producers(plan, store, base, done)
        schema_files = _schema_files(plan, output, base, done)
        crossed = _cross_partition(done, moves)
        update = WindowUpdate(plan, base, writer, batch_id, done, schema_files, crossed, now_ms())
        update.promoted = promoted
        nxt = next_version(update)
        store.commit(nxt)
    except (StoreConflictError, FileNotFoundError):
        # An earlier attempt of this very commit may have passed its commit point (and removed
        # the staged keys this one reads): finish its publication instead.
        latest = store.read()
        if latest is None or latest.queries.get(writer.query, -1) < batch_id:
            raise
        finish_publication(ports, latest)
        return _discard_rerun(store, output, done, latest, writer, batch_id)
    publish(ports, nxt)
    staged = _unpublished(staged_files(holders, moves) + [f.path for f in schema_files], nxt)
    if nxt.version % GARBAGE_EVERY:
        output.discard_staging(done[0].folder, staged)
    else:  # the garbage collection sweeps the staging folders, but not the tables' folders
        output.discard_outside(done[0].folder, staged)
    record_window(store, nxt)
    if plan.settings.by_sequence:
        store.discard_window_files(_folded_at_once(done, nxt))
    _collect_garbage(store, output, nxt, writer.run)
    report = _report(plan, nxt, done, writer, batch_id)
    log.info(report.line())
    return report


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


def publish(ports: PortFormat, manifest: Manifest) -> None:
    if manifest.publication is not None:
        ports.publish(manifest.publication, manifest.store_id)
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
    holders = [_holder(s) for s in done]
    # An earlier attempt of this commit may have published these very files in place.
    output.discard_staging(done[0].folder, _unpublished(staged_files(holders, []), base))
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


def _holder(summary: TaskSummary) -> Holder:
    identity = summary.identity
    return Holder(
        identity.partition,
        identity.attempt,
        summary.folder,
        summary.settlement,
        summary.counts.unique,
        summary.files,
    )


def _apply_moves(
    plan: SinkPlan,
    store: BucketStore,
    base: Manifest,
    done: list[TaskSummary],
    holders: list[Holder],
    moves: list[Moved],
) -> list[WrittenKeys]:
    """Settlement moved rows between a task's ports: its files and counts follow. A task whose
    rows went to duplicate has its window file written again without their keys (the old file
    is left to the garbage collection, as a failed attempt's); keys promoted back to unique,
    which their task left out of its own, get a window file of theirs, returned."""
    by_holder = {id(h): s for h, s in zip(holders, done, strict=True)}
    promoted = []
    for move in moves:
        summary = by_holder[id(move.holder)]
        summary.files = move.holder.files
        summary.counts = summary.counts.moved(move.rows, move.source, move.target)
        if plan.settings.by_sequence:
            continue  # the window files hold producers' highest ids, which no move changes
        if move.still_kept is not None:
            # Only partition 0 folds, and it keeps every key it found new: never demoted.
            summary.written = _window_file(plan, store, base, summary, move.still_kept)
        if move.keys is not None and len(move.keys):
            promoted.append(_window_file(plan, store, base, summary, move.keys))
    return promoted


def _folded_at_once(done: list[TaskSummary], nxt: Manifest) -> list[str]:
    """The tasks' window files this version both added and dropped (sequence dedup's fold):
    live in no version, so no reader ever reads them."""
    written = [s.written.window_file.name for s in done if s.written and s.written.window_file]
    return [name for name in written if name not in nxt.files]


def _fold_producers(
    plan: SinkPlan, store: BucketStore, base: Manifest, done: list[TaskSummary]
) -> list[WrittenKeys]:
    options = plan.options
    manager = manager_for(
        store,
        base,
        options.max_cached_buckets,
        stamp_dtype(plan.settings),
        options.max_cache_memory.nbytes,
    )
    written = [s.written for s in done if s.written is not None]
    folded = fold_producers(manager, base, plan.settings, written)
    return [] if folded is None else [folded]


def _window_file(
    plan: SinkPlan, store: BucketStore, base: Manifest, summary: TaskSummary, keys: StagedKeys
) -> WrittenKeys:
    """A window file of a task's partition holding these keys, as its task would write it."""
    expiry_point = CommittedState(base.latest).expiry_point(plan.settings)
    buckets = bucket_of(plan.settings, keys.fingerprints, keys.stamps)
    new = NewKeys(keys.fingerprints.h1, keys.fingerprints.h2, buckets, keys.stamps)
    context = KeysContext(plan.settings, expiry_point, tuple(summary.new_categories))
    return write_window_file(store, base, context, new, summary.identity.partition, [])


def _cross_partition(done: list[TaskSummary], moves: list[Moved]) -> int:
    """Rows that are duplicates because another partition of the window had the key too."""
    yielded = sum(s.settlement.yielded for s in done)
    demoted = sum(m.rows for m in moves if m.target == "duplicate")
    promoted = sum(m.rows for m in moves if m.target == "unique")
    return yielded + demoted - promoted


def _schema_files(
    plan: SinkPlan, output: Output, base: Manifest, done: list[TaskSummary]
) -> list[PortFile]:
    """An empty file for each port that has no file yet and no rows in this window: a port is
    readable, with its schema, from the first committed window on."""
    files: list[PortFile] = []
    if not plan.ports.schema_files:
        return files
    for port in PORTS:
        state = base.ports.get(port)
        has_rows = any(f.port == port and f.rows > 0 for s in done for f in s.files)
        if has_rows or (state is not None and state.files > 0):
            continue
        relative = f"{done[0].folder}/pschema-0.{port}.parquet"
        size = output.write_table(relative, port_schema(port, plan.schema).empty_table())
        files.append(PortFile(port, relative, 0, size))
    return files


def _collect_garbage(store: BucketStore, output: Output, manifest: Manifest, run: str) -> None:
    first_of_run = (output.url, run) not in _swept
    _swept.add((output.url, run))
    if manifest.version % GARBAGE_EVERY == 0:
        store.collect_garbage(manifest)
    elif not first_of_run:
        return
    output.remove_stale_staging(manifest.version)


def _report(
    plan: SinkPlan, nxt: Manifest, done: list[TaskSummary], writer: Writer, batch_id: int
) -> CommitReport:
    hits = sum(s.cache.hits for s in done if s.cache)
    misses = sum(s.cache.misses for s in done if s.cache)
    last = nxt.last_window
    settings = plan.settings
    return CommitReport(
        version=nxt.version,
        windows=nxt.totals.windows,
        batch_id=batch_id,
        query_id=writer.query,
        counts=last.counts if last else WindowCounts(),
        cross_partition_duplicates=last.cross_partition_duplicates if last else 0,
        store_files=len(nxt.files),
        store_bytes=sum(wf.nbytes for wf in nxt.files.values()),
        remembered=nxt.remembered_keys,
        cache_hit_rate=hits / (hits + misses) if hits + misses else None,
        assume_same_expiry=(
            settings.assume_same_expiry if settings.mode in TIME_BUCKET_MODES else None
        ),
    )
