"""Bounded storage calls: per-attempt timeouts, retries of transient faults, one budget.

A store on S3, Azure, GCS or HDFS is reached over a network that stalls, throttles and drops
connections. Every call ``Storage`` makes goes through ``Attempts.run``: each attempt is bounded
(the client's connect and read timeouts, and for fsspec's asynchronous filesystems a hard
deadline on the whole attempt), a transient failure (throttling, a 5xx, a reset or truncated
reply, a timeout) is retried after an exponential pause with full jitter, and when the
operation's budget of wall time is spent it fails with ``StoreUnavailableError``: one line
naming the store, the operation and the time waited.

Only operations that are safe to repeat are retried, and all of ``Storage``'s are: reads,
listings, whole-file writes, copies and deletes repeat to the same result, and a conditional
create whose reply was lost finds its own object on the retry (``FileExistsError``), which its
callers already tell from another writer's by its bytes.

The process counts what it retried and how long it waited (``WAITS``); a task and a commit
report the difference over their run, so each window records its brownout.
"""

from __future__ import annotations

import asyncio
import errno
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from dedupsink.errors import StoreUnavailableError
from dedupsink.options import StorageBounds
from dedupsink.runtime import RUNTIME

__all__ = ["WAITS", "Attempts", "StorageBounds", "StoreWaits", "is_transient"]

T = TypeVar("T")

# Pauses before retries: 0.2 s doubling up to 10 s, each drawn uniformly below its ceiling
# ("full jitter"), so tasks throttled together do not retry together.
_PAUSE_FIRST = 0.2
_PAUSE_MOST = 10.0

# HTTP statuses and service error codes that mean "try again": throttling and server faults.
_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_RETRY_CODES = frozenset(
    {
        "SlowDown",
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "RequestTimeoutException",
        "Throttling",
        "ThrottlingException",
        "TooManyRequests",
        "ServerBusy",
        "OperationTimedOut",
        "InternalServerError",
    }
)
# Exceptions that are transient by their type's name, wherever they come from (botocore,
# aiohttp, azure-core, gcsfs, the standard library), so no client package is imported here.
_RETRY_TYPES = frozenset(
    {
        "FSTimeoutError",
        "TimeoutError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "ConnectionClosedError",
        "EndpointConnectionError",
        "IncompleteReadError",
        "IncompleteRead",
        "ResponseParserError",
        "ClientPayloadError",
        "ServerDisconnectedError",
        "ClientConnectionError",
        "ClientConnectorError",
        "ClientOSError",
        "ServerTimeoutError",
        "ServiceRequestError",
        "ServiceResponseError",
        "ServiceRequestTimeoutError",
        "ServiceResponseTimeoutError",
        "ContentLengthError",
        "TransferEncodingError",
    }
)
_RETRY_ERRNOS = frozenset(
    {errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE, errno.ETIMEDOUT, errno.ECONNREFUSED}
)


@dataclass(frozen=True)
class StoreWaits:
    """Requests retried and seconds lost to them (failed attempts and pauses)."""

    retries: int = 0
    seconds: float = 0.0

    def __sub__(self, other: StoreWaits) -> StoreWaits:
        return StoreWaits(self.retries - other.retries, max(self.seconds - other.seconds, 0.0))

    def __add__(self, other: StoreWaits) -> StoreWaits:
        return StoreWaits(self.retries + other.retries, self.seconds + other.seconds)

    def text(self) -> str:
        return f"{self.retries} store retries ({self.seconds:.1f} s)"


class _Counter:
    """The process's ``StoreWaits`` so far, thread-safe (tasks fetch in pools of threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._retries = 0
        self._seconds = 0.0

    def add(self, seconds: float) -> None:
        with self._lock:
            self._retries += 1
            self._seconds += seconds

    def now(self) -> StoreWaits:
        with self._lock:
            return StoreWaits(self._retries, self._seconds)

    def clear(self) -> None:
        """Back to none, as a fresh process (the runtime's reset)."""
        with self._lock:
            self._retries, self._seconds = 0, 0.0


WAITS: _Counter = RUNTIME.cache("store.waits", _Counter)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is a fault worth retrying."""
    seen: BaseException | None = exc
    for _ in range(16):
        if seen is None:
            return False
        if isinstance(seen, FileNotFoundError | FileExistsError | PermissionError):
            return False  # answers, not faults: never hidden behind a retry
        if isinstance(seen, StoreUnavailableError):
            return False  # an inner operation spent its budget: not spent again
        if _transient_itself(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _transient_itself(exc: BaseException) -> bool:
    if isinstance(exc, TimeoutError | ConnectionError):  # asyncio's and socket's too
        return True
    if any(kind.__name__ in _RETRY_TYPES for kind in type(exc).__mro__):
        return True
    if isinstance(exc, OSError) and exc.errno in _RETRY_ERRNOS:
        return True
    return _status_of(exc) in _RETRY_STATUSES or _code_of(exc) in _RETRY_CODES


def _status_of(exc: BaseException) -> int | None:
    """The HTTP status a client's error carries (botocore, azure-core, gcsfs, aiohttp)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return int(status) if isinstance(status, int) else None
    for name in ("status_code", "status", "code"):
        value = getattr(exc, name, None)
        if isinstance(value, int) and 100 <= value < 600:
            return value
    return None


def _code_of(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code") or "") or None
    code = getattr(exc, "error_code", None)
    return str(code) if code else None


class Attempts:
    """Runs one storage operation within ``bounds``; ``where`` names the store in errors."""

    def __init__(self, bounds: StorageBounds, where: str) -> None:
        self.bounds = bounds
        self.where = where

    def run(
        self,
        operation: str,
        call: Callable[..., T],
        *args: Any,
        budget: float | None = None,
        **kwargs: Any,
    ) -> T:
        """``call(*args, **kwargs)``, retried on transient faults until ``budget`` seconds
        (the bounds' budget by default) have passed."""
        budget = self.bounds.budget if budget is None else budget
        hard_deadline = _takes_deadline(call)
        start = time.monotonic()
        deadline = start + budget
        ceiling = _PAUSE_FIRST
        answered = ""  # the last reply the service gave (``503 SlowDown (...)``), if any
        while True:
            began = time.monotonic()
            try:
                if hard_deadline:
                    left = max(deadline - began, 0.05)
                    # What is left of the budget, not a shorter bound: a large file's transfer
                    # may take longer than one silent read, which the client's timeout cuts.
                    return call(*args, timeout=left, **kwargs)
                return call(*args, **kwargs)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                said = _first(exc)
                if _answered(exc):
                    answered = said
                pause = random.uniform(0, ceiling)
                ceiling = min(2 * ceiling, _PAUSE_MOST)
                now = time.monotonic()
                if now + pause >= deadline:
                    # A last attempt cut by the spent budget says less than the reply before it:
                    # name both, so throttling reads as throttling.
                    before = f"; last reply: {answered}" if answered and answered != said else ""
                    raise StoreUnavailableError(
                        f"store {self.where} did not answer {operation}: gave up after "
                        f"{now - start:.1f} s (storageTimeout {budget:g} s); last: {said}{before}"
                    ) from exc
                WAITS.add(now - began + pause)
                time.sleep(pause)


def _takes_deadline(call: Callable[..., Any]) -> bool:
    """Whether ``call`` is the synchronous face fsspec gives an asynchronous filesystem's
    method: it takes ``timeout=`` and cancels the attempt at that deadline, whatever the
    client's own timeouts do."""
    return asyncio.iscoroutinefunction(getattr(call, "__wrapped__", None))


def _answered(exc: BaseException) -> bool:
    """Whether the chain of ``exc`` carries a reply of the service (a status or a code)."""
    seen: BaseException | None = exc
    for _ in range(16):
        if seen is None:
            return False
        if _status_of(seen) or _code_of(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _first(exc: BaseException) -> str:
    """An exception on one line: the service's status and code where the chain has them
    (``503 SlowDown``), then its type and message."""
    text = " ".join(str(exc).split())
    described = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    seen: BaseException | None = exc
    for _ in range(16):
        if seen is None:
            break
        status, code = _status_of(seen), _code_of(seen)
        if status or code:
            said = " ".join(str(part) for part in (status, code) if part)
            return f"{said} ({described})"
        seen = seen.__cause__ or seen.__context__
    return described
