"""A share per executor: the dedup sink on a Spark standalone cluster of two workers.

Starts a standalone master and two workers on this machine with ``spark-class`` (each worker
one core, its own work and local dirs, so each executor's state folder is its own, as on two
machines), then streams ``--windows`` files of ``--rows`` rows (random integer ids, a tenth of
each file re-sends of ids seen before) through ``format("dedup")`` in Basic Dedup
(``numBuckets=--buckets``), once with the input as read and once partitioned by
``dedupsink.partition_for_dedup`` (2 partitions). For each it prints:

* whether the ports equal the model (each id's first row unique, every other a duplicate);
* the state: the store's remembered keys x 16 bytes;
* per batch after the first, from the store's history: the largest task's load, and after the
  last batch the state the largest process maps (``state_mapped_bytes``: one Python worker per
  executor here, so per executor) and what the processes hold privately; shares are of the
  state the window's tasks read (its base: what the window before left);
* the bytes of shared copies in each executor's state folder;
* machine-readable: ``executor_share[<partitioning>]=<x>``, the state the largest executor maps
  after the last batch over the whole state (the target is at most 0.6 partitioned), and
  ``task_share[<partitioning>]=<x>``, the largest task's load of any batch over the state.

Usage: ``python bench/cluster_share.py [--rows N] [--windows N] [--buckets N]``.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

PORTS = ("unique", "duplicate", "expired", "error")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


class Cluster:
    """A standalone master and two one-core workers on 127.0.0.1, stopped on exit."""

    def __init__(self, root: Path, workers: int = 2) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen[bytes]] = []
        self.local_dirs = [root / f"worker-{i}" / "local" for i in range(workers)]
        self._start(
            "org.apache.spark.deploy.master.Master",
            ["--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(free_port())],
            root / "master.log",
        )
        self._wait_for_port(self.port)
        for i, local in enumerate(self.local_dirs):
            local.mkdir(parents=True)
            work = root / f"worker-{i}" / "work"
            args = [self.url, "--host", "127.0.0.1", "--cores", "1", "--memory", "1g"]
            args += ["--work-dir", str(work), "--webui-port", str(free_port())]
            env = {"SPARK_LOCAL_DIRS": str(local)}
            self._start(
                "org.apache.spark.deploy.worker.Worker", args, root / f"worker-{i}.log", env
            )

    def _start(
        self, main: str, args: list[str], log: Path, env: dict[str, str] | None = None
    ) -> None:
        environment = {**os.environ, **(env or {}), "SPARK_NO_DAEMONIZE": "1"}
        with open(log, "wb") as out:
            self.processes.append(
                subprocess.Popen(
                    [str(spark_class()), main, *args],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=environment,
                )
            )

    @staticmethod
    def _wait_for_port(port: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"the master did not listen on port {port}")

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()

    def folder_bytes(self) -> list[int]:
        return [
            sum(f.stat().st_size for f in local.rglob("*.keys") if f.is_file())
            for local in self.local_dirs
        ]


def make_input(folder: Path, windows: int, rows: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    folder.mkdir(parents=True)
    base = int(time.time()) - 3600
    ids_per_window: list[list[int]] = []
    for window in range(windows):
        fresh = list(range(window * rows, window * rows + rows - rows // 10))
        resent = [rng.randrange(0, window * rows + 1) for _ in range(rows // 10)]
        ids = fresh + resent
        rng.shuffle(ids)
        ids_per_window.append(ids)
        path = folder / f"batch-{window:05d}.parquet"
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), path)
        os.utime(path, (base + window, base + window))
    return ids_per_window


def expected_ports(ids_per_window: list[list[int]]) -> dict[str, Counter[int]]:
    seen: set[int] = set()
    expected: dict[str, Counter[int]] = {port: Counter() for port in PORTS}
    for ids in ids_per_window:
        for key in ids:
            expected["duplicate" if key in seen else "unique"][key] += 1
            seen.add(key)
    return expected


def run(
    spark: Any, args: argparse.Namespace, work: Path, by_key: bool, cluster: Cluster
) -> dict[str, Any]:
    import dedupsink
    from dedupsink.store.store import BucketStore

    name = "by-key" if by_key else "as-read"
    output, checkpoint = work / f"out-{name}", work / f"checkpoint-{name}"
    options = {"path": str(output), "keys": "id", "numBuckets": str(args.buckets)}
    frame = (
        spark.readStream.schema("id BIGINT")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(work / "in"))
    )
    if by_key:
        frame = dedupsink.partition_for_dedup(frame, options, partitions=2)
    started = time.perf_counter()
    query = (
        frame.writeStream.format("dedup")
        .options(**options)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - started
    got = {
        port: Counter(
            ds.dataset(str(output / port), format="parquet").to_table().column("id").to_pylist()
        )
        for port in PORTS
    }
    manifest = BucketStore(str(output / "_store")).read()
    assert manifest is not None
    state = 16 * manifest.remembered_keys
    history = dedupsink.history(str(output)).to_pylist()
    # A window's tasks read the state of its base: the keys the window before left.
    bases = [16 * row["keys_remembered"] for row in history[:-1]]
    later = history[1:]
    task_shares = [r["state_loaded_max_bytes"] / b for r, b in zip(later, bases, strict=True)]
    return {
        "partitioning": name,
        "model": got == expected_ports(args.ids),
        "rows_per_s": args.rows * args.windows / seconds,
        "state": state,
        "largest_task_load_max": max(r["state_loaded_max_bytes"] for r in later),
        "task_share_max": max(task_shares),
        "executor_share_last": later[-1]["state_mapped_bytes"] / bases[-1],
        "mapped_largest_process_last": later[-1]["state_mapped_bytes"],
        "private_all_processes_last": later[-1]["state_private_bytes"],
        "folders": cluster.folder_bytes(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--buckets", type=int, default=16)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = Path(tempfile.mkdtemp(prefix="dedup-cluster-"))
    os.chdir(work)  # the workers import the installed dedupsink, not a checkout's
    args.ids = make_input(work / "in", args.windows, args.rows, args.seed)
    cluster = Cluster(work / "cluster")
    results = []
    try:
        from pyspark.sql import SparkSession

        spark = (
            SparkSession.builder.master(cluster.url)
            .appName("bench-cluster-share")
            .config("spark.executor.cores", "1")
            .config("spark.executor.memory", "1g")
            .config("spark.cores.max", "2")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate()
        )
        for by_key in (False, True):
            for local in cluster.local_dirs:  # each run builds its executors' copies afresh
                shutil.rmtree(local / "dedupsink-state", ignore_errors=True)
            results.append(run(spark, args, work, by_key, cluster))
        spark.stop()
    finally:
        cluster.stop()
    print(
        f"{args.windows} windows of {args.rows:,} rows, numBuckets={args.buckets}, "
        "2 workers x 1 core"
    )
    for r in results:
        mb = lambda n: f"{n / 1e6:.1f} MB"  # noqa: E731
        print(
            f"{r['partitioning']:8} model={'equal' if r['model'] else 'DIFFERENT'} "
            f"{r['rows_per_s']:,.0f} rows/s | state {mb(r['state'])} | largest task's load "
            f"{mb(r['largest_task_load_max'])} | "
            f"after the last batch: largest process maps {mb(r['mapped_largest_process_last'])}, "
            f"processes hold {mb(r['private_all_processes_last'])} private | state folders "
            + ", ".join(mb(b) for b in r["folders"])
        )
    for r in results:  # shares of the state at the window's base
        print(f"executor_share[{r['partitioning']}]={r['executor_share_last']:.3f}")
        print(f"task_share[{r['partitioning']}]={r['task_share_max']:.3f}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
