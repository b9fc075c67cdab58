"""A streaming job the reliability tests run (and kill) in a process of its own.

Usage: ``python tests/reliability_driver.py <config.json>``, with ``$DEDUP_FAULT_CONTROL`` naming
the fault control directory (see ``tests/faults.py``) and ``tests/`` on ``PYTHONPATH``. The
test starts it with ``start_new_session=True``; the script writes its process group into the
control directory, so a fault point in the sink commit can SIGKILL the whole driver (this
Python process, its JVM and the JVM's Python workers) at an exact step.

Two engines, chosen by ``engine`` in the config:

* ``spark``: a real Structured Streaming query (``availableNow``) from a Parquet file source
  into ``format("dedupfaulty")`` (the real sink under a fault plan), with the config's master,
  checkpoint and options. Restarted with the same config it resumes from the checkpoint, as
  any Spark job would. At the end it reads every port back with ``spark.read.parquet``.
* ``direct``: the sink's own batch code without Spark's transport, for fast crash loops:
  ``DedupDataSource.streamWriter`` (exactly what Spark calls), then per input file one window:
  ``run_task`` per partition and the writer's ``commit``, and a checkpoint file written after
  the commit returns (standing in for Spark's commit log). A restart re-runs the window the
  checkpoint does not record, as Spark re-runs a batch missing from its commit log. With
  ``schema_per_file``, each file whose columns differ from the one before starts the sink anew
  with its schema (the schema tests' inputs gain a column).

With ``table_hooks`` in the config (set by ``faults.DriverProcess``, through the environment so
that Spark's Python workers see it too), Delta and Iceberg ports publish through the test
subclasses of ``tests/faults.py``, whose points sit on either side of each port's table commit.

A third engine, ``compact``, compacts the output's port tables once (``dedupsink compact``'s
code) inside the fault scope ``compact``, where the test's points strike.

The outcome goes to the config's ``result`` file as JSON: ``{"ok": true, "spark_counts": ...}``
or ``{"ok": false, "error": "..."}`` (exit status 1).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

STARTED = time.monotonic()

from faults import (  # noqa: E402
    PORTS,
    FaultyDedupDataSource,
    InProcessSink,
    control,
    fault_scope,
)


def run_spark(config: dict[str, Any]) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(config.get("master", "local[2]"))
        .appName("dedupsink-reliability")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .config("spark.sql.adaptive.enabled", "false")
        # A short-lived driver: the client compiler starts faster and is enough for tiny data.
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .getOrCreate()
    )
    print(f"session ready after {time.monotonic() - STARTED:.1f}s", file=sys.stderr, flush=True)
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(FaultyDedupDataSource)
    frame = (
        spark.readStream.schema(config["schema"])
        .option("maxFilesPerTrigger", config.get("files_per_batch", 1))
        .parquet(config["input"])
    )
    if config.get("repartition"):
        frame = frame.repartition(int(config["repartition"]))
    writer = frame.writeStream.format(config.get("format", "dedupfaulty"))
    writer = writer.option("path", config["output"])
    for key, value in config.get("options", {}).items():
        writer = writer.option(key, value)
    query = (
        writer.option("checkpointLocation", config["checkpoint"]).trigger(availableNow=True).start()
    )
    query.awaitTermination()
    print(f"query ended after {time.monotonic() - STARTED:.1f}s", file=sys.stderr, flush=True)
    result: dict[str, Any] = {"ok": True}
    if config.get("read_back"):
        local = config["read_back"]
        result["spark_counts"] = {
            port: spark.read.parquet(f"{local}/{port}").count() for port in PORTS
        }
    spark.stop()
    return result


def run_direct(config: dict[str, Any]) -> dict[str, Any]:
    import pyarrow.parquet as pq

    tables = [pq.read_table(p) for p in sorted(Path(config["input"]).glob("*.parquet"))]
    checkpoint = Path(config["checkpoint"])
    done = json.loads(checkpoint.read_text())["done"] if checkpoint.exists() else -1
    # With ``schema_per_file``, a file whose columns differ from the file's before it is read by
    # a new start of the query with that file's schema (as a user restarts a stream whose input
    # gained a column); the first start takes the schema of the first file still to run.
    per_file = bool(config.get("schema_per_file"))

    def started(schema: Any) -> InProcessSink:
        sink = InProcessSink(
            config["output"],
            config.get("options", {}),
            schema,
            config.get("query_id", "direct-query"),
        )
        sink.start()
        return sink

    sink = started(tables[min(done + 1, len(tables) - 1) if per_file else 0].schema)
    for batch_id, table in enumerate(tables):
        if batch_id <= done:
            continue
        if per_file and table.schema != sink.schema:
            sink = started(table.schema)
        sink.window(
            batch_id, table, int(config.get("partitions", 1)), int(config.get("attempt", 0))
        )
        staged = checkpoint.with_name(f".{checkpoint.name}.tmp")
        staged.write_text(json.dumps({"done": batch_id}))
        os.replace(staged, checkpoint)
    return {"ok": True}


def run_compact(config: dict[str, Any]) -> dict[str, Any]:
    from dedupsink.options import DedupOptions
    from dedupsink.ports.compaction import compact_ports
    from dedupsink.ports.formats import compactor_for, port_format

    options = DedupOptions(path=config["output"], output_format=config["options"]["outputFormat"])
    with fault_scope("compact", 0):
        done = compact_ports(compactor_for(port_format(options)), 1 << 20)
    return {"ok": True, "compactions": [[d.port, d.outcome, d.files_after] for d in done]}


ENGINES = {"spark": run_spark, "direct": run_direct, "compact": run_compact}


def main() -> int:
    config = json.loads(Path(sys.argv[1]).read_text())
    ctl = control()
    if ctl is not None:
        ctl.set_group(os.getpgid(0))
        ctl.note_process()
    try:
        result = ENGINES[config.get("engine", "spark")](config)
        status = 0
    except Exception as exc:  # the test reads the error text from the result file
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        traceback.print_exc()
        status = 1
    target = Path(config["result"])
    staged = target.with_name(f".{target.name}.tmp")
    staged.write_text(json.dumps(result))
    os.replace(staged, target)
    return status


if __name__ == "__main__":
    sys.exit(main())
