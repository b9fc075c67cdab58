"""Job config files, the DDL parser and the CLI's error handling (no Spark session needed).

A bad config must stop ``validate`` and ``run`` with exit code 2 and one line on stderr that
names the key; store commands (``inspect``, ``release``, the owner-lease check of ``run``) work
on stores written here through ``BucketStore``.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from manifests import recorded_without
from pyspark.sql.types import (
    ArrayType,
    DecimalType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)
from servers import S3Server

from dedupsink.cli.config import load_config, parse_config, parse_trigger
from dedupsink.cli.ddl import parse_schema
from dedupsink.cli.display import counted
from dedupsink.cli.job import checkpoint_for, prepare, spark_has_filesystem
from dedupsink.cli.main import main
from dedupsink.cli.run import (
    RunOutcome,
    WindowWatcher,
    command_name,
    failure_of,
    inspect_command,
    spark_master,
    summary,
)
from dedupsink.errors import ConfigError
from dedupsink.options import DedupOptions
from dedupsink.sink.local import LocalSink
from dedupsink.store.format import Manifest
from dedupsink.store.records import Owner, WindowRecord, now_ms
from dedupsink.store.store import BucketStore

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "data" / "system-logs"
GOOD = {
    "source.format": "json",
    "source.path": str(LOGS),
    "source.schema": "serial BIGINT, ts TIMESTAMP, host STRING, level STRING, message STRING",
    "source.option.maxFilesPerTrigger": "1",
    "keys": "serial",
    "expiryKey": "ts",
    "expiryPeriod": "24 hours",
    "trigger": "availableNow",
}

WriteConfig = Callable[..., Path]


@pytest.fixture
def write_config(tmp_path: Path) -> WriteConfig:
    """Write a config: GOOD with ``changes`` applied (None removes a key), output in tmp_path."""

    def write(changes: dict[str, str | None] | None = None, extra: str = "") -> Path:
        settings: dict[str, str | None] = {**GOOD, "path": str(tmp_path / "out")}
        settings.update(changes or {})
        lines = [f"{key} = {value}" for key, value in settings.items() if value is not None]
        path = tmp_path / "job.conf"
        path.write_text("# a test job\n" + "\n".join(lines) + "\n" + extra, encoding="utf-8")
        return path

    return write


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert captured.out == ""
    return lines[0]


# -- bad configs: exit code 2, one line naming the key ---------------------------------------


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"expiryPeriod": None, "expiryPeriode": "24 hours"}, "did you mean expiryPeriod?"),
        ({"expiryPeriod": "24 hourz"}, "expiryPeriod='24 hourz'"),
        ({"source.path": "/nonexistent/dedupsink/input"}, "source.path=/nonexistent"),
        ({"keys": "serail"}, "option keys='serail'"),
        ({"expiryKey": "tss"}, "option expiryKey='tss'"),
        ({"trigger": "soon"}, "trigger='soon'"),
        ({"source.schema": "serial BIGNUM, ts TIMESTAMP"}, "source.schema="),
        ({"source.format": None}, "source.format is required"),
        ({"source.format": "jsonl"}, "source.format='jsonl' is invalid"),
        ({"checkpointLocation": "/dev/null/chk"}, "/dev/null is not a folder"),
        ({"path": None}, "option path is missing"),
        ({"bucketSpan": "48 hours"}, "option bucketSpan='48 hours'"),
        ({"assumeSameExpiry": "maybe"}, "option assumeSameExpiry='maybe'"),
        (
            {"source.option.maxFilesPerTrigger": None, "source.optoin.maxFilesPerTrigger": "1"},
            "did you mean source.option.maxFilesPerTrigger?",
        ),
    ],
)
@pytest.mark.parametrize("command", ["validate", "run"])
def test_bad_config_exits_2_with_one_line_naming_the_key(
    command: str,
    changes: dict[str, str | None],
    named: str,
    write_config: WriteConfig,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([command, str(write_config(changes))]) == 2
    line = one_error_line(capsys)
    assert line.startswith("dedupsink: error: ")
    assert named in line


def test_message_says_where_the_key_is(
    write_config: WriteConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config({"expiryPeriod": "-3 hours"})
    assert main(["validate", str(path)]) == 2
    line = one_error_line(capsys)
    assert f"{path}:8:" in line and "expiryPeriod" in line


def test_run_with_a_bad_config_stops_before_spark_without_traceback(
    write_config: WriteConfig,
) -> None:
    path = write_config({"keys": "serial,nope"})
    result = subprocess.run(
        [sys.executable, "-m", "dedupsink", "run", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "'nope'" in result.stderr and "option keys=" in result.stderr
    assert result.stdout == ""


def test_verbose_adds_the_traceback(
    write_config: WriteConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--verbose", "validate", str(write_config({"trigger": "soon"}))]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_set_fixes_or_breaks_a_config(
    write_config: WriteConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config({"keys": "serail"})
    assert main(["validate", str(path), "--set", "keys=serial"]) == 0
    assert "OK" in capsys.readouterr().out
    assert main(["validate", str(path), "--set", "keys"]) == 2
    assert "--set expects key=value" in one_error_line(capsys)
    assert main(["validate", str(path), "--set", "expiryPeriod=soon"]) == 2
    assert "--set expiryPeriod" in one_error_line(capsys)


def test_unreadable_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(tmp_path / "missing.conf")]) == 2
    assert "missing.conf" in one_error_line(capsys)


# -- the file format -------------------------------------------------------------------------


def test_comments_continuations_and_case() -> None:
    text = (
        "# comment\n"
        "   # indented comment\n"
        "\n"
        "source.format = json   # inline comment\n"
        "source.schema = a BIGINT, \\\n"
        "                b STRING\n"
        "EXPIRYPERIOD = 24 hours\n"
        "source.option.maxFilesPerTrigger = 1\n"
        "spark.sql.shuffle.partitions = 2\n"
        "keys = a#b\n"
    )
    config = parse_config(text, "job.conf")
    assert config.get("source.format") == "json"
    assert config.get("source.schema") == "a BIGINT, b STRING"
    assert config.get("expiryPeriod") == "24 hours"
    assert config.where("expiryPeriod") == "job.conf:7"
    assert config.source_options == {"maxFilesPerTrigger": "1"}
    assert config.spark_conf == {"spark.sql.shuffle.partitions": "2"}
    assert config.sink_options == {"expiryPeriod": "24 hours", "keys": "a#b"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("keys = a\nkeys = b\n", "job.conf:2: keys is set twice (first at job.conf:1)"),
        ("just words\n", "job.conf:1: expected 'key = value'"),
        ("keys =\n", "job.conf:1: keys has no value"),
        ("sourc.format = json\n", "unknown key 'sourc.format' (did you mean source.format?)"),
        ("colour = red\n", "unknown key 'colour'; known keys: source.format"),
    ],
)
def test_malformed_lines(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "job.conf")
    assert message in str(caught.value)


def test_relative_paths_resolve_against_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.conf").write_text(
        "source.path = in/logs\npath = out/x\nstorePath = hdfs://nn:8020/s\n"
        "checkpointLocation = ~/chk\n",
        encoding="utf-8",
    )
    config = load_config("job.conf")
    assert config.get("source.path") == str(tmp_path / "in" / "logs")
    assert config.get("path") == str(tmp_path / "out" / "x")
    assert config.get("storePath") == "hdfs://nn:8020/s"
    assert config.get("checkpointLocation") == str(Path("~/chk").expanduser())


def test_triggers() -> None:
    assert parse_trigger(None).kind == "availableNow"
    assert parse_trigger("AvailableNow").kind == "availableNow"
    assert parse_trigger("once").kind == "once"
    interval = parse_trigger("10 seconds")
    assert (interval.kind, interval.interval_ms) == ("processingTime", 10_000)
    with pytest.raises(ConfigError, match="trigger='0 seconds'"):
        parse_trigger("0 seconds")


def test_ddl_schema() -> None:
    schema = parse_schema(
        "`order id` BIGINT NOT NULL, price DECIMAL(12, 2) COMMENT 'in EUR', "
        "tags ARRAY<STRING>, attrs MAP<STRING, BIGINT>, at timestamp_ntz, "
        "who: STRUCT<name: VARCHAR(20), seen TIMESTAMP>"
    )
    assert [f.name for f in schema] == ["order id", "price", "tags", "attrs", "at", "who"]
    assert schema["order id"].dataType == LongType() and not schema["order id"].nullable
    assert schema["price"].dataType == DecimalType(12, 2)
    assert schema["tags"].dataType == ArrayType(StringType(), True)
    assert schema["attrs"].dataType == MapType(StringType(), LongType(), True)
    assert schema["at"].dataType == TimestampNTZType()
    who = schema["who"].dataType
    assert isinstance(who, StructType)
    assert [f.dataType for f in who] == [StringType(), TimestampType()]


@pytest.mark.parametrize(
    "text", ["", "a", "a BIGINT,", "a ARRAY<INT", "a INT, A STRING", "a DECIMAL(40, 2)", "a INT)"]
)
def test_bad_ddl_names_the_key(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_schema(text)
    assert caught.value.key == "source.schema"


# -- the shipped configs ---------------------------------------------------------------------


@pytest.mark.parametrize("conf", sorted((ROOT / "conf").glob("*.conf")), ids=lambda p: p.stem)
def test_shipped_configs_validate(
    conf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["validate", str(conf), "--set", f"path={tmp_path / 'out'}"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{conf}: OK")
    batch = "trigger = batch" in conf.read_text()
    assert ("none (a batch job)" if batch else "fresh for each run") in out


# -- store commands: lease, release, inspect --------------------------------------------------


def owned_store(config_path: Path, owner: str) -> BucketStore:
    """Create the job's store and give it a live owner lease, as a running query would."""
    job = prepare(load_config(str(config_path)))
    assert job.settings is not None
    store = job.store
    created = store.open(job.settings)
    owned = Manifest.from_bytes(created.to_bytes(), "test")
    owned.version = created.version + 1
    owned.owner = Owner(owner, "run-1", now_ms(), 10_000, owned.version)
    store.commit(owned)
    return store


def test_inspect_shows_the_owner_and_release_gives_the_store_up(
    write_config: WriteConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config()
    store = owned_store(path, "query-elsewhere")
    assert main(["inspect", str(tmp_path / "out"), "--json"]) == 0
    owner = json.loads(capsys.readouterr().out)["owner"]
    assert (owner["query"], owner["run"], owner["lease_live"]) == ("query-elsewhere", "run-1", True)
    assert main(["inspect", str(tmp_path / "out")]) == 0
    assert "a new query waits up to 10s for the lease to lapse" in capsys.readouterr().out
    assert main(["release", store.url]) == 0
    assert "owned by query query-elsewhere" in capsys.readouterr().out
    assert main(["release", str(tmp_path / "out")]) == 0
    assert "nothing to release" in capsys.readouterr().out
    manifest = store.read()
    assert manifest is not None and manifest.owner is None
    assert [(f.query, f.run, f.by) for f in manifest.fenced] == [
        ("query-elsewhere", "run-1", "release")
    ]


def test_inspect_a_new_store(
    write_config: WriteConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    owned_store(write_config(), "q1")
    assert main(["inspect", str(tmp_path / "out" / "_store")]) == 0
    text = capsys.readouterr().out
    assert "tupleTime on keys serial, expiryKey ts" in text
    assert "expiryPeriod 24 hours" in text
    assert "windows     0 committed" in text
    assert "query q1" in text
    assert f"ports       {tmp_path / 'out'}" in text


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        (None, "24 buckets, assumeSameExpiry true"),
        ("true", "24 buckets, assumeSameExpiry true"),
        ("FALSE", "expiryPeriod 24 hours, 64 hash buckets, assumeSameExpiry false"),
    ],
)
def test_validate_and_inspect_show_assume_same_expiry(
    write_config: WriteConfig,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    given: str | None,
    shown: str,
) -> None:
    # With false a bucket span is refused: keys are bucketed by hash.
    path = write_config(
        {"assumeSameExpiry": given, "bucketSpan": None if given == "FALSE" else "1 hour"}
    )
    assert main(["validate", str(path)]) == 0
    assert shown in capsys.readouterr().out
    owned_store(path, "q1")
    assert main(["inspect", str(tmp_path / "out")]) == 0
    assert shown in capsys.readouterr().out
    assert main(["inspect", str(tmp_path / "out"), "--json"]) == 0
    settings = json.loads(capsys.readouterr().out)["settings"]
    assert settings["assume_same_expiry"] is (given != "FALSE")


@pytest.mark.parametrize(
    "changes",
    [
        {"expiryKey": None, "expiryPeriod": None, "bucketSpan": None},
        {"expiryKey": None, "expiryMode": "systemTime", "bucketSpan": None},
    ],
    ids=["basic", "systemTime"],
)
def test_inspect_json_gives_no_assume_same_expiry_where_it_does_not_apply(
    write_config: WriteConfig,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    changes: dict[str, str | None],
) -> None:
    owned_store(write_config(changes), "q1")
    assert main(["inspect", str(tmp_path / "out")]) == 0
    assert "assumeSameExpiry" not in capsys.readouterr().out
    assert main(["inspect", str(tmp_path / "out"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["settings"]["assume_same_expiry"] is None


def test_inspect_a_store_recorded_before_assume_same_expiry_shows_true(
    write_config: WriteConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = owned_store(write_config(), "q1")
    manifest = store.read()
    assert manifest is not None
    old = Manifest.from_bytes(manifest.to_bytes(), "test")
    old.version += 1
    store.storage.create(
        store.manifest_path(old.version), recorded_without(old, "assume_same_expiry")
    )
    assert main(["inspect", str(tmp_path / "out")]) == 0
    assert "assumeSameExpiry true" in capsys.readouterr().out
    assert main(["inspect", str(tmp_path / "out"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["settings"]["assume_same_expiry"] is True


def test_inspect_a_path_without_a_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(tmp_path)]) == 2
    assert "no dedup store at" in one_error_line(capsys)


def test_compact_help_says_what_it_works_on(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps its help to the terminal's width
    with pytest.raises(SystemExit) as exited:
        main(["compact", "--help"])
    assert exited.value.code == 0
    paragraphs = capsys.readouterr().out.split("\n\n")
    assert paragraphs[1] == (
        "Rewrite the small files of an output's port tables into fewer, larger ones: one table "
        "commit a\nport that changes no data, safe while a query writes to the ports (no Spark). "
        "It works on ports\nwritten as Delta or Iceberg tables (the sink's outputFormat=delta or "
        "iceberg; an Iceberg output in\nanother catalog than its embedded one needs --catalog). "
        "Parquet ports, the default, have no table\nlog to compact in and are refused. See the "
        "README, 'Compacting the ports'."
    )


def test_module_entry_point() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dedupsink", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0
    assert all(word in result.stdout for word in ("run", "inspect", "validate", "release"))


# -- run helpers that need no Spark -----------------------------------------------------------


def test_spark_master_precedence(
    write_config: WriteConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPARK_MASTER", raising=False)
    assert spark_master(prepare(load_config(str(write_config())))) == "local[2]"
    monkeypatch.setenv("SPARK_MASTER", "local[1]")
    assert spark_master(prepare(load_config(str(write_config())))) == "local[1]"
    configured = write_config({"spark.master": "local-cluster[2,1,1024]"})
    assert spark_master(prepare(load_config(str(configured)))) == "local-cluster[2,1,1024]"


def test_fresh_checkpoint_unless_configured(write_config: WriteConfig, tmp_path: Path) -> None:
    location, fresh = checkpoint_for(prepare(load_config(str(write_config()))))
    assert fresh and location.startswith(f"{tmp_path / 'out'}/_checkpoints/run-")
    chosen = write_config({"checkpointLocation": str(tmp_path / "chk")})
    assert checkpoint_for(prepare(load_config(str(chosen)))) == (str(tmp_path / "chk"), False)


@pytest.mark.parametrize(("batches", "said"), [(0, "0 batches"), (1, "1 batch"), (2, "2 batches")])
def test_the_run_summary_counts_batches_in_their_number(batches: int, said: str) -> None:
    windows = [WindowRecord(version=v + 1, query="q1", batch=v) for v in range(batches)]
    outcome = RunOutcome(query_id="q1", windows=windows, seconds=2.04)
    assert outcome.headline() == f"Run finished: {said} in 2.0 s (query q1)"
    outcome.interrupted = True
    assert outcome.headline().startswith(f"Run interrupted: {said} in")


def test_counted_nouns_take_their_number() -> None:
    assert [counted(n, "row") for n in (0, 1, 2)] == ["0 rows", "1 row", "2 rows"]
    assert counted(1, "window file") == "1 window file"
    assert counted(3, "remembered key") == "3 remembered keys"
    assert counted(1, "batch", 3) == "  1 batch"


def test_the_inspect_hint_gives_the_storage_options_with_secrets_as_dots() -> None:
    options = DedupOptions.parse(
        {
            "path": "s3://lake/cli",
            "fs.endpoint_url": "http://user:pass-word@127.0.0.1:9000",
            "fs.key": "AKIAEXAMPLE",
            "fs.secret": "wJalrXUtnFEMI-EXAMPLEKEY",
            "fs.anon": "false",
            "fs.region_name": "eu-west-1",
        }
    )
    assert inspect_command(options) == (
        "dedupsink inspect s3://lake/cli --fs 'endpoint_url=http://user:***@127.0.0.1:9000' "
        "--fs key=... --fs secret=... --fs anon=false --fs region_name=eu-west-1",
        ["fs.key", "fs.secret"],
    )
    # a store not under the output is named; a path with a space is quoted for the shell
    elsewhere = DedupOptions.parse({"path": "/data/my out", "storePath": "/data/store"})
    assert inspect_command(elsewhere) == (
        "dedupsink inspect '/data/my out' --store /data/store",
        [],
    )


@pytest.mark.parametrize(
    ("catalog", "shown", "hidden"),
    [
        (
            {"type": "sql", "uri": "postgresql+psycopg2://dedup:pg-Secret-1@db:5432/lake"},
            "--catalog type=sql --catalog 'uri=postgresql+psycopg2://dedup:***@db:5432/lake'",
            [],
        ),
        (
            {
                "type": "glue",
                "glue.region": "eu-west-1",
                "glue.access-key-id": "AKIAEXAMPLE",
                "glue.secret-access-key": "pg-Secret-1",
            },
            "--catalog type=glue --catalog glue.region=eu-west-1 "
            "--catalog glue.access-key-id=... --catalog glue.secret-access-key=...",
            ["iceberg.catalog.glue.access-key-id", "iceberg.catalog.glue.secret-access-key"],
        ),
    ],
    ids=["postgresql", "glue"],
)
def test_the_inspect_hint_names_the_iceberg_catalog_with_its_secrets_masked(
    catalog: dict[str, str], shown: str, hidden: list[str]
) -> None:
    """Without --catalog, inspect would look for the tables in the embedded SQLite catalog,
    which does not exist; the password in a catalog's URI and its secrets are never printed."""
    options = DedupOptions.parse(
        {
            "path": "s3://lake/out",
            "outputFormat": "iceberg",
            "iceberg.namespace": "sales",
            "iceberg.table": "orders",
            **{f"iceberg.catalog.{name}": value for name, value in catalog.items()},
        }
    )
    command, masked = inspect_command(options)
    assert command == (f"dedupsink inspect s3://lake/out {shown} --namespace sales --table orders")
    assert masked == hidden
    assert "pg-Secret-1" not in command and "AKIAEXAMPLE" not in command


def test_the_inspect_hint_of_a_run_on_s3_inspects_its_store(
    s3: S3Server, write_config: WriteConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    """The summary's Inspect: line, with the job's secrets put for its dots, runs."""
    place = s3.remote("hint")
    storage = {f"fs.{name}": value for name, value in s3.storage_options.items()}
    config = write_config({"path": place.url, **storage})
    owned_store(config, "q1")
    job = prepare(load_config(str(config)))
    lines = summary(job, RunOutcome(), released=True)
    command = next(line for line in lines if line.startswith("Inspect: "))
    assert command == (
        f"Inspect: dedupsink inspect {place.url} --fs endpoint_url={s3.endpoint_url} "
        "--fs key=... --fs secret=..."
    )
    assert lines[-1] == (
        f"         (each ... stands for the value of fs.key, fs.secret in {config})"
    )
    argv = shlex.split(command.removeprefix("Inspect: "))[1:]
    filled = [arg.replace("key=...", "key=test-key") for arg in argv]
    filled = [arg.replace("secret=...", "secret=test-secret") for arg in filled]
    assert main(filled) == 0
    assert "query q1" in capsys.readouterr().out


def test_a_fresh_checkpoint_is_local_where_spark_has_no_filesystem_for_the_output(
    write_config: WriteConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    """fsspec writes the store and the ports at memory:// or s3://, but Spark writes its
    checkpoint through Hadoop, which has no filesystem for them in a pip-installed Spark."""
    job = prepare(load_config(str(write_config({"path": "memory://dedupsink-cli/out"}))))
    location, fresh = checkpoint_for(job)
    local = Path(tempfile.gettempdir()) / "dedupsink-checkpoints"
    assert fresh and location.startswith(f"{local}/run-")
    assert all(map(spark_has_filesystem, ["/out", "file:///out", "hdfs://nn:8020/out"]))
    assert not any(map(spark_has_filesystem, ["s3://b/out", "s3a://b/out", "gs://b/out"]))
    assert main(["validate", str(write_config({"path": "memory://dedupsink-cli/out"}))]) == 0
    assert f"  checkpoint  fresh for each run, under {local}\n" in capsys.readouterr().out
    # A checkpoint configured there is Spark's to reach: validate says what it needs.
    remote = write_config({"checkpointLocation": "s3a://lake/chk"})
    assert main(["validate", str(remote)]) == 0
    assert (
        "  note        checkpointLocation s3a://lake/chk needs a Hadoop filesystem for s3a:// on "
        'Spark\'s classpath (Spark otherwise fails with: No FileSystem for scheme "s3a")'
    ) in capsys.readouterr().out.splitlines()


# -- what Spark would refuse, refused before it starts ----------------------------------------


SOURCE_FORMATS_ACCEPTED = (
    "expected a source Spark has: parquet, json, csv, orc, xml, avro, text (files), kafka, "
    "rate, rate-micro-batch, or a data source's class name such as com.example.MySource"
)


@pytest.mark.parametrize("command", ["validate", "run"])
def test_an_unknown_source_format_is_refused_naming_what_spark_has(
    command: str, write_config: WriteConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config({"source.format": "jsonl"})
    assert main([command, str(path)]) == 2
    assert one_error_line(capsys) == (
        f"dedupsink: error: {path}:2: source.format='jsonl' is invalid: "
        f"{SOURCE_FORMATS_ACCEPTED} (did you mean json?)"
    )
    assert main([command, str(path), "--set", "source.format=socket"]) == 2
    assert one_error_line(capsys) == (
        "dedupsink: error: --set source.format: source.format='socket' is invalid: "
        f"{SOURCE_FORMATS_ACCEPTED}"
    )


def test_a_source_format_is_a_short_name_in_any_case_or_a_class_name(
    write_config: WriteConfig,
) -> None:
    assert prepare(load_config(str(write_config({"source.format": "JSON"})))).source_format == (
        "json"
    )
    named = write_config({"source.format": "com.example.MySource"})
    assert prepare(load_config(str(named))).source_format == "com.example.MySource"


def test_a_checkpoint_folder_that_cannot_be_written_is_refused_naming_it(
    write_config: WriteConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "a-file"
    afile.write_text("")
    path = write_config({"checkpointLocation": str(afile / "chk")})
    assert main(["validate", str(path)]) == 2
    assert one_error_line(capsys) == (
        f"dedupsink: error: {path}:11: checkpointLocation={afile}/chk is invalid: expected a "
        f"folder Spark can write its checkpoint in: {afile} is not a folder"
    )
    # The fresh checkpoint's default follows the output: the line says what to set.
    path = write_config({"path": str(afile / "out")})
    assert main(["validate", str(path)]) == 2
    assert one_error_line(capsys) == (
        f"dedupsink: error: {path}:10: the fresh checkpoint under {afile}/out/_checkpoints "
        f"cannot be written: {afile} is not a folder; set checkpointLocation to a folder Spark "
        "can write"
    )
    # A batch job has no checkpoint to write.
    assert main(["validate", str(path), "--set", "trigger=batch"]) == 0
    capsys.readouterr()


def _refuses_new_files(folder: str) -> bool:
    try:
        with tempfile.TemporaryFile(dir=folder):
            return False
    except OSError:
        return Path(folder).is_dir()


@pytest.mark.skipif(not _refuses_new_files("/sys"), reason="needs a folder refusing new files")
def test_a_checkpoint_folder_without_permission_is_refused_naming_it(
    write_config: WriteConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config({"checkpointLocation": "/sys/dedupsink-checkpoint"})
    assert main(["run", str(path)]) == 2
    assert one_error_line(capsys) == (
        f"dedupsink: error: {path}:11: checkpointLocation=/sys/dedupsink-checkpoint is invalid: "
        "expected a folder Spark can write its checkpoint in: /sys is not writable "
        "(Permission denied)"
    )


def test_query_failure_is_one_line_with_the_dedup_error() -> None:
    spark_text = (
        "[STREAM_FAILED] Query [id = 1] terminated with exception: Job aborted\n"
        "Traceback (most recent call last):\n"
        '  File "task.py", line 3, in run_task\n'
        "dedupsink.errors.StoreOwnershipError: store /x/_store is owned by streaming query q2\n"
        "\tat org.apache.spark.api.python.BasePythonRunner...\n"
    )
    failure = failure_of(RuntimeError(spark_text))
    assert str(failure) == "StoreOwnershipError: store /x/_store is owned by streaming query q2"
    assert failure.exit_code == 1
    option = failure_of(RuntimeError("dedupsink.errors.DedupOptionError: option keys='x' ..."))
    assert option.exit_code == 2
    python = failure_of(
        RuntimeError(
            '[STREAM_FAILED] Writing job failed.\n  File "x.py", line 53\n'
            "SyntaxError: unterminated string literal\n\tat org.apache.spark.SparkException: no"
        )
    )
    assert str(python) == (
        "SyntaxError: unterminated string literal (in the streaming query: "
        "[STREAM_FAILED] Writing job failed.)"
    )
    # The sink hands its own errors to Spark as one line, after Spark's words.
    handed = failure_of(
        RuntimeError(
            "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
            "[PYTHON_DATA_SOURCE_ERROR] Failed to initialize Python data source writer: "
            "dedupsink.errors.DedupOptionError: option keys='nope' is invalid: expected columns"
            "\n SQLSTATE: 38000 SQLSTATE: XXKST\n=== Streaming Query ===\n"
        )
    )
    assert (str(handed), handed.exit_code) == (
        "DedupOptionError: option keys='nope' is invalid: expected columns",
        2,
    )
    other = failure_of(RuntimeError("\n[STREAM_FAILED] something else\nmore"))
    assert (str(other), other.exit_code) == ("[STREAM_FAILED] something else", 1)


def test_repair_rewrites_a_damaged_sink_log_entry_and_a_dry_run_only_reports_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    sink = LocalSink({"path": str(out), "keys": "id"}, pa.schema([("id", pa.int64())]))
    for batch in range(3):
        sink.window(batch, pa.table({"id": pa.array([batch, batch + 10], pa.int64())}))
    entry = out / "unique" / "_spark_metadata" / "1"
    intact = entry.read_text()
    entry.write_text(intact.replace("v1\n", "", 1))

    assert main(["repair", str(out), "--dry-run"]) == 0
    assert f"would rewrite unique log entry 1: {entry}" in capsys.readouterr().out
    assert entry.read_text() != intact
    assert main(["repair", str(out)]) == 0
    assert "rewrote unique log entry 1" in capsys.readouterr().out
    assert entry.read_text() == intact
    assert main(["repair", str(out / "_store")]) == 0
    assert "is intact" in capsys.readouterr().out


def test_inspect_json_numbers_the_last_window_as_run_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """run's batch lines, inspect's text and inspect --json call a window by one number, the
    version its commit created (a release takes a version that is no window)."""
    out = tmp_path / "out"
    sink = LocalSink({"path": str(out), "keys": "id"}, pa.schema([("id", pa.int64())]))
    sink.window(0, pa.table({"id": pa.array([1, 2], pa.int64())}))
    assert main(["release", str(out)]) == 0  # a version that is no window
    printed = io.StringIO()
    watcher = WindowWatcher(BucketStore(str(out / "_store")), printed)
    watcher.query_id = sink.query_id
    for batch in (1, 2):
        sink.start()  # a restart after the release
        sink.window(batch, pa.table({"id": pa.array([batch, 10 + batch], pa.int64())}))
    watcher.poll()
    lines = printed.getvalue().splitlines()
    # The version gap is said where the windows are printed, once, above the first.
    assert lines[0] == (
        "(window numbers are store versions: version 2 before window 3 is no window but the "
        "store's release when a run ended, so no window has that number)"
    )
    assert [line.split(":")[0] for line in lines[1:]] == [
        "batch   1 (window 3)",
        "batch   2 (window 4)",
    ]
    for line in lines[1:]:  # how long each window took: wall, its commit, its tasks
        assert re.search(
            r"\): +2 rows .*\| 1 new key, 0 forgotten \| \d+\.\d s wall \(commit \d+\.\d s\), "
            r"tasks \d+\.\d\d s$",
            line,
        ), line
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    assert "windows     3 committed; the last was window 4, batch 2" in capsys.readouterr().out
    assert main(["inspect", str(out), "--json"]) == 0
    last = json.loads(capsys.readouterr().out)["last_window"]
    # As the history's line of it: the window's number is its version there.
    assert (last["version"], last["batch_id"]) == (4, 2) and "window" not in last


def test_run_warns_when_a_window_moves_the_latest_point_beyond_the_period(
    tmp_path: Path,
) -> None:
    """maxExpiryJump is unlimited by default: a far-future row expires what came before, which
    run says once, in the window it happens; with maxExpiryJump the row is an error."""
    schema = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC"))])

    def rows(*pairs: tuple[int, str]) -> pa.Table:
        stamps = [datetime.fromisoformat(text).replace(tzinfo=UTC) for _, text in pairs]
        return pa.table([pa.array([i for i, _ in pairs], pa.int64()), pa.array(stamps)], schema)

    windows = [
        rows((1, "2014-12-31 00:00"), (2, "2014-12-31 06:00")),
        rows((3, "2014-12-31 12:00")),  # ordinary: no warning
        rows((4, "2014-12-31 13:00"), (5, "2099-01-01 00:00")),
        rows((6, "2014-12-31 14:00")),
    ]
    for jump, warnings in ((None, 1), ("30 days", 0)):
        out = tmp_path / f"out-{jump}"
        options = {"path": str(out), "keys": "id", "expiryKey": "ts", "expiryPeriod": "1 day"}
        sink = LocalSink({**options, **({"maxExpiryJump": jump} if jump else {})}, schema)
        sink.window(0, windows[0])
        printed, err = io.StringIO(), io.StringIO()
        watcher = WindowWatcher(BucketStore(str(out / "_store")), printed, err)
        watcher.query_id = sink.query_id
        reports = []
        for batch, table in enumerate(windows[1:], start=1):
            reports.append(sink.window(batch, table))
            watcher.poll()
        assert len(printed.getvalue().splitlines()) == 3
        assert len(err.getvalue().splitlines()) == warnings
        if warnings:
            assert err.getvalue() == (
                "dedupsink: warning: window 3 moved the latest point from 2014-12-31 12:00:00 "
                "UTC to 2099-01-01 00:00:00 UTC, more than expiryPeriod (24 hours): rows at or "
                "before 2098-12-31 00:00:00 UTC now go to expired/ and the keys remembered until "
                "then are forgotten; if one far-ahead row did it, set maxExpiryJump to make such "
                "rows errors\n"
            )
            assert [r.counts.expired for r in reports if r] == [0, 0, 1]  # 14:00 expired
    assert [r.counts.error for r in reports if r] == [0, 1, 0]  # 2099 beyond maxExpiryJump


def test_the_inspect_hint_calls_the_command_as_it_was_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After make run the venv is not active: the hint says .venv/bin/dedupsink, as make did;
    where dedupsink on PATH is this command, just dedupsink."""
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "dedupsink"
    script.write_text("#!/bin/sh\n", encoding="utf-8")
    script.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setattr(sys, "argv", [".venv/bin/dedupsink", "run", "job.conf"])
    assert command_name() == ".venv/bin/dedupsink"
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    assert command_name() == "dedupsink"
    monkeypatch.setattr(sys, "argv", [str(ROOT / "dedupsink" / "__main__.py"), "run"])
    assert command_name() == "dedupsink"  # python -m dedupsink
