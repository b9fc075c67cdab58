"""Bounded storage calls (``store/retry.py``): which faults are retried, the budget, the counters.

The classification is checked on the clients' own exception types, built as the clients build
them (botocore's ``ClientError`` with S3's reply, azure-core's ``HttpResponseError``, aiohttp's
and the standard library's connection errors); the budget on a call that keeps failing, and on
one that never returns (fsspec's deadline on an asynchronous filesystem's call).
"""

from __future__ import annotations

import asyncio
import errno
import time
from typing import Any

import pytest

from dedupsink.errors import StoreUnavailableError
from dedupsink.options import DedupOptions, StorageBounds
from dedupsink.store.retry import WAITS, Attempts, is_transient


def s3_error(status: int, code: str) -> Exception:
    from botocore.exceptions import ClientError

    reply = {
        "Error": {"Code": code, "Message": code},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return ClientError(reply, "PutObject")  # type: ignore[arg-type]


def wrapped(cause: Exception) -> OSError:
    """As s3fs hands a client's error on: an OSError whose cause is the client's."""
    error = OSError(errno.EIO, str(cause))
    error.__cause__ = cause
    return error


def azure_error(status: int, code: str) -> Exception:
    from azure.core.exceptions import HttpResponseError

    error = HttpResponseError(message=code)
    error.status_code = status
    error.error_code = code
    return error


@pytest.mark.parametrize(
    "make",
    [
        lambda: wrapped(s3_error(503, "SlowDown")),
        lambda: wrapped(s3_error(500, "InternalError")),
        lambda: azure_error(503, "ServerBusy"),
        lambda: ConnectionResetError(errno.ECONNRESET, "reset"),
        lambda: TimeoutError(),
        lambda: wrapped(
            __import__("botocore.exceptions").exceptions.ReadTimeoutError(endpoint_url="x")
        ),
        lambda: __import__("aiohttp").ClientPayloadError("truncated body"),
        lambda: __import__("aiohttp").ServerDisconnectedError(),
    ],
    ids=[
        "s3-503-slowdown",
        "s3-500",
        "azure-503-serverbusy",
        "reset",
        "timeout",
        "read-timeout",
        "truncated",
        "disconnected",
    ],
)
def test_transient_faults_are_retried(make: Any) -> None:
    assert is_transient(make())


@pytest.mark.parametrize(
    "make",
    [
        lambda: FileNotFoundError("gone"),
        lambda: FileExistsError("there"),
        lambda: PermissionError("denied"),
        lambda: wrapped(s3_error(403, "AccessDenied")),
        lambda: wrapped(s3_error(400, "InvalidArgument")),
        lambda: StoreUnavailableError("an inner budget spent"),
        lambda: ValueError("a bug"),
    ],
    ids=["missing", "exists", "denied", "403", "400", "spent", "bug"],
)
def test_answers_and_bugs_are_not_retried(make: Any) -> None:
    assert not is_transient(make())


def test_a_fault_that_passes_is_retried_and_counted() -> None:
    faults = [wrapped(s3_error(503, "SlowDown"))] * 3
    calls: list[float] = []

    def flaky() -> str:
        calls.append(time.monotonic())
        if faults:
            raise faults.pop()
        return "done"

    before = WAITS.now()
    assert Attempts(StorageBounds(budget=30), "s3://b/x").run("GET b/x", flaky) == "done"
    spent = WAITS.now() - before
    assert len(calls) == 4 and spent.retries == 3
    assert 0 < spent.seconds < 0.2 + 0.4 + 0.8 + 0.5  # full jitter below 0.2, 0.4, 0.8 s


def test_a_fault_that_stays_spends_the_budget_then_says_what_in_one_line() -> None:
    def throttled() -> None:
        raise wrapped(s3_error(503, "SlowDown"))

    started = time.monotonic()
    with pytest.raises(StoreUnavailableError) as caught:
        Attempts(StorageBounds(budget=2), "s3://lake/dedup/_store").run("PUT lake/k", throttled)
    waited = time.monotonic() - started
    message = str(caught.value)
    assert waited <= 2.1, waited
    assert "\n" not in message
    assert message.startswith("store s3://lake/dedup/_store did not answer PUT lake/k: gave up")
    assert "(storageTimeout 2 s)" in message and "SlowDown" in message


def test_throttling_whose_last_attempt_times_out_still_names_the_reply() -> None:
    """Throttled replies, then an attempt cut by the spent budget (a slow host): the line names
    the timeout and the service's last reply, so throttling still reads as throttling."""
    calls = 0

    def throttled_then_silent() -> None:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise wrapped(s3_error(503, "SlowDown"))
        time.sleep(1.2)  # past the budget: two pauses take at most 0.2 + 0.4 s
        raise TimeoutError("read timed out")

    with pytest.raises(StoreUnavailableError) as caught:
        Attempts(StorageBounds(budget=1), "s3://b").run("GET b/x", throttled_then_silent)
    message = str(caught.value)
    assert "; last: TimeoutError: read timed out; last reply: 503 SlowDown (" in message, message


def test_a_non_transient_failure_is_raised_at_once() -> None:
    calls = []

    def denied() -> None:
        calls.append(1)
        raise wrapped(s3_error(403, "AccessDenied"))

    with pytest.raises(OSError, match="AccessDenied"):
        Attempts(StorageBounds(), "s3://b").run("GET b/x", denied)
    assert calls == [1]


def test_a_call_that_never_returns_is_cut_at_the_deadline() -> None:
    """fsspec's synchronous face of an asynchronous filesystem's method takes ``timeout=``:
    a request held forever is cancelled there, and retried until the budget is spent."""
    import fsspec.asyn

    loop = fsspec.asyn.get_loop()

    async def _held(path: str) -> bytes:
        await asyncio.sleep(3600)
        return b""

    held = fsspec.asyn.sync_wrapper(_held, obj=type("Fs", (), {"loop": loop})())
    bounds = StorageBounds(connect_timeout=0.2, read_timeout=0.2, budget=1.5)
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError, match="did not answer GET b/x"):
        Attempts(bounds, "s3://b").run("GET b/x", held, "b/x")
    assert time.monotonic() - started < 3.0


def test_the_options_set_the_bounds() -> None:
    options = DedupOptions.parse(
        {
            "path": "/tmp/x",
            "storageConnectTimeout": "2 s",
            "storageReadTimeout": "7 seconds",
            "storageTimeout": "90 s",
        }
    )
    assert options.storage_bounds == StorageBounds(2.0, 7.0, 90.0)
    assert DedupOptions.parse({"path": "/tmp/x"}).storage_bounds == StorageBounds(5.0, 20.0, 120.0)


def test_a_bad_timeout_names_the_option() -> None:
    with pytest.raises(ValueError, match="storageTimeout='soon' is invalid"):
        DedupOptions.parse({"path": "/tmp/x", "storageTimeout": "soon"})
