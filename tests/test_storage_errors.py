"""Bad storage settings fail before any output, naming the option and the value, secrets masked.

An unknown URL scheme, a filesystem without an atomic conditional create, an endpoint where
nothing listens, wrong credentials (Azurite checks them; moto's S3 server does not), a bucket
that does not exist: each is refused when the query starts (``plan_for``, what ``streamWriter``
runs), and one of them through Spark, with the output left untouched.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException
from servers import Azurite, S3Server, free_port
from streams import files_under, start_stream, write_batches

from dedupsink.cli.main import main
from dedupsink.errors import DedupOptionError
from dedupsink.sink.local import LocalSink

SCHEMA = pa.schema([("id", pa.int64())])
SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"


def refused(options: dict[str, str]) -> DedupOptionError:
    with pytest.raises(DedupOptionError) as caught:
        LocalSink({"keys": "id", **options}, SCHEMA).start()
    assert SECRET not in str(caught.value)
    return caught.value


def test_an_unknown_url_scheme_is_refused_naming_path() -> None:
    error = refused({"path": "nosuchfs://bucket/out"})
    assert error.option == "path" and "nosuchfs://bucket/out" in str(error)
    assert "Protocol not known: nosuchfs" in str(error)


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:1/out", "http://127.0.0.1:1/out"])
def test_a_filesystem_without_conditional_create_is_refused_naming_it(url: str) -> None:
    error = refused({"path": url})
    assert error.option == "path" and url in str(error)
    assert "offers no atomic conditional create" in str(error)
    assert "s3://" in str(error)  # what is supported


def test_a_store_path_on_such_a_filesystem_names_store_path(tmp_path: Path) -> None:
    error = refused({"path": str(tmp_path / "out"), "storePath": "ftp://127.0.0.1:1/store"})
    assert error.option == "storePath"
    assert not (tmp_path / "out").exists()


# A misspelt fs.<name> on any family: refused before the filesystem is built (no request made),
# with the closest name the filesystem's class takes.
MISSPELT = [
    ("s3://bucket/out", "endpont_url", "http://127.0.0.1:9000", "endpoint_url"),
    ("abfs://box/out", "acount_name", "devstore", "account_name"),
    ("az://box/out", "conection_string", SECRET, "connection_string"),
    ("gs://bucket/out", "endpont_url", "http://127.0.0.1:4443", "endpoint_url"),
    ("gs://bucket/out", "projet", "p", "project"),
    ("memory://out", "skip_instance_cach", "true", "skip_instance_cache"),
    ("hdfs://nn:8020/out", "hots", "nn", "host"),
]


@pytest.mark.parametrize(("url", "name", "value", "meant"), MISSPELT)
def test_a_misspelt_storage_option_gets_a_did_you_mean_on_every_family(
    url: str, name: str, value: str, meant: str
) -> None:
    error = refused({"path": url, f"fs.{name}": value})
    # where the storage is (an endpoint, an account) is shown, every other value masked
    shown = value if name in ("endpont_url", "acount_name") else "***"
    fs_class = fsspec.get_filesystem_class(url.partition("://")[0]).__name__
    assert str(error) == (
        f"option fs.{name}={shown!r} is invalid: expected a storage option {fs_class} takes: "
        f"did you mean fs.{meant}?"
    )


def test_a_misspelt_storage_option_on_the_local_disk_gets_a_did_you_mean(tmp_path: Path) -> None:
    error = refused({"path": str(tmp_path / "out"), "fs.auto_mkdri": "true"})
    assert str(error) == (
        "option fs.auto_mkdri='***' is invalid: expected a storage option LocalFileSystem "
        "takes: did you mean fs.auto_mkdir?"
    )
    error = refused({"path": str(tmp_path / "out"), "fs.colour": "blue"})
    assert str(error).endswith("LocalFileSystem takes: e.g. fs.auto_mkdir")
    assert not (tmp_path / "out").exists()


def test_the_options_each_family_takes_are_not_refused(tmp_path: Path) -> None:
    from dedupsink.store.storage import Storage

    for url, options in [
        ("s3://bucket/out", {"endpoint_url": "http://127.0.0.1:1", "key": "k", "secret": "s"}),
        ("abfs://box/out", {"account_name": "devstore", "anon": True}),
        ("gs://bucket/out", {"endpoint_url": "http://127.0.0.1:1", "token": "anon"}),
        (str(tmp_path), {"auto_mkdir": True, "skip_instance_cache": True}),
        # hdfs-native takes Hadoop settings (names with dots) as strings, connecting lazily
        ("hdfs://nn:8020/out", {"dfs.client.use.datanode.hostname": True}),
    ]:
        assert Storage.for_url(url, options).url == url


def test_an_endpoint_where_nothing_listens_is_refused_with_the_secret_masked(
    tmp_path: Path,
) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    error = refused(
        {
            "path": "s3://bucket/out",
            "fs.endpoint_url": endpoint,
            "fs.key": "AKIAEXAMPLE",
            "fs.secret": SECRET,
        }
    )
    assert error.option == "path" and "s3://bucket/out" in str(error)
    assert f"a reachable S3 endpoint: nothing answers at {endpoint}" in str(error)
    assert "AKIAEXAMPLE" not in str(error)  # the credentials are masked, the endpoint shown


@pytest.mark.parametrize("credentials", [True, False], ids=["with-credentials", "without"])
def test_a_dead_endpoint_is_said_at_once_and_before_any_word_on_credentials(
    credentials: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A refused connection is reported without the client's retries, and with no credentials
    anywhere either, the endpoint is what is wrong first."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    endpoint = f"http://127.0.0.1:{free_port()}"
    given = ["--fs", f"endpoint_url={endpoint}"]
    if credentials:
        given += ["--fs", "key=AKIAEXAMPLE", "--fs", f"secret={SECRET}"]
    started = time.monotonic()
    code = main(["inspect", "s3://bucket/out", *given])
    elapsed = time.monotonic() - started
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err == (
        "dedupsink: error: option PATH='s3://bucket/out' is invalid: expected a reachable S3 "
        f"endpoint: nothing answers at {endpoint} (fs.endpoint_url) (connection refused)\n"
    )
    assert elapsed < 2.0, elapsed  # the client's own retries take 7 to 11 seconds


def dead_azure_connection_string() -> tuple[str, str]:
    """A connection string whose Blob endpoint is a port where nothing listens, and that
    endpoint."""
    endpoint = f"http://127.0.0.1:{free_port()}"
    connection = (
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
        f"AccountKey={SECRET};BlobEndpoint={endpoint}/devstoreaccount1;"
    )
    return connection, endpoint


@pytest.mark.parametrize("route", ["option", "fsspec-config"])
def test_a_dead_blob_endpoint_in_a_connection_string_is_said_at_once(
    route: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The endpoint inside a connection string is probed as fs.endpoint_url is, whether the
    string is a storage option or comes from fsspec's own configuration (here its
    FSSPEC_ABFS_CONNECTION_STRING variable), which the filesystem reads too."""
    connection, endpoint = dead_azure_connection_string()
    options = {"path": "abfs://box/out"}
    if route == "option":
        options["fs.connection_string"] = connection
        named = "(fs.connection_string)"
    else:
        configured: dict[str, dict[str, str]] = {}
        fsspec.config.set_conf_env(configured, {"FSSPEC_ABFS_CONNECTION_STRING": connection})
        monkeypatch.setitem(fsspec.config.conf, "abfs", configured["abfs"])
        named = "(connection_string in fsspec's configuration)"
    started = time.monotonic()
    error = refused(options)
    elapsed = time.monotonic() - started
    assert error.option == "path"
    assert str(error) == (
        "option path='abfs://box/out' is invalid: expected a reachable Azure Blob endpoint: "
        f"nothing answers at {endpoint}/devstoreaccount1 {named} (connection refused)"
    )
    assert elapsed < 2.0, elapsed  # not the 5 s of waiting for a reply that never comes


def test_a_bucket_that_does_not_exist_is_refused(s3: S3Server) -> None:
    options = {f"fs.{k}": str(v) for k, v in s3.storage_options.items()}
    error = refused({"path": "s3://no-such-bucket/out", **options})
    assert error.option == "path"
    assert "'no-such-bucket' does not exist" in str(error)
    assert s3.storage_options["secret"] not in str(error)


def test_wrong_credentials_are_refused_with_the_key_masked(azure: Azurite) -> None:
    connection = azure.storage_options["connection_string"].replace(
        "AccountKey=", f"AccountKey={SECRET}X"
    )
    error = refused({"path": f"abfs://{azure.container}/out", "fs.connection_string": connection})
    assert error.option == "path"
    assert "a reachable location" in str(error) or "access denied" in str(error)
    assert "AccountKey" not in str(error)


@pytest.mark.spark
def test_through_spark_a_missing_bucket_fails_the_query_before_any_output(
    spark: Any, workdir: Path, s3: S3Server
) -> None:
    write_batches(workdir / "in", [pa.table({"id": pa.array([1, 2], pa.int64())})])
    place = s3.remote("errors")
    options = {f"fs.{k}": str(v) for k, v in s3.storage_options.items()}
    s3.reset_counts()
    query = start_stream(
        spark,
        workdir / "in",
        {"path": "s3://no-such-bucket/out", "keys": "id", **options},
        workdir / "chk",
    )
    with pytest.raises(StreamingQueryException) as caught:
        query.awaitTermination()
    message = str(caught.value)
    assert "DedupOptionError" in message and "option path='s3://no-such-bucket/out'" in message
    assert s3.storage_options["secret"] not in message
    assert {r.kind for r in s3.requests()} <= {"HEAD", "LIST", "GET", "OTHER"}  # nothing written
    assert files_under(place) == {}
