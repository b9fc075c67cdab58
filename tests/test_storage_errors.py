"""Bad storage settings fail before any output, naming the option and the value, secrets masked.

An unknown URL scheme, a filesystem without an atomic conditional create, an endpoint where
nothing listens, wrong credentials (Azurite checks them; moto's S3 server does not), a bucket
that does not exist: each is refused when the query starts (``plan_for``, what ``streamWriter``
runs), and one of them through Spark, with the output left untouched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException
from servers import Azurite, S3Server, free_port
from streams import files_under, start_stream, write_batches

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
