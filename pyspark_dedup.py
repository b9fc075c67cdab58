"""Spark finds this top-level module on the Python path and registers ``format("dedup")``.

Spark looks for modules named ``pyspark_*`` that define ``DefaultSource``; nothing else is
needed after ``pip install dedupsink``.

On a PySpark older than 4.1 importing it raises ``PySparkVersionError``, whose one line names the
version found and the version needed; in Spark's own workers, where a failed import would only
make Spark forget the format, it defines a ``DefaultSource`` that raises the same line when
``format("dedup")`` is used (``dedupsink.sink.refused``).
"""

from pyspark.sql.datasource import DataSource

from dedupsink.errors import PySparkVersionError
from dedupsink.sink.compat import check_pyspark
from dedupsink.sink.oneline import in_spark_worker

DefaultSource: type[DataSource]
try:
    check_pyspark()
except PySparkVersionError:
    if not in_spark_worker():
        raise
    from dedupsink.sink.refused import RefusedDataSource as DefaultSource
else:
    from dedupsink.sink.datasource import DedupDataSource as DefaultSource

__all__ = ["DefaultSource"]
