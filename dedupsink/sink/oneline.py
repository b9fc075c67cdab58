"""A dedupsink error raised in one of Spark's Python workers, handed to Spark as its one line."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from dedupsink.errors import DedupError

# Spark's Python worker reads this when it formats the error it hands to the JVM: set, it
# sends the exception's own line ("dedupsink.errors.DedupOptionError: option keys=...") instead
# of its traceback. spark.sql.execution.pyspark.udf.hideTraceback.enabled sets it for every
# Python error of a session.
_HIDE_TRACEBACK = "SPARK_HIDE_TRACEBACK"
_SPARK_WORKER_MODULES = "pyspark.sql.worker."


@contextmanager
def said_in_one_line() -> Iterator[None]:
    """Hand a dedupsink error raised while Spark plans a write or commits to Spark without its
    traceback, so its one line follows Spark's first line ("... Failed to initialize Python
    data source writer: dedupsink.errors.DedupOptionError: ..."). Other errors keep theirs.
    Set only in Spark's worker, which exits after reporting the error."""
    try:
        yield
    except DedupError:
        if in_spark_worker():
            os.environ[_HIDE_TRACEBACK] = "1"
        raise


def in_spark_worker() -> bool:
    """Whether this call runs under one of Spark's Python worker programs (the planner of a
    write, the commit runner), which format the error for the JVM and then exit."""
    frame = sys._getframe(1)
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith(_SPARK_WORKER_MODULES):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    return main is not None and main.name.startswith(_SPARK_WORKER_MODULES)
