"""The process runtime: every cache a Python process keeps between windows, in one registry.

Spark reuses its Python worker processes for many tasks and micro-batches, and the driver runs
every commit in one long-lived process, so a module-level cache saves reads from one window to
the next. Each module obtains its named container here once, at import (``RUNTIME.cache(name,
factory)``), and binds it to a module-level name: the container's type stays with its module,
the hot path reads a module global as before, and this layer imports nothing of the package.

Lifetime: a container lives as long as its process. What one holds is safe to keep because it
is immutable, or is checked before it is relied on:

- facts about immutable files, keyed by store URL and store id, version or file name (a
  published version, a written window file, a decoded manifest, a history record's rows);
- checks made once a process (a configuration against its store, a run's sweep of staging);
- handles (bucket managers, catalogs, tables) that are validated against the store or table
  on every use, or whose staleness costs only a failed conditional commit and a read again.

Nothing empties a container while the process runs; each module bounds its own where it can
grow. A forked process inherits every container with its contents (fork copies memory): the
facts stay true in the child, but handles the parent opened (a catalog's database connection)
are shared with it, so a process that forks after using the sink should reset the runtime in
the child. ``RUNTIME.reset()`` empties the containers in place, as a fresh process starts: tests use
it to play a new executor. Not caches, so held elsewhere: the settings ``sink.worker`` makes
once a process, and the store's fetch thread pool (threads, which a fork does not copy).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import nullcontext
from typing import Protocol, TypeVar, cast

__all__ = ["RUNTIME", "Clearable", "ProcessRuntime"]


class Clearable(Protocol):
    """A cache container: emptied in place by ``clear()`` (a dict, a set, an OrderedDict)."""

    def clear(self) -> None: ...


C = TypeVar("C", bound=Clearable)


class _Registered:
    """A container and the lock its module holds while changing it (None: no lock)."""

    def __init__(self, container: Clearable, lock: threading.Lock | None) -> None:
        self.container = container
        self.lock = lock


class ProcessRuntime:
    """The named caches of this process (one instance: ``RUNTIME``)."""

    def __init__(self) -> None:
        self._registered: dict[str, _Registered] = {}
        self._registering = threading.Lock()

    def cache(self, name: str, factory: Callable[[], C], lock: threading.Lock | None = None) -> C:
        """The container named ``name`` ("layer.what"), made by ``factory`` the first time.
        ``lock``: the lock the module changes the container under; ``reset`` clears under it."""
        with self._registering:
            registered = self._registered.get(name)
            if registered is None:
                registered = self._registered[name] = _Registered(factory(), lock)
            return cast(C, registered.container)

    def names(self) -> list[str]:
        """The names of the containers registered so far (modules register at import)."""
        with self._registering:
            return sorted(self._registered)

    def reset(self, *names: str) -> None:
        """Empty the named containers (every one when none is named) in place, each under its
        lock, as a fresh process would hold them. Naming one not registered is an error."""
        with self._registering:
            unknown = sorted(set(names) - set(self._registered))
            if unknown:
                raise KeyError(f"no cache named {unknown}; registered: {sorted(self._registered)}")
            chosen = [self._registered[name] for name in names or self._registered]
        for registered in chosen:
            with registered.lock or nullcontext():
                registered.container.clear()


RUNTIME = ProcessRuntime()
