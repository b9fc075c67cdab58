"""A store that stalls, throttles, drops connections or stops answering: faults on the wire.

Between the sink and moto's S3 server sits ``FaultProxy`` (``tests/faultproxy.py``), which adds
latency, holds replies forever, cuts them with a reset or ends them early, answers ``503
SlowDown``, or goes silent, at rates switched during a run. The sink's tasks, its commit and
the ``dedupsink`` commands reach the store only through it; the checks read the store and the
ports directly from the server. Each test asserts what a team whose store lives on S3 expects:

* windows through a few percent of every fault end exactly as the reference model says, their
  retries recorded per window;
* a store silent for longer than the budget in the middle of a commit fails the batch within
  the bound, in one line; the restarted query ends equal to the model;
* a store silent at a query's start fails it before any output, within seconds;
* every ``dedupsink`` command against a silent endpoint prints one line within 10 s (slow;
  ``inspect`` alone in the regular suite);
* the SIGKILL loop on S3 with faults on (slow: ``make test-slow``).
"""

from __future__ import annotations

import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from faultproxy import FaultProxy, proxied
from faults import (
    ORDERED_OPTIONS,
    PORTS,
    ROW_SCHEMA,
    Control,
    DriverProcess,
    assert_exactly_once,
    ordered_batch,
    write_inputs,
)
from pyspark.errors import StreamingQueryException
from servers import Azurite, Remote, S3Server
from streams import PORT_NAMES, files_under, port_rows, read_port, reference_outputs, start_stream

from dedupsink.errors import DedupOptionError, StoreUnavailableError
from dedupsink.sink.local import LocalSink
from dedupsink.sink.plan import plan_for
from dedupsink.store.history import load_history

REPO = Path(__file__).resolve().parent.parent
DEDUPSINK = str(Path(sys.executable).parent / "dedupsink")
# Tight bounds, so that a held reply costs a second, not twenty.
BOUNDS = {
    "storageConnectTimeout": "1 second",
    "storageReadTimeout": "1 second",
    "storageTimeout": "30 seconds",
}
# A few percent of each fault, as a brownout looks.
BROWNOUT = {"latency": 0.002, "hold": 0.005, "reset": 0.02, "truncate": 0.02, "slowdown": 0.05}


@pytest.fixture(scope="module")
def proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(s3_server.endpoint_url, seed=55) as started:
        yield started


@pytest.fixture
def place(s3_server: S3Server, proxy: FaultProxy) -> Iterator[tuple[Remote, Remote]]:
    """A fresh location, as the sink reaches it (through the proxy) and as the checks do."""
    proxy.clear()
    proxy.reset_counts()
    direct = s3_server.remote("wire")
    yield proxied(direct, proxy), direct
    proxy.clear()


def rids_by_port(direct: Remote) -> dict[str, list[int]]:
    """Each port's row ids; a port with no data file yet (a kill before its first commit: S3
    has no folders) has none."""
    return {
        port: sorted(read_port(direct, port).column("rid").to_pylist())
        if any(not name.startswith("_") for name in files_under(direct, port))
        else []
        for port in PORTS
    }


def assert_as_the_reference(direct: Remote, inputs: list[pa.Table]) -> None:
    """Every input row in exactly one port once; the ports equal the reference model."""
    assert_exactly_once(rids_by_port(direct), inputs)
    windows = [table.drop_columns(["rid"]) for table in inputs]
    expected = reference_outputs(windows, "ordered", ["id"], "n", 10)
    assert {port: port_rows(direct, port, ["id", "n"]) for port in PORT_NAMES} == dict(expected)


def sink_options(remote: Remote, **more: str) -> dict[str, str]:
    return {"path": remote.url, **remote.sink_options, **ORDERED_OPTIONS, **BOUNDS, **more}


def store_retries(direct: Remote) -> list[int]:
    table = load_history(direct.url, direct.storage_options)
    return [int(v or 0) for v in table.column("store_retries").to_pylist()]


# -- a brownout: windows through a few percent of every fault -----------------------------------


# Windows enough for every kind of fault to strike several times (about 35 requests a
# window, the rarest fault one request in 200): a hundred took two minutes, each.
BROWNOUT_WINDOWS = 60
BROWNOUT_STREAM_WINDOWS = 50


@pytest.mark.slow  # a minute: CI runs it with `make test-slow`
def test_windows_through_every_fault_equal_the_reference(
    place: tuple[Remote, Remote], proxy: FaultProxy
) -> None:
    through, direct = place
    inputs = [ordered_batch(b) for b in range(BROWNOUT_WINDOWS)]
    sink = LocalSink(sink_options(through), ROW_SCHEMA)
    proxy.set(**BROWNOUT)
    reports = [
        sink.window(batch_id, window, partitions=2) for batch_id, window in enumerate(inputs)
    ]
    proxy.clear()
    struck = proxy.counts()
    assert all(struck[kind] > 0 for kind in ("hold", "reset", "truncate", "slowdown")), struck
    assert_as_the_reference(direct, inputs)
    # Each window records its tasks' retries and its commit's up to the commit point; its log
    # line counts the whole commit. A spoiled request is retried at most once more (a reply
    # cut after its status line may already have been read whole).
    recorded = store_retries(direct)
    logged = [report.store_waits.retries for report in reports if report is not None]
    spoiled = sum(struck[kind] for kind in ("hold", "reset", "truncate", "slowdown"))
    assert len(recorded) == BROWNOUT_WINDOWS and 0 < sum(recorded) <= sum(logged) <= spoiled, (
        sum(recorded),
        sum(logged),
        struck,
    )


@pytest.mark.slow  # a minute: CI runs it with `make test-slow`
@pytest.mark.spark
def test_a_spark_stream_through_every_fault_equals_the_reference(
    spark: Any, workdir: Path, place: tuple[Remote, Remote], proxy: FaultProxy
) -> None:
    """The same brownout under a real stream: Spark's Python workers (the tasks) and its commit
    runner reach the store through the proxy; every fault is retried where it happens."""
    through, direct = place
    inputs = [ordered_batch(b) for b in range(BROWNOUT_STREAM_WINDOWS)]
    write_inputs(workdir / "in", inputs)
    proxy.set(**BROWNOUT)
    start_stream(spark, workdir / "in", sink_options(through), workdir / "chk").awaitTermination()
    proxy.clear()
    struck = proxy.counts()
    assert all(struck[kind] > 0 for kind in ("hold", "reset", "truncate", "slowdown")), struck
    assert_as_the_reference(direct, inputs)
    assert sum(store_retries(direct)) > 0


# -- a store silent longer than the budget in the middle of a commit -----------------------------


def manifest_create(version: int) -> Any:
    name = f"_store/_log/{version:012d}.manifest"
    return lambda method, target: method == "PUT" and name in target


@pytest.mark.spark
def test_a_store_silent_mid_commit_fails_the_batch_in_one_line_and_the_restart_is_exact(
    spark: Any, workdir: Path, place: tuple[Remote, Remote], proxy: FaultProxy
) -> None:
    through, direct = place
    inputs = [ordered_batch(b) for b in range(6)]
    write_inputs(workdir / "in", inputs)
    options = sink_options(through, storageTimeout="4 seconds")
    # Version 1 creates the store: window 3 (batch 2) commits version 4.
    proxy.set(silent=True, match=manifest_create(4))
    started = time.monotonic()
    with pytest.raises(StreamingQueryException) as caught:
        start_stream(spark, workdir / "in", options, workdir / "chk").awaitTermination()
    failed_after = time.monotonic() - started
    message = str(caught.value)
    line = next(line for line in message.splitlines() if "StoreUnavailableError" in line)
    assert re.search(
        r"StoreUnavailableError: store s3://\S+/_store did not answer PUT \S+/_store/_log/"
        r"000000000004\.manifest \(create\): gave up after [0-9.]+ s \(storageTimeout 4 s\); "
        r"last: ",
        line,
    ), line
    waited = float(re.search(r"gave up after ([0-9.]+) s", line).group(1))  # type: ignore[union-attr]
    # The last attempt is cut at the budget's end; its cancellation and the clock's reading
    # may add a moment on a loaded host.
    assert waited <= 4.0 + 1.0 and failed_after < 60, (waited, failed_after)
    assert through.storage_options["secret"] not in message
    assert proxy.counts()["silent"] > 0
    proxy.clear()  # the store answers again: the query restarts from its checkpoint
    start_stream(spark, workdir / "in", options, workdir / "chk").awaitTermination()
    assert_as_the_reference(direct, inputs)


@pytest.mark.spark
def test_a_store_silent_at_start_fails_the_query_before_any_output_within_seconds(
    spark: Any, workdir: Path, place: tuple[Remote, Remote], proxy: FaultProxy
) -> None:
    through, direct = place
    write_inputs(workdir / "in", [ordered_batch(0)])
    proxy.set(silent=True)
    started = time.monotonic()
    with pytest.raises(StreamingQueryException) as caught:
        start_stream(
            spark, workdir / "in", sink_options(through), workdir / "chk"
        ).awaitTermination()
    failed_after = time.monotonic() - started
    message = str(caught.value)
    assert "accepted the connection but sent no reply within 1 s (storageConnectTimeout)" in message
    assert failed_after < 20, failed_after
    assert files_under(direct) == {}


# -- the commands -----------------------------------------------------------------------------


def commands(path: str, config: Path) -> dict[str, list[str]]:
    return {
        "validate": ["validate", str(config)],
        "run": ["run", str(config)],
        "inspect": ["inspect", path],
        "history": ["history", path],
        "lookup": ["lookup", path, "id=1"],
        "report": ["report", path, "-o", str(config.parent / "report.html")],
        "release": ["release", path],
        "repair": ["repair", path],
        "compact": ["compact", path],
    }


@pytest.mark.slow  # nine commands of 6 s each: CI runs it with `make test-slow`
def test_every_command_against_a_silent_endpoint_says_so_in_one_line_within_10_s(
    tmp_path: Path, place: tuple[Remote, Remote], proxy: FaultProxy
) -> None:
    through, _ = place
    write_inputs(tmp_path / "in", [ordered_batch(0)])
    fs = [f"{name}={value}" for name, value in through.storage_options.items()]
    config = tmp_path / "job.conf"
    lines = [
        "source.format = parquet",
        f"source.path = {tmp_path / 'in'}",
        "source.schema = rid BIGINT, id BIGINT, n BIGINT",
        f"path = {through.url}",
        "keys = id",
        *(f"fs.{item.replace('=', ' = ', 1)}" for item in fs),
    ]
    config.write_text("\n".join(lines) + "\n")
    proxy.set(silent=True)
    fs_flags = [flag for item in fs for flag in ("--fs", item)]

    def timed(name: str, arguments: list[str]) -> tuple[str, float, Any]:
        flags = [] if name in ("validate", "run") else fs_flags
        started = time.monotonic()
        done = subprocess.run(
            [DEDUPSINK, *arguments, *flags], capture_output=True, text=True, timeout=60
        )
        return name, time.monotonic() - started, done

    with ThreadPoolExecutor(2) as pool:  # two at a time: the machine's cores
        ran = list(pool.map(lambda item: timed(*item), commands(through.url, config).items()))
    for name, took, done in ran:
        said = done.stderr.strip().splitlines()
        assert done.returncode == 2, (name, done.stdout, done.stderr)
        assert len(said) == 1 and said[0].startswith("dedupsink: error: "), (name, said)
        assert "accepted the connection but sent no reply" in said[0], (name, said)
        assert through.storage_options["secret"] not in done.stderr
        assert took < 10, (name, took)


def test_inspect_against_a_silent_endpoint_says_so_in_one_line_within_10_s(
    place: tuple[Remote, Remote], proxy: FaultProxy
) -> None:
    """The first of the commands above, in the regular suite."""
    through, _ = place
    proxy.set(silent=True)
    flags = [f for name, v in through.storage_options.items() for f in ("--fs", f"{name}={v}")]
    started = time.monotonic()
    done = subprocess.run(
        [DEDUPSINK, "inspect", through.url, *flags], capture_output=True, text=True, timeout=60
    )
    took = time.monotonic() - started
    assert done.returncode == 2 and took < 10, (took, done.stderr)
    assert done.stderr.strip() == (
        f"dedupsink: error: option PATH='{through.url}' is invalid: expected an endpoint that "
        f"answers: the S3 endpoint {proxy.endpoint_url} (fs.endpoint_url) accepted the "
        "connection but sent no reply within 5 s (storageConnectTimeout)"
    )


# -- killed while the store browns out --------------------------------------------------------


@pytest.mark.slow  # a few minutes: CI runs it with `make test-slow`
def test_sigkill_loop_on_s3_with_faults_on_ends_exactly_once(
    tmp_path: Path, place: tuple[Remote, Remote], proxy: FaultProxy
) -> None:
    """The direct engine (the sink's code without Spark's transport) runs 24 windows on S3
    through the proxy, killed with SIGKILL after a random while, restarted until it ends."""
    through, direct = place
    inputs = [ordered_batch(b) for b in range(24)]
    write_inputs(tmp_path / "in", inputs)
    ctl = Control(tmp_path / "control").setup()
    config = {
        "engine": "direct",
        "input": str(tmp_path / "in"),
        "output": through.url,
        "checkpoint": str(tmp_path / "chk.json"),
        "options": {**through.sink_options, **ORDERED_OPTIONS, **BOUNDS},
        "partitions": 2,
    }
    proxy.set(**BROWNOUT)
    chance = random.Random(5)
    kills = stalled = seen = 0
    for attempt in range(40):
        running = DriverProcess({**config, "attempt": attempt}, ctl, tmp_path)
        # A restart reads its state back through the faults before its first window, which
        # takes longer as the state grows and the host is loaded: each run killed before it
        # committed anything gives the next one 2 s more, so the loop always ends.
        try:
            running.process.wait(timeout=chance.uniform(1.0, 4.0) + 2.0 * stalled)
        except subprocess.TimeoutExpired:
            running.process.send_signal(signal.SIGKILL)
        done = running.wait(timeout=300)
        if not done.killed:
            assert done.returncode == 0, done.stderr[-3000:]
            break
        kills += 1
        visible = [rid for rids in rids_by_port(direct).values() for rid in rids]
        assert len(visible) == len(set(visible)), "a row is visible twice after a kill"
        stalled = stalled + 1 if len(visible) == seen else 0
        seen = len(visible)
    else:
        raise AssertionError("still killed after 40 runs")
    proxy.clear()
    assert kills >= 3, kills
    assert_as_the_reference(direct, inputs)


def test_a_window_whose_store_stays_throttled_fails_within_the_budget(
    place: tuple[Remote, Remote], proxy: FaultProxy
) -> None:
    """Throttling that outlasts ``storageTimeout`` (every request answered 503 SlowDown): the
    window fails in one line naming the store and the operation, after at most the budget
    (and one attempt); nothing of it is visible, and it commits once the store recovers."""
    through, direct = place
    inputs = [ordered_batch(b) for b in range(3)]
    sink = LocalSink(sink_options(through, storageTimeout="3 seconds"), ROW_SCHEMA)
    sink.window(0, inputs[0], partitions=2)
    proxy.set(slowdown=1.0)
    started = time.monotonic()
    # The last attempt may be cut by the spent budget on a slow host: the reply before it is
    # then named too.
    throttled = r"did not answer .*; last( reply)?: 503 SlowDown \("
    with pytest.raises(StoreUnavailableError, match=throttled):
        sink.window(1, inputs[1], partitions=2)
    assert time.monotonic() - started < 3 + 3 + 3
    proxy.clear()
    assert sorted(r for rids in rids_by_port(direct).values() for r in rids) == sorted(
        inputs[0].column("rid").to_pylist()
    )
    restarted = LocalSink(sink_options(through), ROW_SCHEMA)
    restarted.start()
    restarted.window(1, inputs[1], partitions=2, attempt=1)
    restarted.window(2, inputs[2], partitions=2)
    assert_as_the_reference(direct, inputs)


@pytest.mark.slow  # Azurite's start and 12 windows: CI runs it with `make test-slow`
def test_windows_on_azure_through_server_busy_and_resets_equal_the_reference(
    azure: Azurite,
) -> None:
    """Azure's emulator behind the proxy: ``503 ServerBusy`` (Azure's throttling), resets and
    truncated replies are retried by the sink (the Azure SDK's own retries are off)."""
    direct = azure.remote("wire")
    inputs = [ordered_batch(b) for b in range(12)]
    upstream = f"http://127.0.0.1:{azure.port}"
    with FaultProxy(upstream, seed=9, flavor="azure") as proxy:
        through = proxied(direct, proxy)
        sink = LocalSink(sink_options(through), ROW_SCHEMA)
        proxy.set(slowdown=0.05, reset=0.02, truncate=0.02)
        for batch_id, window in enumerate(inputs):
            sink.window(batch_id, window, partitions=2)
        struck = proxy.counts()
    assert struck["slowdown"] > 0 and struck["reset"] + struck["truncate"] > 0, struck
    assert_as_the_reference(direct, inputs)
    assert sum(store_retries(direct)) > 0


def test_an_iceberg_glue_catalog_that_never_answers_fails_the_start_within_seconds(
    place: tuple[Remote, Remote], proxy: FaultProxy
) -> None:
    """pyiceberg's Glue client has no deadline of its own (botocore's 60 s, ten attempts):
    the start gives the catalog ``storageConnectTimeout`` and names where it is."""
    _, direct = place
    proxy.set(silent=True)
    options = {
        "path": direct.url,
        **direct.sink_options,
        "keys": "id",
        "outputFormat": "iceberg",
        "iceberg.catalog.type": "glue",
        "iceberg.catalog.glue.endpoint": proxy.endpoint_url,
        "iceberg.catalog.glue.region": "us-east-1",
        "iceberg.catalog.glue.access-key-id": "test-key",
        "iceberg.catalog.glue.secret-access-key": "test-secret",
    }
    started = time.monotonic()
    with pytest.raises(DedupOptionError) as caught:
        plan_for(options, ROW_SCHEMA, "run-1")
    took = time.monotonic() - started
    message = str(caught.value)
    assert message.startswith(
        f"option iceberg.catalog.glue.endpoint='{proxy.endpoint_url}' is invalid: expected a "
        "catalog that can be reached (no reply within 5 s (storageConnectTimeout))"
    ), message
    assert "test-secret" not in message
    # storageConnectTimeout (5 s) and the start's own work, with room for a loaded 2-core host
    assert took < 20, took
    assert files_under(direct) == {}


def test_a_task_whose_window_file_upload_is_never_answered_fails_within_the_budget(
    place: tuple[Remote, Remote], proxy: FaultProxy
) -> None:
    """A PUT held by a silent store: aiohttp waits for the interim ``100 Continue`` with no
    timeout of its own, so the task's window file upload is cut by the attempt's deadline."""
    through, direct = place
    inputs = [ordered_batch(b) for b in range(2)]
    sink = LocalSink(sink_options(through, storageTimeout="3 seconds"), ROW_SCHEMA)
    sink.window(0, inputs[0], partitions=2)
    proxy.set(
        silent=True, match=lambda method, target: method == "PUT" and "/_store/data/" in target
    )
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError, match=r"did not answer PUT \S+/_store/data/w"):
        sink.window(1, inputs[1], partitions=2)
    assert time.monotonic() - started < 10
    proxy.clear()
    restarted = LocalSink(sink_options(through), ROW_SCHEMA)
    restarted.start()
    restarted.window(1, inputs[1], partitions=2, attempt=1)
    assert_as_the_reference(direct, inputs)
