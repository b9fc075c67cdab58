"""What the sink does to the Python process it runs in, and the one switch that turns it off.

In Spark's long-lived Python workers (forked from its daemon, counted against the executor's
memory overhead and the tasks' CPU), three process-wide settings, and one pause:

* ``gc.freeze()`` (only under Spark's daemon): its full collection after every call then skips
  the modules loaded; frozen objects are still freed by reference counting.
* glibc's mmap threshold fixed at 1 MiB, so freed large arrays go back to the OS instead of
  growing the heap past the bucket cache's bound.
* Arrow's pool: jemalloc returning freed pages at once (unless ``ARROW_DEFAULT_MEMORY_POOL``
  chose one), not mimalloc, which keeps pages in proportion to a window's size.

* the cyclic collector paused while the sink's modules are imported (``importing_in_bulk``).

``DEDUPSINK_TUNE_PROCESS=false`` in the executors' environment turns all four off.
bench/RESULTS.md, "Measurements behind design choices", has the measurements.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

# pyarrow is imported where the pool is set: the data source module imports this one, and Spark
# imports that in processes that only look the "dedup" format up (bench/RESULTS.md, "Memory as
# installed").

# Set to "off" by a driver that prints its own line per batch (``dedupsink run``): the commit's
# worker, which inherits the driver's environment, then leaves the sink's summary unprinted.
COMMIT_LOG_ENV = "DEDUPSINK_COMMIT_LOG"

SWITCH_ENV = "DEDUPSINK_TUNE_PROCESS"
_ARROW_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
_MMAP_THRESHOLD_BYTES = 1 << 20

_memory_bounded = False


def _switched_off() -> bool:
    return os.environ.get(SWITCH_ENV, "true").strip().lower() == "false"


def tune_worker_process() -> None:
    """Apply the settings above (each call freezes what is alive now; the memory settings are
    made once a process)."""
    global _memory_bounded
    if _switched_off():
        return
    if _under_sparks_daemon():
        gc.freeze()
    if not _memory_bounded:
        _memory_bounded = True
        _return_large_frees_to_the_os()
        _serve_arrow_from_jemalloc()


def _under_sparks_daemon() -> bool:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and spec.name == "pyspark.daemon"


def _return_large_frees_to_the_os() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)
    except (OSError, AttributeError):
        return  # not glibc: nothing to change


def _serve_arrow_from_jemalloc() -> None:
    import pyarrow as pa

    if not os.environ.get(_ARROW_POOL_ENV) and "jemalloc" in pa.supported_memory_backends():
        pa.set_memory_pool(pa.jemalloc_memory_pool())
        pa.jemalloc_set_decay_ms(0)


@contextmanager
def importing_in_bulk() -> Iterator[None]:
    """Pause the cyclic collector while the sink's modules are imported. The first plan in
    each of the fresh Python processes Spark starts for a query's planning and its commits
    imports some hundred modules, every object of which lives as long as the process; the
    collector would walk the growing heap some sixty times meanwhile, 13-19 ms of the first
    batch in each (bench/RESULTS.md, "The first batch's imports"; a task's imports gained
    nothing, so tasks import as they were). Reference counting still frees what is dropped;
    the collector resumes after."""
    if _switched_off() or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
