"""Spark finds this top-level module on the Python path and registers ``format("dedup")``.

Spark looks for modules named ``pyspark_*`` that define ``DefaultSource``; nothing else is
needed after ``pip install dedupsink``.
"""

from dedupsink.sink.datasource import DedupDataSource as DefaultSource

__all__ = ["DefaultSource"]
