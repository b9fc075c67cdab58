"""Who may commit to a store: owners, leases and fences.

A store has at most one *owner*, the query run that committed its latest window (``Owner``).
Every commit applies the rules (``claim``, ``next_owner``) and every task checks them
(``check_not_fenced``); they are docs/RELIABILITY.md, "The ownership rule". Safety does not
come from this module: a version is created only if absent, whatever leases or clocks say.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from dedupsink.errors import StoreError, StoreOwnershipError
from dedupsink.store.format import Manifest
from dedupsink.store.records import Fence, Owner, now_ms
from dedupsink.store.store import BucketStore

KEEP_FENCES = 32
POLL_SECONDS = 0.5
RELEASED_BY = "release"
# A batch write commits as the query "batch-<run>": one window, then the store is released.
BATCH_WRITE_PREFIX = "batch-"


@dataclass(frozen=True)
class Writer:
    """Who wants to commit: a query run (a batch write is a query of one window)."""

    query: str
    run: str
    timeout_ms: int
    kind: str = "streaming query"  # or "batch write"
    keeps_store: bool = True  # a batch write releases the store with its commit

    def describe(self) -> str:
        return f"{self.kind} {self.query}"


def describe_owner(owner: Owner, at_ms: int | None = None) -> str:
    kind = "batch write" if owner.query.startswith(BATCH_WRITE_PREFIX) else "streaming query"
    age = "" if at_ms is None else f", last commit {(at_ms - owner.heartbeat_ms) / 1000:.1f}s ago"
    return f"{kind} {owner.query} (run {owner.run or '-'}{age})"


def fence_of(manifest: Manifest, writer: Writer) -> Fence | None:
    return next(
        (f for f in manifest.fenced if f.run == writer.run and f.query == writer.query), None
    )


def check_not_fenced(manifest: Manifest, writer: Writer, url: str) -> None:
    """Refuse a run that lost the store (rule 4), naming who took it."""
    fence = fence_of(manifest, writer)
    if fence is None:
        return
    how = (
        "an operator released it (dedupsink release)"
        if fence.by == RELEASED_BY
        else f"query {fence.by} took it over after this run's lease lapsed"
    )
    raise StoreOwnershipError(
        f"{writer.describe()} (run {writer.run}) no longer owns store {url}: at version "
        f"{fence.version} {how}. Stop the other query, then restart this one from its "
        "checkpoint (a new run) to continue."
    )


def wait_ms(manifest: Manifest, writer: Writer, at_ms: int) -> int:
    """How long ``writer`` must wait before it may take the store (rules 2 and 3)."""
    owner = manifest.owner
    if owner is None or owner.query == writer.query:
        return 0
    return max(0, min(owner.lapses_at_ms() - at_ms, owner.timeout_ms))


def claim(
    store: BucketStore,
    base: Manifest,
    writer: Writer,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once ``writer`` may commit on top of ``base``; raise if another query is using
    the store (it committed while we waited for its lease) or if ``writer`` was fenced."""
    check_not_fenced(base, writer, store.url)
    started = time.monotonic()
    remaining = wait_ms(base, writer, now_ms()) / 1000
    while remaining > 0:
        sleep(min(POLL_SECONDS, remaining))
        latest = store.latest_version()
        if latest is not None and latest != base.version:
            newer = store.read(latest)
            holder = newer.owner if newer is not None and newer.owner else base.owner
            who = "another writer" if holder is None else describe_owner(holder)
            raise StoreOwnershipError(
                f"store {store.url} is in use by {who}: it committed "
                f"version {latest} while {writer.describe()} waited "
                f"{time.monotonic() - started:.1f}s for its lease to lapse. Two queries cannot "
                "write one store at once: stop one of them."
            )
        remaining = wait_ms(base, writer, now_ms()) / 1000


def next_owner(
    base: Manifest, writer: Writer, version: int, at_ms: int
) -> tuple[Owner | None, list[Fence]]:
    """The owner and fences of the version ``writer`` commits: it holds the store (a batch
    write releases it), and a run it took the store from is fenced."""
    fenced = list(base.fenced)
    previous = base.owner
    if previous is not None and previous.run != writer.run:
        fenced.append(Fence(previous.query, previous.run, writer.query, version))
    fenced = fenced[-KEEP_FENCES:]
    if not writer.keeps_store:
        return None, fenced
    if previous is not None and previous.run == writer.run:
        return replace(previous, heartbeat_ms=at_ms, timeout_ms=writer.timeout_ms), fenced
    return Owner(writer.query, writer.run, at_ms, writer.timeout_ms, version), fenced


def released(base: Manifest, version: int) -> list[Fence]:
    """The fences of a version that releases the store: its owner's run may not come back."""
    if base.owner is None:
        return list(base.fenced)
    fence = Fence(base.owner.query, base.owner.run, RELEASED_BY, version)
    return [*base.fenced, fence][-KEEP_FENCES:]


def release(store: BucketStore, query_id: str | None = None) -> Manifest | None:
    """Give the store up (after a clean stop) so another query may take it at once.

    The owner's run is fenced: if it was in fact still running, it cannot commit again. A
    publication a crash left unfinished is carried over, for the next commit to finish."""
    manifest = store.read()
    if manifest is None or manifest.owner is None:
        return manifest
    if query_id is not None and manifest.owner.query != query_id:
        raise StoreError(
            f"store {store.url} is owned by query {manifest.owner.query}, not {query_id}"
        )
    version = manifest.version + 1
    freed = replace(
        manifest,
        version=version,
        owner=None,
        fenced=released(manifest, version),
        committed_ms=now_ms(),
    )
    store.commit(freed)
    return freed
