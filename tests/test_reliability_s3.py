"""Faults on S3: requests that fail mid-commit at a real S3 API server, then a restart.

The sink's windows run in this process (``LocalSink``: tasks, then the commit, exactly as Spark
drives them) against moto's S3 server, which fails chosen requests: answered with a 500 before
the server acts (persistently, so the retries spend the operation's budget, here a short
``storageTimeout``), or acted on and the
connection then dropped before the reply (the client cannot tell whether it happened, retries,
and finds the object there). Each scenario strikes one kind of request of one window's commit
(the manifest's conditional create, a server-side copy into a port, a sink-log entry, the
staging clean-up) or of its tasks; then the query restarts (a new run, re-running the window
as Spark re-runs a batch missing from its checkpoint) and goes on. Every input row ends in
exactly one port exactly once, as the reference model says, and Spark's sink log lists exactly
the files pyarrow reads.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from faults import ORDERED_OPTIONS, PORTS, ROW_SCHEMA, assert_exactly_once, ordered_batch
from servers import Remote, S3Fault, S3Request, S3Server
from streams import PORT_NAMES, files_under, port_rows, read_port, read_text, reference_outputs

from dedupsink.engine.classify import stamp_dtype
from dedupsink.errors import StoreCorruptError, StoreUnavailableError
from dedupsink.runtime import RUNTIME
from dedupsink.sink.local import LocalSink
from dedupsink.store.cache import BucketCache, BucketManager
from dedupsink.store.storage import Storage

WINDOWS = 6
FAULTED = 3
PARTITIONS = 2
INPUTS = [ordered_batch(b) for b in range(WINDOWS)]


@dataclass(frozen=True)
class Scenario:
    name: str
    matches: Callable[[S3Request], bool]
    how: str  # "500" (persistent) or "drop" (once: the reply of a served request is lost)
    fails: bool  # whether the window fails (else the client's retry absorbs the fault)


def key_has(*parts: str, op: str | None = None) -> Callable[[S3Request], bool]:
    return lambda r: all(p in r.key for p in parts) and (op is None or r.op == op)


SCENARIOS = [
    Scenario("manifest create, 500s", key_has("_store/_log/", op="PutObject"), "500", True),
    Scenario("manifest create, reply lost", key_has("_store/_log/", op="PutObject"), "drop", False),
    Scenario("copy into a port, 500s", key_has("duplicate/part-", op="CopyObject"), "500", True),
    Scenario(
        "copy into a port, reply lost", key_has("unique/part-", op="CopyObject"), "drop", False
    ),
    Scenario("sink-log entry, 500s", key_has("expired/_spark_metadata/"), "500", True),
    Scenario("sink-log entry, reply lost", key_has("error/_spark_metadata/"), "drop", False),
    Scenario("staging clean-up, 500s", lambda r: r.op == "DeleteObjects", "500", True),
    Scenario("task's staged file, 500s", key_has("_staging/", ".expired.parquet"), "500", True),
    Scenario("task's window file, reply lost", key_has("_store/data/w"), "drop", False),
]


def logged_rids(place: Remote, port: str) -> list[int]:
    """Row ids of a port as Spark's sink log lists it (latest compaction, then later entries)."""
    entries = {
        int(name.split(".")[0]): name
        for name in files_under(place, f"{port}/_spark_metadata")
        if name[0].isdigit()
    }
    compactions = [i for i, n in entries.items() if n.endswith(".compact")]
    names: set[str] = set()
    for log_id in sorted(i for i in entries if i >= (max(compactions) if compactions else 0)):
        lines = read_text(place, f"{port}/_spark_metadata/{entries[log_id]}").splitlines()
        names.update(json.loads(line)["path"].rsplit("/", 1)[-1] for line in lines[1:] if line)
    table = read_port(place, port)
    files = {p.rsplit("/", 1)[-1] for p in files_under(place, port) if "/" not in p}
    assert names == files, f"{port}: the log lists {sorted(names)}, the port holds {sorted(files)}"
    return sorted(table.column("rid").to_pylist()) if table.num_rows else []


def rows_by_port(place: Remote) -> dict[str, list[int]]:
    return {port: sorted(read_port(place, port).column("rid").to_pylist()) for port in PORTS}


# Persistent faults spend an operation's whole budget: a short one keeps those tests quick.
# A lost reply is absorbed by one retry, so those runs keep a budget a loaded host cannot
# spend on a request that was merely slow (a 3 s budget once ran out on such a host while a
# later window's PUT waited for its connection).
SHORT_BUDGET = {"storageTimeout": "3 seconds"}
AMPLE_BUDGET = {"storageTimeout": "60 seconds"}


def sink(place: Remote, budget: dict[str, str] = AMPLE_BUDGET) -> LocalSink:
    options = {"path": place.url, **place.sink_options, **ORDERED_OPTIONS, **budget}
    return LocalSink(options, ROW_SCHEMA)


# Each point with a 500 runs in the regular suite; the same points with the reply lost are slow
# tests (CI runs them with `make test-slow`).
@pytest.mark.parametrize(
    "scenario",
    [pytest.param(s, marks=pytest.mark.slow) if s.how == "drop" else s for s in SCENARIOS],
    ids=[s.name for s in SCENARIOS],
)
def test_a_request_failing_mid_window_loses_and_duplicates_nothing(
    s3: S3Server, scenario: Scenario
) -> None:
    place = s3.remote("faults")
    first = sink(place, SHORT_BUDGET if scenario.fails else AMPLE_BUDGET)
    for batch in range(FAULTED):
        first.window(batch, INPUTS[batch], PARTITIONS)
    fault = s3.fail(
        S3Fault(scenario.matches, times=1 if scenario.how == "drop" else 100, how=scenario.how)
    )
    if scenario.fails:
        with pytest.raises(StoreUnavailableError, match=r"did not answer .* gave up after"):
            first.window(FAULTED, INPUTS[FAULTED], PARTITIONS)
        s3.clear_faults()
        everything = [rid for rids in rows_by_port(place).values() for rid in rids]
        assert len(everything) == len(set(everything)), "a row is visible twice"
        restarted = sink(place)  # the query restarted from its checkpoint: a new run
        restarted.start()
        restarted.window(FAULTED, INPUTS[FAULTED], PARTITIONS, attempt=1)
    else:
        first.window(FAULTED, INPUTS[FAULTED], PARTITIONS)
        restarted = first
    assert fault.hit, f"the fault never struck: {scenario.name}"
    for batch in range(FAULTED + 1, WINDOWS):
        restarted.window(batch, INPUTS[batch], PARTITIONS)
    visible = rows_by_port(place)
    assert_exactly_once(visible, INPUTS)
    assert {port: logged_rids(place, port) for port in PORTS} == visible
    windows = [table.drop_columns(["rid"]) for table in INPUTS]
    expected = reference_outputs(windows, "ordered", ["id"], "n", 10)
    assert {port: port_rows(place, port, ["id", "n"]) for port in PORT_NAMES} == dict(expected)


@pytest.mark.parametrize(
    ("how", "times", "statuses"),
    [("drop", 1, [200, 412]), ("409", 2, [409, 409, 200])],
    ids=["reply lost", "write in flight"],
)
def test_a_manifest_create_that_meets_a_fault_commits_the_window_once(
    s3: S3Server, how: str, times: int, statuses: list[int]
) -> None:
    """Reply lost: the server created the version, the client's retry finds it present (412),
    and its bytes are the commit's own. Write in flight: S3 answers a conditional PUT racing
    another write of the key with 409, meaning "retry", and the retry creates the version."""
    place = s3.remote("create-fault")
    writer = sink(place)
    writer.window(0, INPUTS[0], PARTITIONS)
    fault = s3.fail(S3Fault(key_has("_store/_log/", op="PutObject"), times=times, how=how))
    report = writer.window(1, INPUTS[1], PARTITIONS)
    assert report is not None and report.version == 2 and not report.already_committed
    assert len(fault.hit) == times
    creates = [r for r in s3.requests() if r.key.endswith("000000000002.manifest")]
    assert [r.status for r in creates if r.op == "PutObject"] == statuses
    assert sum(1 for n in files_under(place, "_store/_log")) == 3


def test_a_truncated_window_file_on_s3_is_corrupt_naming_it(s3: S3Server) -> None:
    """Its segments now start past its end, which S3 answers with a 416: the store reads that
    as a short read and names the file, as on a local disk, rather than failing with the
    server's bare error."""
    place = s3.remote("truncated")
    writer = sink(place)
    writer.window(0, INPUTS[0], PARTITIONS)
    fs = place.fs()
    name = sorted(files_under(place, "_store/data"))[0]
    path = f"{place.url}/_store/data/{name}".removeprefix("s3://")
    fs.pipe_file(path, fs.cat_file(path)[:8])  # the magic only
    store, settings = writer.plan.store, writer.plan.settings
    manifest = store.read()
    assert manifest is not None
    # Another process: no bucket cached, no window file remembered from writing it.
    RUNTIME.reset("store.written_files")
    fresh = BucketManager(store, BucketCache(1 << 20), stamp_dtype(settings)).use(manifest)
    with pytest.raises(StoreCorruptError) as caught:
        fresh.load(sorted(manifest.buckets), None)
    assert name in str(caught.value)


def test_a_delete_s3_refuses_key_by_key_is_an_error_naming_the_key(s3: S3Server) -> None:
    """S3 reports a denied delete inside a successful DeleteObjects reply: the storage raises,
    naming the object, instead of leaving garbage behind with no error."""
    place = s3.remote("denied")
    storage = Storage.for_url(place.url, place.storage_options)
    paths = [storage.path("garbage", f"{n}.keys") for n in range(3)]
    for path in paths:
        storage.write(path, b"x")
    fault = s3.fail(S3Fault(lambda r: r.op == "DeleteObjects", how="deny"))
    with pytest.raises(OSError, match=r"refused to delete 3 of 3 objects.*AccessDenied"):
        storage.delete(paths)
    assert fault.hit and all(storage.exists(path) for path in paths)
    storage.delete([*paths, storage.path("garbage", "never-there.keys")])  # missing: no error
    assert not any(storage.exists(path) for path in paths)
