"""End to end: every job config in conf/ run by ``python -m dedupsink run`` on the sample data.

The expected counts come from ``tests/reference.py`` (a row-by-row model of the spec) over the
sample files read with the standard library, one window per file in name order, never from
the CLI's own output. The sample files are copied with modification times in name order,
because Spark's file source reads files in modification-time order.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fsspec
import pyarrow.dataset as ds
import pytest
from reference import ReferenceDedup, ReferenceSequence

import dedupsink
from dedupsink.cli.run import remove_checkpoint
from dedupsink.inspection import inspect_store, locate

ROOT = Path(__file__).resolve().parent.parent
PORTS = ("unique", "duplicate", "expired", "error")
HOUR_US = 3_600_000_000
SUMMARY_ROW = re.compile(r"^\s+(unique|duplicate|expired|error)\s+(\d+)\s+(\d+)\s+(\S+)\s*$")
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
BATCH_LINE = re.compile(r"^batch\s+\d+ \(window \d+\):")

Row = dict[str, Any]

pytestmark = pytest.mark.spark


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) else None


def _micros(value: Any) -> int | None:
    """Spark's JSON reader turns an unreadable timestamp into null; so does this."""
    try:
        moment = datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None
    return int(moment.timestamp()) * 1_000_000


def _all_present(*parts: Any) -> tuple[Any, ...] | None:
    return None if any(part is None for part in parts) else parts


@dataclass(frozen=True)
class Case:
    """How to model one config: its data folder, mode, key, expiry value and period."""

    data: str
    mode: str
    key: Callable[[Row], Hashable | None]
    value: Callable[[Row], Any] = lambda row: None
    period: float | None = None
    one_window: bool = False  # a batch job: every file in one window


SYSTEM_LOGS = Case(
    "system-logs",
    "tupleTime",
    key=lambda r: _all_present(_int(r.get("serial"))),
    value=lambda r: _micros(r.get("ts")),
    period=24 * HOUR_US,
)

CASES = {
    "customers-basic": Case(
        "customers", "basic", key=lambda r: _all_present(r["name"], r["phone"])
    ),
    "system-logs": SYSTEM_LOGS,
    "transactions-ordered": Case(
        "transactions",
        "ordered",
        key=lambda r: _all_present(_int(r.get("txn_id"))),
        value=lambda r: _int(r.get("txn_id")),
        period=100,
    ),
    "cities-categorical": Case(
        "cities",
        "categorical",
        key=lambda r: _all_present(r.get("order_id")),
        value=lambda r: r.get("city"),
        period=2,
    ),
    "system-logs-backfill": replace(SYSTEM_LOGS, one_window=True),  # the same logs, one batch
    "system-time": Case(
        "system-logs",
        "systemTime",
        key=lambda r: _all_present(_int(r.get("serial"))),
        period=HOUR_US,
    ),
    # The producer is the key; the value its sequence id (the LSN).
    "cdc-sequence": Case(
        "cdc", "sequence", key=lambda r: _all_present(r.get("source")), value=lambda r: r["lsn"]
    ),
}


def read_rows(path: Path) -> list[Row]:
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as handle:
            return [
                {k: (v if v != "" else None) for k, v in row.items()}
                for row in csv.DictReader(handle)
            ]
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def windows_of(folder: Path) -> list[list[Row]]:
    return [read_rows(path) for path in sorted(folder.iterdir())]


def expected_runs(case: Case, runs: int) -> list[Counter[str]]:
    """Port counts of each run: every run reads all the files again, one window per file."""
    model = ReferenceDedup(case.mode, case.period)
    sequence = ReferenceSequence()
    windows = windows_of(ROOT / "data" / case.data)
    if case.one_window:
        windows = [[row for rows in windows for row in rows]]
    results = []
    clock = 0
    for _ in range(runs):
        counts: Counter[str] = Counter()
        for rows in windows:
            clock += 1_000_000  # systemTime: a second between batches, far below the period
            if case.mode == "sequence":
                counts.update(sequence.window(rows, case.key, case.value))
                continue
            counts.update(model.window(rows, case.key, case.value, window_time=clock))
        results.append(counts)
    return results


def latest_text(case: Case) -> str:
    """The newest timestamp of the non-error rows, as ``inspect --json`` writes a tupleTime
    point: ISO-8601 UTC."""
    stamps = [
        case.value(row)
        for rows in windows_of(ROOT / "data" / case.data)
        for row in rows
        if case.key(row) is not None and case.value(row) is not None
    ]
    return datetime.fromtimestamp(max(stamps) / 1e6, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- running the CLI --------------------------------------------------------------------------


@dataclass
class Summary:
    this_run: dict[str, int]
    all_runs: dict[str, int]
    locations: dict[str, str]
    batches: int
    stdout: str
    stderr: str = ""


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_MASTER")
    }
    return subprocess.run(
        [sys.executable, "-m", "dedupsink", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def run_job(name: str, data: Path, out: Path) -> Summary:
    result = cli(
        "run",
        f"conf/{name}.conf",
        *("--set", f"path={out}", "--set", f"source.path={data}"),
        # A JVM that compiles less starts faster; these runs last seconds, not hours.
        *("--set", f"spark.driver.extraJavaOptions={FAST_JVM}"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # one line per batch: the commit's worker does not log the sink's own line as well
    assert "dedup window" not in result.stderr, result.stderr[-3000:]
    summary = Summary({}, {}, {}, 0, result.stdout, result.stderr)
    for line in result.stdout.splitlines():
        if BATCH_LINE.match(line):
            summary.batches += 1
        match = SUMMARY_ROW.match(line)
        if match:
            port = match.group(1)
            summary.this_run[port] = int(match.group(2))
            summary.all_runs[port] = int(match.group(3))
            summary.locations[port] = match.group(4)
    assert set(summary.this_run) == set(PORTS), result.stdout
    return summary


def inspect_json(path: Path) -> dict[str, Any]:
    result = cli("inspect", str(path), "--json")
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def inspect_report(path: Path) -> dict[str, Any]:
    """What ``dedupsink inspect --json`` prints, computed in this process."""
    return inspect_store(locate(str(path))).to_dict()


@pytest.fixture
def sample_data(tmp_path: Path) -> Callable[[str], Path]:
    """A copy of one sample data set whose modification times follow the file names."""

    def copy(name: str) -> Path:
        target = tmp_path / "data" / name
        shutil.copytree(ROOT / "data" / name, target)
        for index, path in enumerate(sorted(target.iterdir())):
            os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))
        return target

    return copy


def as_dict(counts: Counter[str]) -> dict[str, int]:
    return {port: counts.get(port, 0) for port in PORTS}


def test_every_config_has_a_model() -> None:
    assert {path.stem for path in (ROOT / "conf").glob("*.conf")} == set(CASES)


def test_sample_data_feeds_every_port() -> None:
    """Each data set gives each port of its mode something to hold (the four ports). Nothing
    expires in a store's first window (no expiry point yet): a backfill's one window."""
    for name, case in CASES.items():
        counts = expected_runs(case, 1)[0]
        no_expiry = case.mode in ("basic", "systemTime", "sequence") or case.one_window
        wanted = [p for p in PORTS if not (p == "expired" and no_expiry)]
        assert all(counts[port] > 0 for port in wanted), (name, counts)


# Each case is a `dedupsink run` of its own (a JVM and Spark's Python workers started afresh, 50
# to 125 s on a loaded 2-core host): one stays in the regular suite, the other modes' runs are
# slow ones (their modes' Spark streams are in test_sink.py and test_lakehouse.py too).
_SLOW_RUN = pytest.mark.slow


@pytest.mark.parametrize(
    "name",
    [
        "customers-basic",
        pytest.param("transactions-ordered", marks=_SLOW_RUN),
        pytest.param("cities-categorical", marks=_SLOW_RUN),
        pytest.param("system-time", marks=_SLOW_RUN),
        pytest.param("system-logs-backfill", marks=_SLOW_RUN),
        pytest.param("cdc-sequence", marks=_SLOW_RUN),
    ],
)
def test_run_matches_the_reference(
    name: str, sample_data: Callable[[str], Path], tmp_path: Path
) -> None:
    case = CASES[name]
    out = tmp_path / "out"
    summary = run_job(name, sample_data(case.data), out)
    expected = as_dict(expected_runs(case, 1)[0])
    assert summary.this_run == expected
    assert summary.all_runs == expected
    files = len(list((ROOT / "data" / case.data).iterdir()))
    assert summary.batches == (1 if case.one_window else files)
    for port in PORTS:
        assert summary.locations[port] == str(out / port)
        assert ds.dataset(summary.locations[port], format="parquet").count_rows() == expected[port]
    assert not (out / "_checkpoints").exists()  # the run's fresh checkpoint is gone
    report = inspect_report(out)
    assert {port: info["rows"] for port, info in report["ports"].items()} == expected
    assert report["owner"] is None
    last_line = [line for line in summary.stdout.splitlines() if BATCH_LINE.match(line)][-1]
    assert f"(window {report['last_window']['version']}):" in last_line
    assert f"Inspect: dedupsink inspect {out}\n" in summary.stdout
    if case.mode == "categorical":  # points are shown by category name
        assert report["latest_point"] == {"value": 6, "text": "Houston"}
        assert report["expiry_point"] == {"value": 4, "text": "El Paso"}


@_SLOW_RUN  # two `dedupsink run`s of the demo: 73 s on this host when idle
def test_demo_remembers_across_runs(sample_data: Callable[[str], Path], tmp_path: Path) -> None:
    """system-logs (the `make run` demo) twice: the second run finds the store's keys."""
    case = CASES["system-logs"]
    data, out = sample_data(case.data), tmp_path / "out"
    first, second = (as_dict(c) for c in expected_runs(case, 2))
    files = len(list(data.iterdir()))

    summary = first_run = run_job("system-logs", data, out)
    assert summary.this_run == first
    report = inspect_json(out)
    assert {port: info["rows"] for port, info in report["ports"].items()} == first
    assert {port: info["batches"] for port, info in report["ports"].items()} == dict.fromkeys(
        PORTS, files
    )
    assert report["windows"] == files
    assert report["owner"] is None
    assert report["remembered_keys"] > 0
    assert report["latest_point"]["text"] == latest_text(case)

    summary = run_job("system-logs", data, out)
    assert summary.this_run == second
    assert second["duplicate"] > 0 and second["unique"] == 0
    both = {port: first[port] + second[port] for port in PORTS}
    assert summary.all_runs == both
    report = inspect_json(out / "_store")
    assert {port: info["rows"] for port, info in report["ports"].items()} == both
    assert report["windows"] == 2 * files
    assert report["owner"] is None
    windows_are_numbered_alike(out, [*printed_windows(first_run), *printed_windows(summary)])
    the_readme_shows_what_a_user_sees(first_run, summary, out)
    lookups_agree_with_the_counts(out, report, summary.stdout)


README_OUT = "/home/you/dedupsink/out/system-logs"


def readme_samples() -> list[list[str]]:
    """The blocks of the README's "A first look" that show ``make run``'s two runs."""
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("## A first look", 1)[1]
    blocks = re.findall(r"```\n(.*?)```", section, re.DOTALL)
    return [as_the_readme_shows(block) for block in blocks[:2]]


def test_each_readme_sample_of_make_run_is_one_run() -> None:
    """Each sample's batch lines and summary come from the same run: its windows' wall times
    add up to no more than the run's."""
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("## A first look", 1)[1]
    for block in re.findall(r"```\n(.*?)```", section, re.DOTALL)[:2]:
        finished = re.search(r"Run finished: \d+ batch(?:es)? in (\d+\.\d) s", block)
        walls = [float(wall) for wall in re.findall(r"\| (\d+\.\d) s wall", block)]
        assert finished is not None and walls, block
        assert sum(walls) <= float(finished.group(1)), (walls, finished.group(0))


def as_the_readme_shows(text: str, out: Path | None = None) -> list[str]:
    """Lines as the README writes them: the output under /home/you, the run's time and query
    id and each window's seconds (which differ each run) as placeholders, the command as
    ``make run`` calls it."""
    if out is not None:
        text = text.replace(str(out), README_OUT)
    text = re.sub(r"in \d+\.\d s \(query [0-9a-f-]{36}\)", "in <seconds> (query <id>)", text)
    # A window's wall, commit and task seconds differ each run too.
    text = re.sub(
        r"\| \d+\.\d s wall \(commit \d+\.\d s\), tasks \d+\.\d\d s",
        "| <wall> s wall (commit <commit> s), tasks <tasks> s",
        text,
    )
    return text.replace("Inspect: dedupsink ", "Inspect: .venv/bin/dedupsink ").splitlines()


def the_readme_shows_what_a_user_sees(first: Summary, second: Summary, out: Path) -> None:
    """The README's sample of ``make run``: make's echo of the command, then what the command
    prints, Spark's start-up lines (stderr) after its first line; the second run's batches and
    summary as printed."""
    shown, again = readme_samples()
    assert shown[:2] == ["$ make run", ".venv/bin/dedupsink run conf/system-logs.conf"]
    assert first.stderr.splitlines()[:3] == shown[3:6]
    assert as_the_readme_shows(first.stdout, out) == [shown[2], *shown[6:]]
    printed = as_the_readme_shows(second.stdout, out)
    start = printed.index(again[0])
    assert printed[start : start + len(again)] == again


def lookups_agree_with_the_counts(out: Path, report: dict[str, Any], stdout: str) -> None:
    """ "Remembered" means one thing: ``lookup`` of each unique row says remembered for as many
    keys as ``inspect`` and ``run`` count, and "expired, awaiting fold" for the keys counted
    apart (the rest left with their expired window files)."""
    serials = ds.dataset(out / "unique", format="parquet").to_table(["serial"]).column(0)
    verdicts: Counter[str] = Counter()
    for serial in serials.to_pylist():
        found = dedupsink.lookup(str(out), {"serial": str(serial)})
        reason = (found.reason or "").split(":")[0]
        verdicts["remembered" if found.remembered else reason] += 1
    assert (report["remembered_keys"], report["expired_unfolded_keys"]) == (230, 61)
    assert verdicts == {"remembered": 230, "expired, awaiting fold": 61}
    assert (
        f"Store {out / '_store'}: 230 remembered keys (and 61 expired keys awaiting fold);"
        in stdout
    )


def printed_windows(summary: Summary) -> list[tuple[int, int]]:
    """(batch, window) of each batch line ``run`` printed."""
    found = (
        re.match(r"^batch\s+(\d+) \(window (\d+)\):", line) for line in summary.stdout.splitlines()
    )
    return [(int(m.group(1)), int(m.group(2))) for m in found if m]


def windows_are_numbered_alike(out: Path, printed: list[tuple[int, int]]) -> None:
    """The window number ``run`` printed for each batch is the one the history, lookup, inspect
    and the report show for it."""
    history = dedupsink.history(str(out)).to_pylist()
    assert [(row["batch_id"], row["version"]) for row in history] == printed
    assert inspect_json(out)["last_window"]["version"] == printed[-1][1]
    # Serial 290 is a unique row of the first run's last batch: lookup names its window.
    found = dedupsink.lookup(str(out), {"serial": "290"})
    assert found.remembered and (found.batch_id, found.window) == printed[len(printed) // 2 - 1]
    page = out.parent / "report.html"
    assert cli("report", str(out), "-o", str(page)).returncode == 0
    text = page.read_text()
    bars = re.findall(r'<g class="bar" data-version="(\d+)">', text)
    assert [int(v) for v in bars] == [window for _, window in printed]
    listed = re.findall(r'<tr data-version="(\d+)"><td>(\d+)</td>', text)
    assert listed == [(str(w), str(w)) for _, w in reversed(printed)]
    for _, window in printed:
        assert f"window {window}, committed" in text  # each bar's tooltip


@pytest.mark.slow  # two Spark runs of the backfill job, about 40 s: CI runs it in test-slow
def test_a_backfill_run_twice_puts_every_row_in_duplicate_or_expired(
    sample_data: Callable[[str], Path], tmp_path: Path
) -> None:
    """The batch job (trigger = batch) writes all the files as one window; run again, the
    store remembers every key."""
    case = CASES["system-logs-backfill"]
    data, out = sample_data(case.data), tmp_path / "out"
    first, second = (as_dict(c) for c in expected_runs(case, 2))
    assert run_job("system-logs-backfill", data, out).this_run == first
    summary = run_job("system-logs-backfill", data, out)
    assert summary.this_run == second and summary.batches == 1
    assert second["unique"] == 0 and second["duplicate"] + second["expired"] > 0
    assert inspect_json(out)["windows"] == 2


# -- the CLI's DDL parser against Spark's own ----------------------------------------------------

# validate checks a job without starting a JVM, so the CLI parses source schemas itself; these
# cases keep its parser and Spark's in step (a pyspark upgrade that changes the grammar fails
# here first).
SAME_AS_SPARK = [
    "b BOOLEAN, t TINYINT, y BYTE, s SMALLINT, h SHORT, i INT, n INTEGER, l BIGINT, g LONG",
    "f FLOAT, r REAL, d DOUBLE, s STRING, b BINARY, d2 DATE",
    "t TIMESTAMP, l TIMESTAMP_LTZ, n TIMESTAMP_NTZ",
    "d DECIMAL(10, 2), e DEC(5), n NUMERIC, m DECIMAL(38,38)",
    "c CHAR(3), v VARCHAR(10), w CHARACTER(2)",
    "a ARRAY<INT>, m MAP<STRING, ARRAY<BIGINT>>, s STRUCT<x: INT, `y z`: STRING>",
    "s STRUCT<inner: STRUCT<deep: ARRAY<MAP<INT, STRING>>>>",
    "`a b` INT NOT NULL COMMENT 'the a', `x``y` STRING, `dotted.name` DOUBLE",
    "id bigint, Name string, TS timestamp",
    "a: INT, b: STRING",
]
REFUSED_BY_BOTH = ["a ARRAY<INT", "a BIGINT,", "a INT)", "a DECIMAL(40, 2)", "a NOSUCHTYPE"]


def _as_the_stream_sees_it(kind: Any) -> Any:
    """Spark's parsed type as a streaming source reads it: CHAR and VARCHAR as STRING, no
    comments (the CLI keeps none)."""
    from pyspark.sql.types import (
        ArrayType,
        CharType,
        MapType,
        StringType,
        StructField,
        StructType,
        VarcharType,
    )

    if isinstance(kind, CharType | VarcharType):
        return StringType()
    if isinstance(kind, ArrayType):
        return ArrayType(_as_the_stream_sees_it(kind.elementType), kind.containsNull)
    if isinstance(kind, MapType):
        key, value = (_as_the_stream_sees_it(t) for t in (kind.keyType, kind.valueType))
        return MapType(key, value, kind.valueContainsNull)
    if isinstance(kind, StructType):
        return StructType(
            [
                StructField(f.name, _as_the_stream_sees_it(f.dataType), f.nullable)
                for f in kind.fields
            ]
        )
    return kind


@pytest.mark.parametrize("text", SAME_AS_SPARK)
def test_the_cli_parses_a_schema_as_spark_does(spark: Any, text: str) -> None:
    from pyspark.sql.types import DataType

    from dedupsink.cli.ddl import parse_schema

    ours = _as_the_stream_sees_it(parse_schema(text))
    assert ours == _as_the_stream_sees_it(DataType.fromDDL(text))


@pytest.mark.parametrize("text", REFUSED_BY_BOTH)
def test_the_cli_refuses_a_schema_spark_refuses(spark: Any, text: str) -> None:
    from pyspark.errors import PySparkException
    from pyspark.sql.types import DataType

    from dedupsink.cli.ddl import parse_schema
    from dedupsink.errors import ConfigError

    with pytest.raises(PySparkException):
        DataType.fromDDL(text)
    with pytest.raises(ConfigError):
        parse_schema(text)


def test_a_fresh_checkpoint_is_removed_by_its_name_not_as_a_pattern() -> None:
    """``dedupsink run`` removes the checkpoint it made under the output; an output whose name
    holds ``[`` must not lose a neighbour its pattern matches (``out1`` for ``out[1]``)."""
    fs = fsspec.filesystem("memory")
    root = f"cli-{os.getpid()}"
    for output in ("out[1]", "out1"):
        fs.pipe_file(f"/{root}/{output}/_checkpoints/run-1/offsets/0", b"v1")
    remove_checkpoint(f"memory://{root}/out[1]/_checkpoints/run-1", {})
    assert fs.find(f"/{root}") == [f"/{root}/out1/_checkpoints/run-1/offsets/0"]
    fs.rm(f"/{root}", recursive=True)
