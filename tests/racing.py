"""Writers racing for one store version, in processes of their own (or threads, for memory://).

``race`` starts ``writers`` processes (spawned: nothing inherited but the arguments), each of
which, for every round, waits at a shared barrier and then commits version ``round`` of the
store at ``url`` with a manifest that names the writer. Each records whether it won or got
``StoreConflictError`` (and that its next listing showed the version); the caller checks that
exactly one won every round and that the store reads back the winner's manifest.
"""

from __future__ import annotations

import multiprocessing
import threading
import traceback
from collections.abc import Callable
from typing import Any

from dedupsink.errors import StoreConflictError
from dedupsink.store.format import Manifest
from dedupsink.store.records import StoreSettings, StoreTotals
from dedupsink.store.store import BucketStore

SETTINGS = StoreSettings("basic", ("id",), ("int64",), None, None, "int", None, None, 1)
LIST_EVERY = 10


def manifest_of(writer: int, version: int) -> Manifest:
    return Manifest(version, "race", SETTINGS, 0, totals=StoreTotals(windows=writer))


def commit_rounds(
    url: str, options: dict[str, Any], writer: int, rounds: int, barrier: Any
) -> list[str]:
    """One writer's part: ``won``, ``lost`` or an error per round. After its commit, each
    writer's next listing must show the round's version (whoever won it): no stale listing
    (checked every ``LIST_EVERY`` rounds: a listing of hundreds of versions is slow on the
    emulators, and a real store keeps a few dozen)."""
    store = BucketStore(url, options)
    outcome = []
    for version in range(1, rounds + 1):
        barrier.wait()
        try:
            store.commit(manifest_of(writer, version))
            result = "won"
        except StoreConflictError:
            result = "lost"
        except Exception:  # reported to the test, which fails on it
            result = "error: " + traceback.format_exc(limit=3)
        if version % LIST_EVERY == 0 and not result.startswith("error"):
            seen = store.latest_version()
            if seen != version:
                result = f"error: listed version {seen} after round {version}"
        outcome.append(result)
    return outcome


def _process_main(
    url: str, options: dict[str, Any], writer: int, rounds: int, barrier: Any, results: Any
) -> None:
    results.put((writer, commit_rounds(url, options, writer, rounds, barrier)))


def race(
    url: str, options: dict[str, Any], writers: int, rounds: int, threads: bool = False
) -> dict[int, list[str]]:
    """Every writer's outcome per round."""
    if threads:
        return _race_threads(url, options, writers, rounds)
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(writers, timeout=120)
    results = context.Queue()
    processes = [
        context.Process(target=_process_main, args=(url, options, w, rounds, barrier, results))
        for w in range(writers)
    ]
    for process in processes:
        process.start()
    outcomes = dict(results.get(timeout=600) for _ in processes)
    for process in processes:
        process.join(60)
    return outcomes


def _race_threads(
    url: str, options: dict[str, Any], writers: int, rounds: int
) -> dict[int, list[str]]:
    barrier = threading.Barrier(writers, timeout=120)
    outcomes: dict[int, list[str]] = {}

    def one(writer: int) -> Callable[[], None]:
        def run() -> None:
            outcomes[writer] = commit_rounds(url, options, writer, rounds, barrier)

        return run

    started = [threading.Thread(target=one(w)) for w in range(writers)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join(600)
    return outcomes
