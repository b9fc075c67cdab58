"""Every storage failure a person meets is one line: from the CLI and from the sink at start.

Each family of S3 failure (no credentials, partial credentials, an endpoint where nothing
answers, a missing bucket, access denied, a misspelt ``fs.<name>``) is driven through the
``dedupsink`` commands against moto's S3 server on 127.0.0.1, and the exact line is asserted:
the option named, the endpoint shown, the secret masked, no traceback. The tests without
credentials clear the AWS environment (and the EC2 metadata lookup), so no request leaves
127.0.0.1. One Spark test checks that ``run`` says Spark's own cause, not py4j's
"An error occurred while calling oNN.load."; another that a run to S3 without a
``checkpointLocation`` keeps its fresh checkpoint on the local disk, where Spark can write it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pyarrow as pa
import pytest
import s3fs
from servers import S3Fault, S3Server, free_port

from dedupsink.cli.main import main
from dedupsink.cli.run import failure_of
from dedupsink.errors import DedupOptionError
from dedupsink.sink.local import LocalSink

ROOT = Path(__file__).resolve().parent.parent
SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
NO_CREDENTIALS = (
    "none found; set fs.key and fs.secret (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), "
    "or fs.anon=true for a public bucket"
)
JOB = """\
source.format = json
source.path = {data}
source.schema = serial BIGINT, ts TIMESTAMP
keys = serial
path = {path}
"""  # the storage options follow, from line 6 on


@pytest.fixture(autouse=True)
def no_aws_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Only the credentials a test gives: none from the environment, files or EC2 metadata."""
    for name in list(os.environ):
        if name.startswith("AWS_") and name not in ("AWS_RETRY_MODE", "AWS_MAX_ATTEMPTS"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    s3fs.S3FileSystem.clear_instance_cache()  # no client made with other settings is reused
    yield
    s3fs.S3FileSystem.clear_instance_cache()


def job(tmp_path: Path, storage: dict[str, str], path: str = "s3://dedup-tests/cli") -> str:
    """A job config writing to ``path`` with these ``fs.<name>`` options (lines 6, 7, ...)."""
    lines = "".join(f"fs.{name} = {value}\n" for name, value in storage.items())
    config = tmp_path / "job.conf"
    config.write_text(JOB.format(data=ROOT / "data" / "system-logs", path=path) + lines)
    return str(config)


def fs_args(storage: dict[str, str]) -> list[str]:
    return [arg for name, value in storage.items() for arg in ("--fs", f"{name}={value}")]


def error_line(argv: list[str], capsys: pytest.CaptureFixture[str], code: int = 2) -> str:
    """The one line ``dedupsink ARGV`` prints on stderr, checked to be the only one."""
    assert main(argv) == code
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert SECRET not in captured.err
    return lines[0]


def refused_by_sink(path: str, storage: dict[str, str]) -> str:
    """The option error the sink raises when its query starts (the same check as Spark's)."""
    options = {"keys": "id", "path": path, **{f"fs.{k}": v for k, v in storage.items()}}
    with pytest.raises(DedupOptionError) as caught:
        LocalSink(options, pa.schema([("id", pa.int64())])).start()
    message = str(caught.value)
    assert "\n" not in message and SECRET not in message
    return message


# -- credentials -------------------------------------------------------------------------------


def test_no_credentials(s3: S3Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    at = {"endpoint_url": s3.endpoint_url}
    config = job(tmp_path, at)
    accepted = f"expected S3 credentials at {s3.endpoint_url}: {NO_CREDENTIALS}"
    assert error_line(["validate", config], capsys) == (
        f"dedupsink: error: {config}:5: option path='s3://dedup-tests/cli' is invalid: {accepted}"
    )
    assert error_line(["inspect", "s3://dedup-tests/cli", *fs_args(at)], capsys) == (
        f"dedupsink: error: option PATH='s3://dedup-tests/cli' is invalid: {accepted}"
    )
    assert refused_by_sink("s3://dedup-tests/cli", at) == (
        f"option path='s3://dedup-tests/cli' is invalid: {accepted}"
    )


def test_partial_credentials(
    s3: S3Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    only_secret = {"endpoint_url": s3.endpoint_url, "secret": SECRET}
    config = job(tmp_path, only_secret)
    accepted = (
        f"expected S3 credentials at {s3.endpoint_url}: fs.secret set without fs.key; "
        "set both fs.key and fs.secret, or neither"
    )
    assert error_line(["validate", config], capsys) == (
        f"dedupsink: error: {config}:5: option path='s3://dedup-tests/cli' is invalid: {accepted}"
    )
    assert error_line(["release", "s3://dedup-tests/cli", *fs_args(only_secret)], capsys) == (
        f"dedupsink: error: option PATH='s3://dedup-tests/cli' is invalid: {accepted}"
    )
    assert refused_by_sink("s3://dedup-tests/cli", only_secret) == (
        f"option path='s3://dedup-tests/cli' is invalid: {accepted}"
    )


# -- where the storage is ------------------------------------------------------------------------


def test_an_endpoint_where_nothing_answers_is_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # a wrong port
    storage = {"endpoint_url": endpoint, "key": "test-key", "secret": SECRET}
    accepted = (
        f"expected a reachable S3 endpoint: nothing answers at {endpoint} (fs.endpoint_url) "
        "(connection refused)"
    )
    config = job(tmp_path, storage)
    assert error_line(["validate", config], capsys) == (
        f"dedupsink: error: {config}:5: option path='s3://dedup-tests/cli' is invalid: {accepted}"
    )
    assert error_line(["inspect", "s3://dedup-tests/cli", *fs_args(storage)], capsys) == (
        f"dedupsink: error: option PATH='s3://dedup-tests/cli' is invalid: {accepted}"
    )
    assert refused_by_sink("s3://dedup-tests/cli", storage) == (
        f"option path='s3://dedup-tests/cli' is invalid: {accepted}"
    )


def test_a_missing_bucket(s3: S3Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage = {"endpoint_url": s3.endpoint_url, "key": "test-key", "secret": SECRET}
    accepted = (
        "expected a URL in an existing bucket or container: 'no-such-bucket' does not exist "
        f"at {s3.endpoint_url}"
    )
    config = job(tmp_path, storage, path="s3://no-such-bucket/cli")
    assert error_line(["validate", config], capsys) == (
        f"dedupsink: error: {config}:5: option path='s3://no-such-bucket/cli' is invalid: "
        f"{accepted}"
    )
    assert error_line(["inspect", "s3://no-such-bucket/cli", *fs_args(storage)], capsys) == (
        f"dedupsink: error: option PATH='s3://no-such-bucket/cli' is invalid: {accepted}"
    )
    assert refused_by_sink("s3://no-such-bucket/cli", storage) == (
        f"option path='s3://no-such-bucket/cli' is invalid: {accepted}"
    )


def test_access_denied(s3: S3Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage = {"endpoint_url": s3.endpoint_url, "key": "test-key", "secret": SECRET}
    s3.fail(S3Fault(lambda request: True, times=1000, how="403"))
    accepted = (
        f"expected a location these credentials may use: access denied at {s3.endpoint_url} "
        "(Forbidden)"
    )
    config = job(tmp_path, storage)
    assert error_line(["validate", config], capsys) == (
        f"dedupsink: error: {config}:5: option path='s3://dedup-tests/cli' is invalid: {accepted}"
    )
    assert error_line(["repair", "s3://dedup-tests/cli", *fs_args(storage)], capsys) == (
        f"dedupsink: error: option PATH='s3://dedup-tests/cli' is invalid: {accepted}"
    )
    assert refused_by_sink("s3://dedup-tests/cli", storage) == (
        f"option path='s3://dedup-tests/cli' is invalid: {accepted}"
    )


# -- a misspelt storage option -------------------------------------------------------------------


def test_an_unknown_storage_option_gets_a_did_you_mean(
    s3: S3Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = {"endpont_url": s3.endpoint_url, "key": "test-key", "secret": SECRET}
    accepted = "expected a storage option S3FileSystem takes: did you mean fs.endpoint_url?"
    config = job(tmp_path, storage)
    assert error_line(["validate", config], capsys) == (
        f"dedupsink: error: {config}:6: option fs.endpont_url='{s3.endpoint_url}' is invalid: "
        f"{accepted}"
    )
    # --fs takes the name with or without its fs. prefix
    assert error_line(["inspect", "s3://dedup-tests/cli", "--fs", "fs.endpont_url=x"], capsys) == (
        f"dedupsink: error: option fs.endpont_url='x' is invalid: {accepted}"
    )
    assert refused_by_sink("s3://dedup-tests/cli", storage) == (
        f"option fs.endpont_url='{s3.endpoint_url}' is invalid: {accepted}"
    )
    # a misspelt secret's value stays masked; a name like none of S3's gets examples
    assert error_line(["inspect", "s3://b/o", "--fs", f"secrte={SECRET}"], capsys) == (
        "dedupsink: error: option fs.secrte='***' is invalid: expected a storage option "
        "S3FileSystem takes: did you mean fs.secret?"
    )
    assert error_line(["inspect", "s3://b/o", "--fs", "colour=blue"], capsys) == (
        "dedupsink: error: option fs.colour='***' is invalid: expected a storage option "
        "S3FileSystem takes: e.g. fs.endpoint_url, fs.key, fs.secret"
    )


@pytest.mark.parametrize(
    ("path", "given", "meant"),
    [
        ("abfs://box/cli", "acount_name=devstore", "account_name"),
        ("az://box/cli", f"acount_key={SECRET}", "account_key"),
        ("gs://dedup-tests/cli", "endpont_url=http://127.0.0.1:1", "endpoint_url"),
        ("gs://dedup-tests/cli", "tokn=anon", "token"),
    ],
)
def test_an_unknown_storage_option_on_azure_or_gcs_gets_a_did_you_mean(
    path: str, given: str, meant: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before the filesystem is built: no request is made, no server needed."""
    name, _, value = given.partition("=")
    shown = value if name in ("acount_name", "endpont_url") else "***"
    fs_class = fsspec.get_filesystem_class(path.partition("://")[0]).__name__
    accepted = f"expected a storage option {fs_class} takes: did you mean fs.{meant}?"
    assert error_line(["inspect", path, "--fs", given], capsys) == (
        f"dedupsink: error: option fs.{name}={shown!r} is invalid: {accepted}"
    )
    config = job(tmp_path, {name: value}, path=path)
    assert error_line(["validate", config], capsys) == (
        f"dedupsink: error: {config}:6: option fs.{name}={shown!r} is invalid: {accepted}"
    )
    assert refused_by_sink(path, {name: value}) == (
        f"option fs.{name}={shown!r} is invalid: {accepted}"
    )


# -- Spark's own cause ---------------------------------------------------------------------------


class FakeJava:
    """A Java exception as py4j shows it: a class, a message, a cause."""

    def __init__(self, name: str, message: str | None, cause: FakeJava | None = None) -> None:
        self.name, self.message, self.cause = name, message, cause

    def getClass(self) -> FakeJava:  # Java's names
        return self

    def getName(self) -> str:
        return self.name

    def getMessage(self) -> str | None:
        return self.message

    def getCause(self) -> FakeJava | None:
        return self.cause


class FakePy4JJavaError(Exception):
    def __init__(self, call: str, java: FakeJava) -> None:
        super().__init__(f"An error occurred while calling {call}.\n: {java.name}: ...")
        self.java_exception = java


@pytest.mark.parametrize(
    ("java", "said"),
    [
        (
            FakeJava(
                "org.apache.spark.SparkClassNotFoundException",
                "[DATA_SOURCE_NOT_FOUND] Failed to find the data source: jsonl. SQLSTATE: 42K02",
                FakeJava("java.lang.ClassNotFoundException", "jsonl.DefaultSource"),
            ),
            "[DATA_SOURCE_NOT_FOUND] Failed to find the data source: jsonl. SQLSTATE: 42K02",
        ),
        (
            FakeJava(
                "org.apache.hadoop.fs.UnsupportedFileSystemException",
                'No FileSystem for scheme "s3"\n\tat org.apache.hadoop.fs.FileSystem...',
            ),
            'UnsupportedFileSystemException: No FileSystem for scheme "s3"',
        ),
    ],
)
def test_a_py4j_error_is_said_in_the_jvm_s_words(java: FakeJava, said: str) -> None:
    assert str(failure_of(FakePy4JJavaError("o34.load", java))) == said


@pytest.mark.spark
@pytest.mark.slow  # a `dedupsink run` of its own: 11 s
def test_run_says_spark_s_cause(tmp_path: Path) -> None:
    """A source Spark cannot load (Kafka's package is not on the classpath): once the config
    passes, only Spark can tell."""
    config = tmp_path / "kafka.conf"
    config.write_text(
        "source.format = kafka\n"
        "source.option.kafka.bootstrap.servers = 127.0.0.1:9\n"
        "source.option.subscribe = events\n"
        f"keys = key\npath = {tmp_path / 'out'}\n"
        "spark.ui.enabled = false\n"
        "spark.driver.extraJavaOptions = -XX:TieredStopAtLevel=1 -XX:+UseSerialGC\n"
    )
    result = run_in_a_process(config)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("dedupsink:")]
    assert errors == [
        "dedupsink: error: [KAFKA_DATA_SOURCE_NOT_ENABLED] Failed to find data source: kafka. "
        "Please deploy the application as per the deployment section of Structured Streaming + "
        "Kafka Integration Guide. SQLSTATE: 42K02"
    ], result.stderr
    assert "Traceback" not in result.stderr and "An error occurred while calling" not in (
        result.stderr
    )


# -- a checkpoint Spark can write ----------------------------------------------------------------


def test_validate_puts_the_fresh_checkpoint_of_an_s3_output_on_the_local_disk(
    s3: S3Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Spark writes its checkpoint through Hadoop, which has no filesystem for s3:// (nor, in a
    pip-installed Spark, for s3a://): under the output, the run would fail with 'No FileSystem
    for scheme "s3"'."""
    config = job(tmp_path, {**s3.storage_options, "secret": SECRET})
    assert main(["validate", config]) == 0
    lines = capsys.readouterr().out.splitlines()
    local = Path(tempfile.gettempdir()) / "dedupsink-checkpoints"
    assert f"  checkpoint  fresh for each run, under {local}" in lines
    assert "  output      s3://dedup-tests/cli" in lines


@pytest.mark.slow  # a whole Spark in a process of its own, about 40 s
@pytest.mark.spark
def test_a_run_to_s3_without_a_checkpoint_location_runs(s3: S3Server, tmp_path: Path) -> None:
    output = s3.remote("cli")
    storage = {**s3.storage_options, "secret": SECRET}
    config = Path(job(tmp_path, storage, path=output.url))
    config.write_text(
        config.read_text()
        + "spark.ui.enabled = false\n"
        + "spark.driver.extraJavaOptions = -XX:TieredStopAtLevel=1 -XX:+UseSerialGC\n"
    )
    result = run_in_a_process(config)
    assert result.returncode == 0, result.stderr
    assert "Run finished:" in result.stdout and SECRET not in result.stdout + result.stderr
    written = {name.rsplit("/", 1)[-1] for name in output.fs().ls(output.url, detail=False)}
    assert "unique" in written and "_checkpoints" not in written


def run_in_a_process(config: Path) -> subprocess.CompletedProcess[str]:
    """``dedupsink run CONFIG`` in a fresh process, as a user starts it."""
    return subprocess.run(
        [sys.executable, "-m", "dedupsink", "run", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
