"""The README's listener recipe: a query's rows per port, batch by batch, from the store's history.

Spark 4.3 gives a Python sink no metrics of its own in ``lastProgress["sink"]`` (checked here,
so the README's claim fails the day it stops being true). The recipe's code is taken from the
README itself and run on a real stream of two batches; what it reports must equal what the
ports hold. Spark calls a listener on the driver apart from the query, so the test waits for
its calls on an event (bounded), not for a time.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from streams import PORT_NAMES, arrow_counts, start_stream, write_batches

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parent.parent
WAIT_SECONDS = 60


def readme_recipe() -> type:
    """The class ``DedupPortCounts`` as the README writes it (its last line, which registers
    it on the reader's session, left out)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    block = next(b for b in blocks if "class DedupPortCounts" in b)
    code, registers, _ = block.partition("\nspark.streams.addListener(")
    assert registers, "the recipe shows how to register the listener"
    scope: dict[str, Any] = {"__name__": "readme_recipe"}
    exec(compile(code, "README.md", "exec"), scope)
    recipe: type = scope["DedupPortCounts"]
    return recipe


def test_the_readme_listener_reports_each_batch_s_rows_per_port(spark: Any, workdir: Path) -> None:
    batches = [pa.table({"id": [1, 2, 2, 3]}), pa.table({"id": [1, 4, 5, 5, 5]})]
    write_batches(workdir / "in", batches)
    output = workdir / "out"
    seen: dict[int, dict[str, int]] = {}
    all_seen = threading.Event()

    class Collecting(readme_recipe()):  # type: ignore[misc]
        def report(self, progress: Any, counts: dict[str, int]) -> None:
            super().report(progress, counts)  # the recipe's own log line runs too
            seen[progress.batchId] = counts
            if len(seen) == len(batches):
                all_seen.set()

    listener = Collecting(str(output))
    spark.streams.addListener(listener)
    try:
        options = {"path": str(output), "keys": "id"}
        query = start_stream(spark, workdir / "in", options, workdir / "chk")
        query.awaitTermination()
        assert all_seen.wait(WAIT_SECONDS), f"the listener saw only batches {sorted(seen)}"
    finally:
        spark.streams.removeListener(listener)

    assert seen == {
        0: {"unique": 3, "duplicate": 1, "expired": 0, "error": 0},
        1: {"unique": 2, "duplicate": 3, "expired": 0, "error": 0},
    }
    assert arrow_counts(output) == {port: seen[0][port] + seen[1][port] for port in PORT_NAMES}
    # What Spark's own progress says of the sink: rows of all ports together, no metrics.
    sink = query.lastProgress["sink"]
    assert (sink["numOutputRows"], sink.get("metrics", {})) == (5, {})
