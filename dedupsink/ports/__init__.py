"""The ports layer: where a task's port files go and how a committed window is published.

``output`` (the output root, staging, writers) and ``encoding`` (how port files are written)
serve every format; ``base.PortFormat`` is the seam, with one module per format: ``parquet``
(Parquet folders and Spark's sink log, ``sparklog``, ``repair``), ``delta`` and ``iceberg``.
It sits between the store (below) and the sink (above), and never imports pyspark.
"""
