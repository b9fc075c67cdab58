"""The driver's commit of one window: a new store version, then publication of the ports.

Order of operations, each step safe to crash after:

1. Check the owner lease (another query's live lease: fail, touching nothing), finish the
   publication of the latest version if a crash interrupted it, and recognise a batch already
   committed (a re-run after the sink commit): drop the re-run's staged files.
2. Check that every task classified against the latest version.
3. Settle keys that several partitions each found new in this window: the lowest partition
   keeps its row as unique, the others' copies move to ``duplicate`` (the only case in which
   the driver reads rows; hash-partitioning the input by key avoids it).
4. Write the next manifest: new window files and segments, the latest point, expired window
   files dropped, the owner lease, this (query, batch) and the publication plan. Once it is
   visible the window is committed.
5. Publish: move staged files into the ports, write Spark's sink log, mark published.
6. Collect garbage: staged leftovers, window files dropped two versions ago, old manifests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

from dedupsink.engine.classify import PORTS
from dedupsink.engine.fingerprint import Fingerprints, first_occurrences
from dedupsink.engine.settings import TIME_BUCKET_MODES
from dedupsink.errors import StoreConflictError, StoreError
from dedupsink.options import ASSUME_SAME_EXPIRY, bool_text
from dedupsink.sink.ports import Output, PortFile, port_schema
from dedupsink.sink.task import SinkPlan, TaskSummary, check_owner
from dedupsink.store.format import Manifest, PortState, Segment
from dedupsink.store.store import TOMBSTONE_GRACE_VERSIONS, BucketStore, now_ms

log = logging.getLogger("dedupsink")

_KEEP_QUERIES = 32
_ORPHAN_SWEEP_EVERY = 16


@dataclass
class CommitReport:
    """What a commit did, for the log line and for tests."""

    window: int
    batch_id: int
    query_id: str
    counts: dict[str, int] = field(default_factory=dict)
    already_committed: bool = False
    cross_partition_duplicates: int = 0
    store_files: int = 0
    store_bytes: int = 0
    remembered: int = 0
    cache_hit_rate: float | None = None
    assume_same_expiry: bool | None = None  # None in the modes the setting does not apply to

    def line(self) -> str:
        ports = " ".join(f"{port}={self.counts.get(port, 0)}" for port in PORTS)
        hit = "n/a" if self.cache_hit_rate is None else f"{self.cache_hit_rate:.0%}"
        setting = ""
        if self.assume_same_expiry is not None:
            setting = f" | {ASSUME_SAME_EXPIRY}={bool_text(self.assume_same_expiry)}"
        return (
            f"dedup window {self.window} (batch {self.batch_id}): {ports} | store "
            f"{self.store_files} files {self.store_bytes / 1e6:.1f} MB {self.remembered} keys"
            f" | cache hits {hit}{setting}"
        )


def commit_window(
    plan: SinkPlan, summaries: Sequence[TaskSummary | None], batch_id: int
) -> CommitReport | None:
    done = [s for s in summaries if s is not None]
    if not done:
        return None
    query_id = done[0].identity.query_id
    store, output = plan.store, plan.output
    manifest = store.read() or store.open(plan.settings)
    # Before touching anything: a query that does not hold the store must not publish (and so
    # race) the owner's windows, nor commit.
    check_owner(manifest, query_id, plan.options.owner_timeout.micros // 1000, store.url)
    finish_publication(store, output, manifest)
    token = done[0].identity.token
    if any(s.skipped for s in done) or manifest.queries.get(query_id, -1) >= batch_id:
        output.remove_staging(token)
        log.info(
            "dedup batch %s of query %s was already committed; re-run discarded", batch_id, query_id
        )
        return CommitReport(manifest.version, batch_id, query_id, already_committed=True)
    stale = sorted({s.base_version for s in done if s.base_version != manifest.version})
    if stale:
        raise StoreConflictError(
            f"store {store.url} moved to version {manifest.version} while batch {batch_id} was "
            f"classified against version(s) {stale}; another writer is active. Restart the query "
            "to re-run the batch."
        )
    done.sort(key=lambda s: s.identity.partition)
    demoted = settle_cross_partition_keys(output, done)
    nxt = next_manifest(plan, manifest, done, query_id, batch_id, demoted)
    store.commit(nxt)
    finish_publication(store, output, nxt)
    output.remove_staging(token)
    store.collect_garbage(nxt)
    if nxt.version % _ORPHAN_SWEEP_EVERY == 0:
        store.remove_orphans(nxt, keep=set())
        output.remove_stale_staging(keep=token)
    report = _report(plan, nxt, done, query_id, batch_id, demoted)
    log.info(report.line())
    return report


def finish_publication(store: BucketStore, output: Output, manifest: Manifest) -> None:
    """Publish a committed version's ports if a crash interrupted it (idempotent)."""
    if manifest.publish is None or store.is_published(manifest.version):
        return
    output.publish(manifest.publish)
    store.mark_published(manifest.version)


# -- step 3: keys found new by more than one partition -------------------------------------


def settle_cross_partition_keys(output: Output, done: list[TaskSummary]) -> int:
    """Leave each key new in this window with exactly one unique row; returns how many rows are
    duplicates because another partition had the key too.

    Each task staged its new keys: those of its unique rows in row order, then those of the rows
    it yielded to another partition (the last rows of its duplicate file). Laid end to end,
    every task's unique part in partition order and then every yielded part, a unique row whose
    key occurs earlier is demoted to duplicate, and a yielded row whose key does not occur
    earlier has no unique row in the window (both tasks yielded, or the attempt yielded to
    failed) and is promoted back."""
    holders = [s for s in done if s.unique_keys is not None]
    yielded = sum(s.yielded for s in holders)
    if len(holders) < 2 and not yielded:
        return 0
    kept, given = [], []
    for summary in holders:
        unique = summary.counts["unique"]
        keys = output.read_unique_keys(summary.unique_keys or "", unique + summary.yielded)
        kept.append(keys[:unique])
        given.append(keys[unique:])
    first = first_occurrences(Fingerprints.concat(kept + given))
    marks = np.split(first, np.cumsum([len(part) for part in kept + given])[:-1])
    lost = [~mark for mark in marks[: len(kept)]]
    back = marks[len(kept) :]
    demoted = promoted = 0
    for summary, rows in zip(holders, lost, strict=True):
        if rows.any():
            _demote_rows(output, summary, rows)
            demoted += int(rows.sum())
    for summary, rows in zip(holders, back, strict=True):  # after demotions: see _promote_rows
        if rows.any():
            _promote_rows(output, summary, rows)
            promoted += int(rows.sum())
    return yielded - promoted + demoted


def _demote_rows(output: Output, summary: TaskSummary, lost: np.ndarray) -> None:
    """Rewrite this task's unique file without the lost rows, which go to duplicate."""
    (record,) = [r for r in summary.files if r.port == "unique"]
    _move_rows(output, summary, record, lost, "duplicate")
    moved = int(lost.sum())
    summary.counts["unique"] -= moved
    summary.counts["duplicate"] += moved
    if summary.window_file is not None:
        summary.window_file.keys -= moved


def _promote_rows(output: Output, summary: TaskSummary, back: np.ndarray) -> None:
    """Move rows this task yielded (its duplicate file's last rows) back to unique.

    A demotion may have added a second duplicate file; it went to the end of the task's
    files, so the first one is still the file the task wrote."""
    record = next(r for r in summary.files if r.port == "duplicate")
    rows = np.concatenate([np.zeros(record.rows - len(back), dtype=bool), back])
    _move_rows(output, summary, record, rows, "unique")
    moved = int(back.sum())
    summary.counts["unique"] += moved
    summary.counts["duplicate"] -= moved
    if summary.window_file is not None:
        summary.window_file.keys += moved


def _move_rows(
    output: Output, summary: TaskSummary, record: PortFile, rows: np.ndarray, port: str
) -> None:
    """Rewrite a staged file without the marked rows, which go to a new staged file of
    ``port``."""
    table = output.read_table(record.path)
    if table.num_rows != len(rows):
        raise StoreError(
            f"staged {record.port} file {output.path(record.path)} holds {table.num_rows} rows, "
            f"but its task staged {len(rows)} keys for it"
        )
    kept = [r for r in summary.files if r is not record]
    identity = summary.identity
    for target, mask in ((record.port, ~rows), (port, rows)):
        if mask.any():
            relative = output.new_staging_file(
                identity.token, target, identity.partition, identity.attempt
            )
            output.write_table(relative, table.filter(pa.array(mask)))
            kept.append(PortFile(target, relative, int(mask.sum())))
    summary.files = kept


# -- step 4: the next manifest -------------------------------------------------------------


def next_manifest(
    plan: SinkPlan,
    manifest: Manifest,
    done: list[TaskSummary],
    query_id: str,
    batch_id: int,
    demoted: int,
) -> Manifest:
    settings = plan.settings
    window = manifest.version + 1
    nxt = Manifest(
        version=window,
        store_id=manifest.store_id,
        settings=manifest.settings,
        committed_ms=now_ms(),
        latest=manifest.latest,
        categories=list(manifest.categories),
        files=dict(manifest.files),
        buckets={bucket: list(segments) for bucket, segments in manifest.buckets.items()},
        owner={
            "query": query_id,
            "heartbeat_ms": now_ms(),
            "timeout_ms": plan.options.owner_timeout.micros // 1000,
        },
        queries=_recent_queries(manifest.queries, query_id, batch_id),
        # Tombstones due at the previous version were deleted by its garbage collection.
        tombstones=[
            (name, dropped)
            for name, dropped in manifest.tombstones
            if dropped + TOMBSTONE_GRACE_VERSIONS >= window
        ],
        ports={port: PortState(**vars(state)) for port, state in manifest.ports.items()},
        totals=dict(manifest.totals),
    )
    for summary in done:
        for name in summary.new_categories:
            if name not in nxt.categories:
                nxt.categories.append(name)
    ordinals = nxt.category_ordinals()
    new_keys = 0
    for summary in done:
        wf = summary.window_file
        if wf is None:
            continue
        if settings.mode == "systemTime":
            wf.max_stamp = None  # set below, once the window time is known
        elif wf.local_categories:
            top = max(ordinals[name] for name in wf.local_categories)
            wf.max_stamp = top if wf.max_stamp is None else max(wf.max_stamp, top)
        nxt.files[wf.name] = wf
        for bucket, segment in summary.segments.items():
            nxt.buckets.setdefault(bucket, []).append(segment)
        new_keys += summary.new_keys
    for summary in done:
        _apply_compaction(nxt, summary)
    nxt.latest = _latest_point(plan, manifest, done, nxt)
    if settings.mode == "systemTime":
        for summary in done:
            if summary.window_file is not None:
                summary.window_file.max_stamp = nxt.latest
    dropped = _drop_expired_files(plan, nxt)
    counts = {port: sum(s.counts.get(port, 0) for s in done) for port in PORTS}
    nxt.totals["remembered"] = sum(s.count for segments in nxt.buckets.values() for s in segments)
    nxt.totals["windows"] = nxt.totals.get("windows", 0) + 1
    for port in PORTS:
        nxt.totals[port] = nxt.totals.get(port, 0) + counts[port]
    nxt.last_window = {
        "window": window,
        "query": query_id,
        "batch": batch_id,
        "counts": counts,
        "new_keys": new_keys,
        "cross_partition_duplicates": demoted,
        "dropped_keys": dropped,
        "task_seconds": round(sum(s.seconds for s in done), 3),
    }
    nxt.publish = _publication_plan(plan, nxt, done, window)
    return nxt


def _apply_compaction(nxt: Manifest, summary: TaskSummary) -> None:
    """A compacted segment replaces the segments it folded; files left with none are dropped."""
    for bucket, replaced in summary.supersedes.items():
        folded = {tuple(ident) for ident in replaced}
        kept: list[Segment] = []
        gone: list[Segment] = []
        for segment in nxt.buckets.get(bucket, []):
            (gone if segment.ident in folded else kept).append(segment)
        nxt.buckets[bucket] = kept
        for segment in gone:
            wf = nxt.files.get(segment.file)
            if wf is None:
                continue
            remaining = [b for b in wf.buckets if b != bucket]
            nxt.files[segment.file] = replace(wf, buckets=remaining)
            if not remaining:
                del nxt.files[segment.file]
                nxt.tombstones.append((segment.file, nxt.version))


def _recent_queries(queries: dict[str, int], query_id: str, batch_id: int) -> dict[str, int]:
    recent = {q: b for q, b in queries.items() if q != query_id}
    recent[query_id] = batch_id
    return dict(list(recent.items())[-_KEEP_QUERIES:])


def _latest_point(
    plan: SinkPlan, manifest: Manifest, done: list[TaskSummary], nxt: Manifest
) -> float | None:
    mode = plan.settings.mode
    if mode == "basic":
        return None
    if mode == "categorical":
        return len(nxt.categories) - 1 if nxt.categories else None
    if mode == "systemTime":
        now_us = int(time.time() * 1_000_000)
        previous = manifest.latest
        return now_us if previous is None else max(now_us, int(previous) + 1)
    stamps = [s.max_stamp for s in done if s.max_stamp is not None]
    if manifest.latest is not None:
        stamps.append(manifest.latest)
    return max(stamps) if stamps else None


def _drop_expired_files(plan: SinkPlan, nxt: Manifest) -> int:
    """Forget whole window files whose newest key is at or below the expiry point."""
    if nxt.latest is None or plan.settings.period is None:
        return 0
    expiry_point = nxt.latest - plan.settings.period
    expired = [
        wf for wf in nxt.files.values() if wf.max_stamp is not None and wf.max_stamp <= expiry_point
    ]
    dropped = 0
    for wf in expired:
        del nxt.files[wf.name]
        for bucket in wf.buckets:
            remaining = [s for s in nxt.buckets.get(bucket, []) if s.file != wf.name]
            if remaining:
                nxt.buckets[bucket] = remaining
            else:
                nxt.buckets.pop(bucket, None)
        nxt.tombstones.append((wf.name, nxt.version))
        dropped += wf.keys
    return dropped


def _publication_plan(
    plan: SinkPlan, nxt: Manifest, done: list[TaskSummary], window: int
) -> dict[str, Any]:
    output = plan.output
    moves: list[list[str]] = []
    logs: dict[str, list[Any]] = {}
    token = done[0].identity.token
    for port in PORTS:
        state = nxt.ports.setdefault(port, PortState())
        logged_before = state.files
        targets: list[str] = []
        records = [r for s in done for r in s.files if r.port == port and r.rows > 0]
        if not records and state.files == 0:
            # A port is readable with its schema from the first window on, even with no rows.
            staged = f"{output.staging(token)}/pschema-0.{port}.parquet"
            output.write_table(staged, port_schema(port, plan.schema).empty_table())
            records = [PortFile(port, staged, 0)]
        for index, record in enumerate(records):
            partition = record.path.rsplit("/", 1)[-1].split("-")[0]
            target = f"{port}/part-{window:010d}-{partition}-{index:03d}.parquet"
            moves.append([record.path, target])
            targets.append(target)
            state.rows += record.rows
        state.files += len(targets)
        logs[port] = [state.next_log, targets, logged_before]
        state.next_log += 1
    return {"window": window, "token": token, "moves": moves, "logs": logs}


def _report(
    plan: SinkPlan,
    nxt: Manifest,
    done: list[TaskSummary],
    query_id: str,
    batch_id: int,
    demoted: int,
) -> CommitReport:
    hits = sum(s.cache.hits for s in done if s.cache)
    misses = sum(s.cache.misses for s in done if s.cache)
    files = len(nxt.files)
    nbytes = sum(wf.nbytes for wf in nxt.files.values())
    settings = plan.settings
    return CommitReport(
        window=nxt.version,
        batch_id=batch_id,
        query_id=query_id,
        counts=dict(nxt.last_window["counts"]),
        cross_partition_duplicates=demoted,
        store_files=files,
        store_bytes=nbytes,
        remembered=nxt.remembered_keys,
        cache_hit_rate=hits / (hits + misses) if hits + misses else None,
        assume_same_expiry=(
            settings.assume_same_expiry if settings.mode in TIME_BUCKET_MODES else None
        ),
    )


def release(store: BucketStore, query_id: str | None = None) -> Manifest | None:
    """Give up the owner lease (after a clean stop) so another query may take the store at once."""
    manifest = store.read()
    if manifest is None or manifest.owner is None:
        return manifest
    if query_id is not None and manifest.owner.get("query") != query_id:
        raise StoreError(
            f"store {store.url} is owned by query {manifest.owner.get('query')}, not {query_id}"
        )
    released = Manifest.from_bytes(manifest.to_bytes(), store.manifest_path(manifest.version))
    released.version = manifest.version + 1
    released.owner = None
    # An owner that died between its commit point and the end of its publication leaves the
    # plan to whoever runs next: carry it over, or that window's rows would never be published.
    released.publish = None if store.is_published(manifest.version) else manifest.publish
    released.committed_ms = now_ms()
    store.commit(released)
    return released


def repair_port_log(store: BucketStore, output: Output, port: str) -> list[int]:
    """Rewrite the entries of a port's Spark sink log that are damaged or missing.

    Each kept manifest (the last 16 versions) holds its window's publication plan: per port,
    the entry's id, its files and how many files the port logged before. Every published entry
    those plans cover is checked and, if it does not match, rewritten from its plan, oldest
    first (a compaction from the entries before it). Returns the ids rewritten. Stop the query
    first; an unpublished latest window is left to the query's own recovery."""
    plans: dict[int, tuple[list[str], int | None]] = {}
    for version in store.versions():
        manifest = store.read(version)
        if manifest is None or manifest.publish is None or not store.is_published(version):
            continue
        entry = manifest.publish["logs"].get(port)
        if entry is not None:
            log_id, files, *logged = entry
            plans[int(log_id)] = (list(files), int(logged[0]) if logged else None)
    rewritten = []
    for log_id in sorted(plans):
        files, logged_before = plans[log_id]
        if not output.log_entry_matches(port, log_id, files, logged_before):
            output.rewrite_log_entry(port, log_id, files, logged_before)
            rewritten.append(log_id)
    return rewritten
