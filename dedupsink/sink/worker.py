"""What the sink does to the Python process it runs in, and the one switch that turns it off.

A Spark executor runs the sink in long-lived Python workers forked from Spark's daemon; their
memory counts against the executor's overhead, and their CPU against the tasks. Three
process-wide settings keep both in check:

* **Cycle collector** (``gc.freeze``): the daemon runs a full ``gc.collect()`` after every
  call it serves. With pyspark, pyarrow and numpy loaded that walks tens of thousands of
  module-level objects each time, on cores the tasks need. Frozen, a collection walks only
  what was created since. Frozen objects are still freed by reference counting; only a
  reference cycle among them would never be collected, and the daemon has just collected when
  a call starts. Done only under Spark's daemon, never in an application's own process.
* **glibc's mmap threshold**: by default glibc raises it to the size of each large block
  freed (up to 32 MiB), so a growing bucket's arrays move onto the heap, whose freed space
  stays in the process, and the worker grows well past the bucket cache's bound. A fixed 1 MiB
  threshold returns every large array to the OS when it is freed.
* **Arrow's memory pool**: jemalloc, returning freed pages at once, instead of pyarrow's
  default mimalloc, which keeps the pages of freed buffers (Spark's incoming batches, Parquet
  pages, the port splits) in proportion to the size of a window. Unless
  ``ARROW_DEFAULT_MEMORY_POOL`` already chose a pool.

``DEDUPSINK_TUNE_PROCESS=false`` (in the executors' environment, e.g. through
``spark.executorEnv.DEDUPSINK_TUNE_PROCESS``) leaves the process as Python and pyarrow set it.
bench/RESULTS.md has the measurements behind each setting.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys

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


def tune_worker_process() -> None:
    """Apply the settings above (each call freezes what is alive now; the memory settings are
    made once a process)."""
    global _memory_bounded
    if os.environ.get(SWITCH_ENV, "true").strip().lower() == "false":
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
