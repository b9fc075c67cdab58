"""Spark Connect in the compatibility suite (the newest release only, see versions.txt): a Connect
server started from the release's own ``sbin/start-connect-server.sh`` with its Python workers
on this venv's interpreter, and a client that streams into ``format("dedup")``, restarts from
the checkpoint and reads the history, with no registration on either side."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from servers import free_port
from streams import read_port, run_stream, write_batches

pytestmark = [pytest.mark.compat, pytest.mark.spark]

OPTIONS = {"keys": "id"}


def ids(out: Path, port: str) -> list[int]:
    return sorted(read_port(out, port).column("id").to_pylist())


def events(numbers: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(numbers, pa.int64()), "body": [f"event {i}" for i in numbers]})


@pytest.fixture(scope="module")
def connect(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A session of a Connect server on 127.0.0.1 (local[2]), stopped with the module."""
    import pyspark
    from pyspark.sql import SparkSession

    home = Path(pyspark.__file__).parent
    folder = tmp_path_factory.mktemp("connect")
    port = free_port()
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_PID_DIR": str(folder),  # not the shared /tmp pid file of a server named alike
        "SPARK_LOG_DIR": str(folder),
        "PYSPARK_PYTHON": sys.executable,
    }
    command = [
        "bash",
        str(home / "sbin" / "start-connect-server.sh"),
        "--wait",  # in the foreground: this process's child, stopped by its process group
        "--master",
        "local[2]",
        "--driver-memory",
        "1g",
        *("--conf", "spark.connect.grpc.binding.address=127.0.0.1"),
        *("--conf", f"spark.connect.grpc.binding.port={port}"),
        *("--conf", "spark.ui.enabled=false"),
        *("--conf", "spark.sql.shuffle.partitions=2"),
        *("--conf", "spark.sql.session.timeZone=UTC"),
    ]
    log = (folder / "server.log").open("w")
    server = subprocess.Popen(
        command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while not listening(port):
            assert server.poll() is None, (folder / "server.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "no Connect server after 120 s"
            time.sleep(0.5)
        session = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
        yield session
        session.stop()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
        log.close()


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_a_stream_over_spark_connect_and_its_restart_give_each_row_once(
    connect: Any, tmp_path: Path
) -> None:
    out, inputs, checkpoint = tmp_path / "out", tmp_path / "in", tmp_path / "cp"
    write_batches(inputs, [events(list(range(10))), events([*range(10, 20), 3, 4])])
    run_stream(connect, inputs, out, OPTIONS, checkpoint)
    write_batches(inputs, [events([*range(20, 30), 15])], start=2)
    run_stream(connect, inputs, out, OPTIONS, checkpoint)
    assert ids(out, "unique") == list(range(30))
    assert ids(out, "duplicate") == [3, 4, 15]
    history = connect.read.format("dedup").load(str(out)).orderBy("version").collect()
    assert [(r["version"], r["batch_id"], r["duplicate"]) for r in history] == [
        (1, 0, 0),
        (2, 1, 2),
        (3, 2, 1),
    ]
