"""The ``dedup`` format where PySpark is older than the sink needs (4.0): found by Spark, and
refusing at its first use with the one line of ``PySparkVersionError``.

Spark 4.0 looks for the ``pyspark_*`` modules in one Python process and, when one fails to
import, drops them all with a warning in its log: the user would read only "Failed to find the
data source: dedup". So ``pyspark_dedup`` raises on import everywhere but in Spark's workers,
where it hands Spark this class instead; Spark builds it for ``format("dedup")`` (a stream, a
batch write or a read) and reports what its constructor raises.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource

from dedupsink.sink.compat import check_pyspark
from dedupsink.sink.oneline import said_in_one_line


class RefusedDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "dedup"

    def __init__(self, options: dict[str, str]) -> None:
        with said_in_one_line():
            check_pyspark()
        super().__init__(options)  # a PySpark new enough: nothing refuses
