"""The process runtime: one registry of the caches a process keeps between windows."""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections import OrderedDict
from types import ModuleType

import pytest

import dedupsink
from dedupsink.runtime import RUNTIME, ProcessRuntime

CACHES = {
    "ports.delta_covered",
    "ports.delta_own_commits",
    "ports.delta_tables",
    "ports.iceberg_catalogs",
    "ports.iceberg_committed",
    "ports.iceberg_covered",
    "ports.sparklog_checked_compactions",
    "sink.checked_plans",
    "sink.file_stats",
    "sink.published",
    "sink.swept_runs",
    "store.bucket_managers",
    "store.shared_checked",
    "store.created_history",
    "store.known_manifests",
    "store.waits",
    "store.written_files",
}


def package_modules() -> list[ModuleType]:
    """Every module of the package (not the ``__main__`` ones, which run the CLI)."""
    names = [
        info.name
        for info in pkgutil.walk_packages(dedupsink.__path__, "dedupsink.")
        if not info.name.endswith("__main__")
    ]
    return [importlib.import_module(name) for name in names]


def test_a_name_gives_the_same_container_every_time() -> None:
    runtime = ProcessRuntime()
    first: dict[str, int] = runtime.cache("store.example", dict)
    again: dict[str, int] = runtime.cache("store.example", dict)
    assert first is again
    assert runtime.names() == ["store.example"]


def test_reset_empties_containers_in_place_under_their_locks() -> None:
    runtime = ProcessRuntime()
    lock = threading.Lock()
    files: OrderedDict[str, bytes] = runtime.cache("store.files", OrderedDict, lock)
    seen: set[int] = runtime.cache("sink.seen", set)
    files["a"] = b"x"
    seen.add(1)
    with lock:  # a module holding the lock: the reset waits for it
        resetting = threading.Thread(target=runtime.reset)
        resetting.start()
        resetting.join(0.05)
        assert resetting.is_alive() and files == {"a": b"x"}
    resetting.join()
    assert files == {} and seen == set()
    assert runtime.cache("store.files", OrderedDict) is files


def test_reset_of_named_caches_leaves_the_others() -> None:
    runtime = ProcessRuntime()
    kept: set[int] = runtime.cache("sink.kept", set)
    dropped: set[int] = runtime.cache("sink.dropped", set)
    kept.add(1)
    dropped.add(2)
    runtime.reset("sink.dropped")
    assert kept == {1} and dropped == set()
    with pytest.raises(KeyError, match=r"sink\.unknown"):
        runtime.reset("sink.unknown")


def test_every_module_level_cache_of_the_package_is_the_runtimes() -> None:
    modules = package_modules()
    assert set(RUNTIME.names()) == CACHES
    registered = {id(RUNTIME.cache(name, dict)) for name in RUNTIME.names()}
    unregistered = [
        f"{module.__name__}.{name}"
        for module in modules
        for name, value in vars(module).items()
        if name.startswith("_")
        and not name.startswith("__")
        and name == name.lower()
        and isinstance(value, dict | set | list)
        and id(value) not in registered
    ]
    assert unregistered == []
