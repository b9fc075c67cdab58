"""A local filesystem that fails on command: fault injection for crash and disk-full tests.

``FaultFileSystem`` is a real fsspec filesystem (a ``LocalFileSystem`` on the local disk)
registered under the protocol ``faultfs``, so any code that takes an fsspec URL can be pointed
at ``faultfs:///some/dir`` unchanged. It numbers every *mutating* call (``pipe_file``, ``open``
for writing, ``mv``, ``rm_file``, ``rm``, ``makedirs``, ``mkdir``, ``touch``, ``cp_file``) from 1
and, once armed, raises ``OSError`` (``ENOSPC`` by default, or ``EIO``) at the k-th one, before
it touches the disk. A call made inside another mutating call (``pipe_file`` opening its file)
is not counted again: one step is one call the code under test made.

Typical use, failing every step of an operation in turn::

    steps = count_steps(lambda: do_commit(root_copy()))
    for k in range(1, steps + 1):
        with FAULTS.failing_at(k):
            with pytest.raises(OSError):
                do_commit(root)
        ...  # check the previous state is intact, then retry

The fault plan is process-wide (fsspec caches filesystem instances, so it lives on the class
rather than on one instance); ``FAULTS.reset()`` clears it.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

PROTOCOL = "faultfs"
_WRITE_MODES = ("w", "a", "x", "+")


@dataclass
class FaultPlan:
    """The step counter, the step to fail at and what happened so far."""

    calls: int = 0
    fail_at: int | None = None
    error: int = errno.ENOSPC
    persistent: bool = False  # fail every step from fail_at on (a dead disk), not just one
    torn: bool = False  # a failing pipe_file leaves the first half of its bytes behind
    log: list[tuple[int, str, str]] = field(default_factory=list)  # (step, operation, path)
    failed: list[tuple[int, str, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        with self._lock:
            self.calls = 0
            self.fail_at = None
            self.error = errno.ENOSPC
            self.persistent = False
            self.torn = False
            self.log.clear()
            self.failed.clear()

    def arm(
        self, k: int, error: int = errno.ENOSPC, persistent: bool = False, torn: bool = False
    ) -> None:
        """Fail the k-th mutating call from now (1 = the next one)."""
        with self._lock:
            self.calls = 0
            self.fail_at = k
            self.error = error
            self.persistent = persistent
            self.torn = torn
            self.log.clear()
            self.failed.clear()

    def disarm(self) -> None:
        with self._lock:
            self.fail_at = None

    @contextmanager
    def failing_at(
        self, k: int, error: int = errno.ENOSPC, persistent: bool = False, torn: bool = False
    ) -> Iterator[FaultPlan]:
        self.arm(k, error, persistent, torn)
        try:
            yield self
        finally:
            self.disarm()

    @contextmanager
    def counting(self) -> Iterator[FaultPlan]:
        """Count mutating calls without failing any (to learn how many steps there are)."""
        self.reset()
        yield self

    def step(self, operation: str, path: str) -> bool:
        """Record one mutating call; True if it must fail."""
        with self._lock:
            self.calls += 1
            self.log.append((self.calls, operation, path))
            due = self.fail_at is not None and (
                self.calls == self.fail_at or (self.persistent and self.calls > self.fail_at)
            )
            if due:
                self.failed.append((self.calls, operation, path))
            return due

    def error_of(self, operation: str, path: str) -> OSError:
        return OSError(self.error, f"injected fault in {operation} (step {self.calls})", path)


FAULTS = FaultPlan()


class Tear(Exception):
    """Raised by ``before`` to a ``pipe_file``: half its bytes reach the disk, then ``error``."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class InjectingFileSystem(LocalFileSystem):
    """The local disk, with every *outermost* mutating call shown to ``before`` first.

    The nine fsspec calls that change the disk (``pipe_file``, ``open`` for writing, ``mv``,
    ``cp_file``, ``link``, ``rm_file``, ``rm``, ``makedirs``, ``mkdir``, ``touch``) each call
    ``before(operation, path, changes)`` before they touch the disk; a call made inside another
    (``pipe_file`` opening its file) is not shown again, so one step is one call the code under
    test made. ``before`` raises ``OSError`` to fail the call, or ``Tear`` to tear a
    ``pipe_file``. Subclasses decide: a process-wide plan (``FaultFileSystem``) or a plan shared
    across processes (``tests/faults.py``).
    """

    _depth = threading.local()

    def before(self, operation: str, path: str, changes: bool) -> None:
        """Called once per outermost mutating call; ``changes``: whether it changes the disk."""

    @contextmanager
    def _mutating(self, operation: str, path: str, changes: bool = True) -> Iterator[None]:
        depth = getattr(self._depth, "value", 0)
        if depth == 0:
            self.before(operation, path, changes)
        self._depth.value = depth + 1
        try:
            yield
        finally:
            self._depth.value = depth

    def _described(self, *paths: Any) -> str:
        return " -> ".join(str(self._strip_protocol(p)) for p in paths)

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        stripped = self._strip_protocol(path)
        try:
            with self._mutating("pipe_file", stripped):
                super().pipe_file(path, value, mode, **kwargs)
        except Tear as tear:  # as a full disk does: the first half of the bytes, then the error
            with open(stripped, "wb") as out:
                out.write(value[: len(value) // 2])
            raise tear.error from None

    def _open(self, path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
        if not any(flag in mode for flag in _WRITE_MODES):
            return super()._open(path, mode, *args, **kwargs)
        with self._mutating(f"open({mode})", self._described(path)):
            return super()._open(path, mode, *args, **kwargs)

    def mv(self, path1: Any, path2: Any, *args: Any, **kwargs: Any) -> None:
        with self._mutating("mv", self._described(path1, path2)):
            super().mv(path1, path2, *args, **kwargs)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        with self._mutating("cp_file", self._described(path1, path2)):
            super().cp_file(path1, path2, **kwargs)

    def link(self, src: str, dst: str, **kwargs: Any) -> None:
        with self._mutating("link", self._described(src, dst)):
            super().link(src, dst, **kwargs)

    def rm_file(self, path: str) -> None:
        stripped = self._described(path)
        with self._mutating("rm_file", stripped, os.path.exists(stripped)):
            super().rm_file(path)

    def rm(self, path: Any, *args: Any, **kwargs: Any) -> None:
        with self._mutating("rm", self._described(path)):
            super().rm(path, *args, **kwargs)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        stripped = self._described(path)
        with self._mutating("makedirs", stripped, not os.path.isdir(stripped)):
            super().makedirs(path, exist_ok=exist_ok)

    def mkdir(self, path: str, *args: Any, **kwargs: Any) -> None:
        with self._mutating("mkdir", self._described(path)):
            super().mkdir(path, *args, **kwargs)

    def touch(self, path: str, *args: Any, **kwargs: Any) -> None:
        with self._mutating("touch", self._described(path)):
            super().touch(path, *args, **kwargs)


class FaultFileSystem(InjectingFileSystem):
    """The local disk, with the mutating calls counted and failed as ``FAULTS`` says."""

    protocol = (PROTOCOL,)

    def before(self, operation: str, path: str, changes: bool) -> None:
        if not FAULTS.step(operation, path):
            return
        error = FAULTS.error_of(operation, path)
        raise Tear(error) if operation == "pipe_file" and FAULTS.torn else error


def count_steps(action: Callable[[], object]) -> int:
    """How many mutating calls ``action`` makes when nothing fails."""
    with FAULTS.counting():
        action()
        return FAULTS.calls


def fault_url(path: object) -> str:
    """The ``faultfs://`` URL of a local path."""
    return f"{PROTOCOL}://{path}"


fsspec.register_implementation(PROTOCOL, FaultFileSystem, clobber=True)
