"""Shared helpers of the benchmark scripts: synthetic event data, memory sampling, machine facts.

* Event data (``event_columns``, ``generate_compare_input``): UUID keys, event times, a user, an
  amount and a ~80-character payload, built column-wise with numpy and pyarrow (no Python loop
  over rows). Re-sends are copies of earlier rows, exact or (``resend_times="later"``) stamped
  with their own later send time, so the generator knows the truth: the first copy of each id
  is its unique row.
* Memory (``TreeSampler``, ``ExecutorSampler``, ``WorkerPeaks``, ``vm_hwm``): resident set sizes
  through psutil — the sum over a process and all its descendants (a Spark driver's JVM and its
  Python workers), sampled a few times a second, and the kernel's own high-water mark ``VmHWM``
  of one process.
* A long stream of keys (``KeyStreamSpec``, ``generate_key_stream``): the same rows, file by
  file from a per-file seed, cached and extended as longer runs need.
* Machine facts (``machine_facts``, ``load_average``): for the results file.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

BENCH_DIR = Path(__file__).resolve().parent
DATA_DIR = BENCH_DIR / ".data"
EPOCH_2024_US = 1_704_067_200_000_000
MICROS_PER_SECOND = 1_000_000
RESEND_TIMES = ("same", "later")
# Spark's watermark delay and dedupsink's expiryPeriod in the compare runs. Spark's
# dropDuplicatesWithinWatermark keeps a key until the watermark (max event time - delay)
# reaches its event time + delay: 2 x delay behind the max. dedupsink forgets a key when its
# value falls to the latest point - expiryPeriod, so with assumeSameExpiry=false a period of
# twice the delay remembers each key as long as Spark does.
PERIOD_S = 3600
OWN_TIME_PERIOD_S = 2 * PERIOD_S
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_ALPHABET = np.frombuffer(
    b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .", dtype=np.uint8
)
# Where the 32 hex digits of a UUID go in its 36-character text (the rest are dashes).
_UUID_DIGITS = np.array([i for i in range(36) if i not in (8, 13, 18, 23)])


# -- columns -------------------------------------------------------------------------------


def _strings(data: np.ndarray, offsets: np.ndarray) -> pa.Array:
    """A string array straight from a byte buffer and int32 offsets (no Python strings)."""
    n = len(offsets) - 1
    return pa.Array.from_buffers(
        pa.string(),
        n,
        [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data.astype(np.uint8))],
    )


def uuid_strings(rng: np.random.Generator, n: int) -> pa.Array:
    """``n`` random version-4 UUIDs as 36-character strings."""
    raw = rng.integers(0, 256, size=(n, 16), dtype=np.uint8)
    raw[:, 6] = (raw[:, 6] & 0x0F) | 0x40
    raw[:, 8] = (raw[:, 8] & 0x3F) | 0x80
    digits = np.empty((n, 32), dtype=np.uint8)
    digits[:, 0::2] = _HEX[raw >> 4]
    digits[:, 1::2] = _HEX[raw & 0x0F]
    text = np.full((n, 36), ord("-"), dtype=np.uint8)
    text[:, _UUID_DIGITS] = digits
    return _strings(text.ravel(), np.arange(n + 1, dtype=np.int64) * 36)


def random_text(rng: np.random.Generator, n: int, low: int, high: int) -> pa.Array:
    """``n`` strings of random letters, lengths uniform in ``[low, high]``."""
    lengths = rng.integers(low, high + 1, n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = _ALPHABET[rng.integers(0, len(_ALPHABET), int(offsets[-1]))]
    return _strings(data, offsets)


@functools.cache
def _user_pool(size: int) -> pa.Array:
    return pa.array([f"user-{i:06d}" for i in range(size)], type=pa.string())


def user_names(rng: np.random.Generator, n: int, pool: int = 100_000) -> pa.Array:
    """``user-000123``-style names drawn from a pool."""
    return _user_pool(pool).take(pa.array(rng.integers(0, pool, n)))


def event_columns(rng: np.random.Generator, times_us: np.ndarray) -> pa.Table:
    """One row per event time: a fresh UUID ``id``, ``event_time``, ``user``, ``amount``,
    ``payload``."""
    n = len(times_us)
    return pa.table(
        {
            "id": uuid_strings(rng, n),
            "event_time": pa.array(times_us.astype(np.int64), type=pa.timestamp("us", tz="UTC")),
            "user": user_names(rng, n),
            "amount": pa.array(np.round(rng.gamma(2.0, 40.0, n), 2)),
            "payload": random_text(rng, n, 70, 90),
        }
    )


# -- the compare input ---------------------------------------------------------------------


@dataclass(frozen=True)
class CompareSpec:
    rows: int = 2_000_000
    files: int = 40
    rows_per_second: float = 185.0
    jitter_s: float = 1.0
    resend_fraction: float = 0.10
    resend_within: int = 5_000
    late_fraction: float = 0.005
    late_min_age_s: float = 75 * 60.0
    late_max_age_s: float = 120 * 60.0
    seed: int = 20240601
    # "same": a re-send copies a row of the previous resend_within rows, its time included
    # (Assumption 1). "later": it is sent resend_min_age_s to resend_max_age_s after its
    # original and carries that send time as its event time.
    resend_times: str = "same"
    resend_min_age_s: float = 20 * 60.0
    resend_max_age_s: float = 100 * 60.0

    @property
    def key(self) -> str:
        later = "-tlater" if self.resend_times == "later" else ""
        return (
            f"compare-r{self.rows}-f{self.files}-s{self.seed}"
            f"-d{self.resend_fraction:g}-l{self.late_fraction:g}{later}"
        )


def plan_rows(
    spec: CompareSpec, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """Which original row every output position holds, and what each position is.

    Returns ``(source, kind, counts)``: ``source[p]`` indexes the table of originals, so
    ``originals.take(source)`` is the stream; ``kind[p]`` is 0 for an original, 1 for a re-send
    and 2 for a very late re-send. Regular re-sends copy an original
    from the previous ``resend_within`` rows, or with ``resend_times="later"`` one
    ``resend_min_age_s`` to ``resend_max_age_s`` of event time older than their position (as
    much as the stream before them allows); very late re-sends copy one ``late_min_age_s`` to
    ``late_max_age_s`` of event time older than their position.
    """
    n = spec.rows
    n_late = round(n * spec.late_fraction)
    n_resend = round(n * spec.resend_fraction)
    n_orig = n - n_late - n_resend
    kind = np.zeros(n, dtype=np.int8)  # 0 original, 1 re-send, 2 very late re-send
    first_late = int(spec.rows_per_second * (spec.late_max_age_s + 60)) + 1
    if n_late:
        if first_late >= n:
            raise ValueError(f"{n} rows span too little event time for very late re-sends")
        kind[rng.choice(np.arange(first_late, n), n_late, replace=False)] = 2
    later = spec.resend_times == "later"
    first_resend = int(spec.rows_per_second * spec.resend_min_age_s) + 1 if later else 1
    free = np.flatnonzero(kind == 0)
    free = free[free >= first_resend]
    kind[rng.choice(free, n_resend, replace=False)] = 1
    orig_pos = np.flatnonzero(kind == 0)
    assert len(orig_pos) == n_orig
    source = np.empty(n, dtype=np.int64)
    source[orig_pos] = np.arange(n_orig)
    resend_pos = np.flatnonzero(kind == 1)
    if later:
        oldest = np.minimum(spec.resend_max_age_s, resend_pos / spec.rows_per_second)
        age = rng.uniform(spec.resend_min_age_s, oldest)
        back = (age * spec.rows_per_second).astype(np.int64)
    else:
        back = rng.integers(1, spec.resend_within + 1, len(resend_pos))
    source[resend_pos] = np.maximum(
        np.searchsorted(orig_pos, resend_pos - back, side="right") - 1, 0
    )
    late_pos = np.flatnonzero(kind == 2)
    age = rng.uniform(spec.late_min_age_s, spec.late_max_age_s, len(late_pos))
    target = late_pos - (age * spec.rows_per_second).astype(np.int64)
    source[late_pos] = np.searchsorted(orig_pos, target, side="right") - 1
    assert (source[late_pos] >= 0).all()
    return source, kind, {"originals": n_orig, "resends": n_resend, "late": n_late}


def expected_dedup_ports(
    times_us: np.ndarray, first_copy: np.ndarray, window_rows: int, period_us: int
) -> dict[str, int]:
    """The rules of docs/SEMANTICS.md applied to the stream, windows of ``window_rows`` rows.

    ``L_N`` = max event time of windows before N, ``E_N = L_N - period``; a row with
    ``v <= E_N`` is expired; otherwise the first copy of an id is unique and any other copy a
    duplicate (a re-send carries its original's time, so an unexpired re-send's key is still
    remembered).
    """
    n = len(times_us)
    starts = np.arange(0, n, window_rows)
    window_max = np.maximum.reduceat(times_us, starts)
    latest = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(window_max)[:-1]])
    window = np.arange(n) // window_rows
    point = latest[window]
    expired = (point != np.iinfo(np.int64).min) & (times_us <= point - period_us)
    unique = first_copy & ~expired
    assert not (first_copy & expired).any(), "an original row would expire: widen the spacing"
    return {
        "unique": int(unique.sum()),
        "duplicate": int((~first_copy & ~expired).sum()),
        "expired": int(expired.sum()),
        "error": 0,
    }


def expected_own_time_ports(
    times_us: np.ndarray,
    source: np.ndarray,
    first_copy: np.ndarray,
    window_rows: int,
    period_us: int,
) -> dict[str, int]:
    """The rules of docs/SEMANTICS.md under ``assumeSameExpiry=false``, windows of
    ``window_rows`` rows.

    A row with ``v <= E_N`` is expired; otherwise a copy is a duplicate while the value its
    key is remembered with (its unique row's) is above ``E_N``, else unique, and its key is
    remembered with its own value from then on. Walks the copies in stream order (a few hundred
    thousand); first copies are unique (asserted: never expired).
    """
    n = len(times_us)
    starts = np.arange(0, n, window_rows)
    window_max = np.maximum.reduceat(times_us, starts)
    low = np.iinfo(np.int64).min
    latest = np.concatenate([[low], np.maximum.accumulate(window_max)[:-1]])
    point = latest[np.arange(n) // window_rows]
    point = np.where(point == low, low, point - period_us)
    expired = times_us <= point
    assert not (first_copy & expired).any(), "an original row would expire: widen the spacing"
    remembered = np.full(int(source.max()) + 1, low, dtype=np.int64)
    remembered[source[first_copy]] = times_us[first_copy]
    unique = int(first_copy.sum())
    duplicate = 0
    copies = np.flatnonzero(~first_copy & ~expired)
    for key, value, limit in zip(
        source[copies].tolist(), times_us[copies].tolist(), point[copies].tolist(), strict=True
    ):
        if remembered[key] > limit:
            duplicate += 1
        else:
            unique += 1
            remembered[key] = value
    return {"unique": unique, "duplicate": duplicate, "expired": int(expired.sum()), "error": 0}


def cached_input(root: Path, field: str, value: object) -> tuple[Path, dict[str, Any]] | None:
    """A generated input under ``root`` and its truth, if complete (``truth.json`` is written
    last) and made for ``value`` of ``field``; None if it must be generated."""
    truth_path = root / "truth.json"
    if not truth_path.exists():
        return None
    truth = json.loads(truth_path.read_text())
    return (root / "input", truth) if truth.get(field) == value else None


def generate_compare_input(spec: CompareSpec, window_files: int) -> tuple[Path, dict[str, Any]]:
    """The compare input directory (cached under ``bench/.data``) and its truth.

    ``truth.json`` is written last, so a directory without it is an interrupted run and is
    rebuilt.
    """
    root = DATA_DIR / spec.key
    truth_path = root / "truth.json"
    cached = cached_input(root, "window_files", window_files)
    if cached is not None:
        return cached
    started = time.perf_counter()
    rng = np.random.default_rng(spec.seed)
    source, kind, counts = plan_rows(spec, rng)
    orig_pos = np.flatnonzero(kind == 0)
    times = event_times(spec, rng, orig_pos)
    originals = event_columns(rng, times)
    stream = originals.take(pa.array(source))
    first_copy = kind == 0
    stream_times = times[source]
    if spec.resend_times == "later":
        resend_pos = np.flatnonzero(kind == 1)
        stream_times[resend_pos] = event_times(spec, rng, resend_pos)
        column = pa.array(stream_times, type=stream.schema.field("event_time").type)
        stream = stream.set_column(
            stream.schema.get_field_index("event_time"), "event_time", column
        )
    rows_per_file = -(-spec.rows // spec.files)
    window_rows = rows_per_file * window_files
    # Under Assumption 1 only: with later re-send times the default setting has no exact truth.
    ports = None
    if spec.resend_times == "same":
        ports = expected_dedup_ports(
            stream_times, first_copy, window_rows, PERIOD_S * MICROS_PER_SECOND
        )
    own_time_ports = expected_own_time_ports(
        stream_times, source, first_copy, window_rows, OWN_TIME_PERIOD_S * MICROS_PER_SECOND
    )
    input_dir = root / "input"
    write_parquet_files(stream, input_dir, rows_per_file)
    truth = {
        "spec": asdict(spec),
        "rows": spec.rows,
        "unique_ids": counts["originals"],
        **counts,
        "window_files": window_files,
        "window_rows": rows_per_file * window_files,
        "event_time_span_s": float(stream_times.max() - stream_times.min()) / MICROS_PER_SECOND,
        "expected_dedup_ports": ports,
        "expected_own_time_ports": own_time_ports,
        "generated_seconds": round(time.perf_counter() - started, 1),
    }
    truth_path.write_text(json.dumps(truth, indent=1))
    return input_dir, truth


def event_times(spec: CompareSpec, rng: np.random.Generator, positions: np.ndarray) -> np.ndarray:
    """The event time of rows sent at these stream positions, with +-``jitter_s``."""
    jitter = rng.uniform(-spec.jitter_s, spec.jitter_s, len(positions)) * MICROS_PER_SECOND
    spacing = MICROS_PER_SECOND / spec.rows_per_second
    return (EPOCH_2024_US + (positions * spacing + jitter)).astype(np.int64)


# -- a long stream of keys, file by file --------------------------------------------------------

# Every file of a key stream gets this modification time + its index: Spark's file source takes
# the oldest files first, whatever links to them.
KEY_STREAM_MTIME = 1_767_225_600  # 2026-01-01


@dataclass(frozen=True)
class KeyStreamSpec:
    """A stream of ``rows_per_file``-row Parquet files, each generated on its own from
    ``(seed, index)``, so any run reads the first N files and a longer run extends the files a
    shorter one left: compare.py's row shape (``event_columns``) at ``rows_per_second`` of event
    time, ``resend_fraction`` of each file exact re-sends of a row up to ``resend_within`` rows
    earlier in the same file (so a file's unique rows are known without reading the others)."""

    rows_per_file: int = 500_000
    rows_per_second: float = 185.0
    resend_fraction: float = 0.10
    resend_within: int = 5_000
    seed: int = 20261129

    @property
    def folder(self) -> Path:
        return DATA_DIR / (
            f"keys-b{self.rows_per_file}-s{self.seed}-d{self.resend_fraction:g}"
            f"-w{self.resend_within}-e{self.rows_per_second:g}"
        )

    def originals_per_file(self) -> int:
        return self.rows_per_file - round(self.rows_per_file * self.resend_fraction)

    def file(self, index: int) -> Path:
        return self.folder / f"part-{index:06d}.parquet"


def key_stream_file(spec: KeyStreamSpec, index: int) -> pa.Table:
    """File ``index`` of the key stream: its originals' ids are fresh UUIDs and their event
    times continue the previous file's."""
    rng = np.random.default_rng([spec.seed, index])
    shape = CompareSpec(
        rows=spec.rows_per_file,
        rows_per_second=spec.rows_per_second,
        resend_fraction=spec.resend_fraction,
        resend_within=spec.resend_within,
        late_fraction=0.0,
    )
    source, kind, _ = plan_rows(shape, rng)
    offset = index * spec.originals_per_file()
    originals = np.flatnonzero(kind == 0)
    times = event_times(shape, rng, offset + np.arange(len(originals)))
    return event_columns(rng, times).take(pa.array(source))


def generate_key_stream(spec: KeyStreamSpec, files: int) -> list[Path]:
    """The first ``files`` files of the key stream, generating those not yet cached (each is
    written under a temporary name and renamed, so a file present is complete)."""
    spec.folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(files):
        target = spec.file(index)
        if not target.exists():
            partial = target.with_suffix(".partial")
            pq.write_table(key_stream_file(spec, index), partial)
            os.utime(partial, (KEY_STREAM_MTIME + index, KEY_STREAM_MTIME + index))
            partial.rename(target)
        paths.append(target)
    return paths


def link_files(files: list[Path], folder: Path) -> None:
    """Hard links to ``files`` in ``folder``: a run's own input folder without copying."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in files:
        link = folder / path.name
        if not link.exists():
            os.link(path, link)


def drop_from_page_cache(folder: Path) -> tuple[int, int]:
    """Drop every file under ``folder`` from the OS page cache (they stay on disk); returns
    (files, bytes). Per file (``posix_fadvise``), unlike writing ``/proc/sys/vm/drop_caches``,
    which would empty the cache of everything else running on a shared machine."""
    files = size = 0
    for dirpath, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(dirpath, name)
            descriptor = os.open(path, os.O_RDONLY)
            try:
                os.fdatasync(descriptor)
                os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
                size += os.fstat(descriptor).st_size
                files += 1
            finally:
                os.close(descriptor)
    return files, size


# -- Spark ----------------------------------------------------------------------------------


def local_session_builder(app: str, conf: dict[str, str] | None = None) -> Any:
    """The benchmarks' SparkSession builder: ``local[2]``, no UI, UTC, two shuffle partitions,
    plus ``conf``."""
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for name, value in (conf or {}).items():
        builder = builder.config(name, value)
    return builder


# -- memory ----------------------------------------------------------------------------------


def vm_hwm(pid: int | None = None) -> int:
    """The peak resident set size of one process, in bytes: the kernel's ``VmHWM``, which
    psutil does not report (it has the current size only)."""
    try:
        with open(f"/proc/{os.getpid() if pid is None else pid}/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def vm_rss(pid: int | None = None) -> int:
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0


def process_tree(root: psutil.Process) -> list[psutil.Process]:
    """``root`` and every process below it.

    A child the JVM is spawning (``posix_spawn``) shares the JVM's memory until it executes its
    program; it would count the JVM twice, so a child of a ``java`` process that is ``java`` or
    has not executed its program yet (the JVM's command line, under the name of the JVM thread
    that spawns it, such as "Executor task l") is skipped.
    """
    try:
        below = root.children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = [root]
    for process in below:
        try:
            if _spawning_jvm_child(process):
                continue
        except (psutil.NoSuchProcess, psutil.AccessDenied, AttributeError):
            continue
        found.append(process)
    return found


def _spawning_jvm_child(process: psutil.Process) -> bool:
    parent = process.parent()
    if parent is None or parent.name() != "java":
        return False
    return process.name() == "java" or process.cmdline() == parent.cmdline()


# What Spark runs a Python daemon for (its worker module), by a short name. Each daemon forks
# the workers that serve that job (pyspark.worker: the tasks).
SPARK_PYTHON_JOBS = {
    "pyspark.worker": "task",
    "pyspark.sql.worker.lookup_data_sources": "lookup_data_sources",
    "pyspark.sql.worker.write_into_data_source": "write_into_data_source",
    "pyspark.sql.worker.create_data_source": "create_data_source",
    "pyspark.sql.worker.python_streaming_sink_runner": "streaming_sink_runner",
}
JVM_ROLE = "JVM"
DRIVER_ROLE = "driver (Python)"


def process_role(process: psutil.Process, root: int) -> str:
    """What a process of a local Spark job is: the driver's Python (``root``), the JVM, one of
    Spark's Python daemons (``python -m pyspark.daemon <worker module>``) or a worker it forked
    (the same command line as its parent: a fork runs no new program)."""
    if process.pid == root:
        return DRIVER_ROLE
    if process.name() == "java":
        return JVM_ROLE
    command = process.cmdline()
    if "pyspark.daemon" not in command:
        return " ".join([process.name(), *command[1:2]])
    module = command[-1] if command[-1] != "pyspark.daemon" else "pyspark.worker"
    job = SPARK_PYTHON_JOBS.get(module, module)
    parent = process.parent()
    forked = parent is not None and parent.cmdline() == command
    return f"{job} {'worker' if forked else 'daemon'}"


def python_count(roles: list[tuple[str, int]]) -> int:
    """The Python processes among a sample's roles: the driver's, Spark's daemons and their
    workers (not the JVM, nor a program the JVM runs for a moment)."""
    return sum(1 for role, _ in roles if role == DRIVER_ROLE or role.endswith(PYTHON_ROLES))


PYTHON_ROLES = (" daemon", " worker")


class TreeSampler:
    """Samples the summed ``rss`` and ``pss`` of a process tree in a background thread.

    The ``rss`` sum counts pages shared between processes (forked Python workers share their
    interpreter and modules copy-on-write) once per process, so it is an upper bound of the
    tree's footprint; the ``pss`` sum divides shared pages among their sharers and is the
    footprint. ``peak_by_name`` keeps each command name's own ``rss`` peak (``java`` is the
    driver JVM, ``python`` the driver and the Python workers together).

    ``pss`` walks a process's page tables: for a JVM with a large heap that costs real CPU, so
    it is read only every ``pss_every``-th sample (its peak may be missed by up to that
    interval); ``rss`` is cheap and read every time.

    With each ``pss`` sample it keeps every process's own ``pss`` by its role in a Spark job
    (``process_role``): ``peak_roles`` at the sample with the largest sum, ``end_roles`` at the
    last sample (``stop`` takes one), and ``peak_python``/``end_python``, the Python processes
    alive then.
    """

    def __init__(self, root: int | None = None, interval: float = 0.2, pss_every: int = 10) -> None:
        self.root = psutil.Process(root)
        self.interval = interval
        self.pss_every = pss_every
        self._samples = 0
        self.peak_total = 0
        self.peak_pss = 0
        self.peak_by_name: dict[str, int] = {}
        self.peak_roles: list[tuple[str, int]] = []
        self.end_roles: list[tuple[str, int]] = []
        self._roles: dict[tuple[int, float, str], str] = {}
        self._cpu: dict[tuple[int, float], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def start(self) -> TreeSampler:
        self._thread.start()
        return self

    def stop(self) -> TreeSampler:
        self._stop.set()
        self._thread.join()
        self.sample(with_pss=True)
        return self

    def sample(self, with_pss: bool | None = None) -> None:
        total = 0
        by_name: dict[str, int] = {}
        roles: list[tuple[str, int]] = []
        if with_pss is None:
            with_pss = self._samples % self.pss_every == 0
        self._samples += 1
        for process in process_tree(self.root):
            try:
                with process.oneshot():
                    times = process.cpu_times()
                    created = process.create_time()
                    self._cpu[(process.pid, created)] = times.user + times.system
                    rss = process.memory_info().rss
                    name = process.name()
                if with_pss:
                    role = self._role(process, created, name)
                    roles.append((role, process.memory_full_info().pss))
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            total += rss
            by_name[name] = by_name.get(name, 0) + rss
        self.peak_total = max(self.peak_total, total)
        for name, rss in by_name.items():
            self.peak_by_name[name] = max(self.peak_by_name.get(name, 0), rss)
        if with_pss:
            self._keep_pss(roles)

    def _keep_pss(self, roles: list[tuple[str, int]]) -> None:
        pss = sum(size for _, size in roles)
        if pss > self.peak_pss:
            self.peak_pss, self.peak_roles = pss, roles
        self.end_roles = roles

    def _role(self, process: psutil.Process, created: float, name: str) -> str:
        """The process's role, looked up once a program: the JVM starts as a shell script
        (``spark-class``) that executes ``java`` in the same process."""
        key = (process.pid, created, name)
        if key not in self._roles:
            self._roles[key] = process_role(process, self.root.pid)
        return self._roles[key]

    @property
    def peak_python(self) -> int:
        return python_count(self.peak_roles)

    @property
    def end_python(self) -> int:
        return python_count(self.end_roles)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def cpu_seconds(self) -> float:
        """User + system CPU of every process of the tree seen so far (call ``sample`` first).

        A process that ended between two samples loses its CPU after its last sample.
        """
        # A copy first: the sampling thread may add a process meanwhile.
        return sum(list(self._cpu.values()))


# The roles of the daemon that runs tasks (pyspark.worker) and of the workers it forks.
TASK_ROLE = SPARK_PYTHON_JOBS["pyspark.worker"] + " "


class ExecutorSampler(TreeSampler):
    """A TreeSampler that also keeps the peak of the executor-side Python processes (every
    Python process but the driver's): their summed PSS, their roles at that peak, the largest
    single one and the most alive at once; and the peak of the tasks' processes alone (the
    daemon that runs tasks and the workers it forks)."""

    def __init__(self, pss_every: int) -> None:
        super().__init__(pss_every=pss_every)
        self.peak_executor = 0
        self.peak_executor_roles: list[tuple[str, int]] = []
        self.largest_executor = 0
        self.most_executors = 0
        self.peak_tasks = 0

    def _keep_pss(self, roles: list[tuple[str, int]]) -> None:
        super()._keep_pss(roles)
        executors = self.executor_roles(roles)
        total = sum(size for _, size in executors)
        if total > self.peak_executor:
            self.peak_executor, self.peak_executor_roles = total, executors
        self.largest_executor = max([self.largest_executor, *(size for _, size in executors)])
        self.most_executors = max(self.most_executors, len(executors))
        tasks = sum(size for role, size in executors if role.startswith(TASK_ROLE))
        self.peak_tasks = max(self.peak_tasks, tasks)

    @staticmethod
    def executor_roles(roles: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """A sample's executor-side Python processes: every Python process but the driver's."""
        return [
            (role, size)
            for role, size in roles
            if role != DRIVER_ROLE and python_count([(role, size)])
        ]


class WorkerPeaks:
    """The peak resident set (``VmHWM``) of every Python process below a root, sampled while
    they live (a worker's peak is lost once it exits)."""

    def __init__(self, root: int) -> None:
        self.root = psutil.Process(root)
        self.peaks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> WorkerPeaks:
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peaks.values(), default=0)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            for process in process_tree(self.root)[1:]:
                try:
                    if process.name().startswith("python"):
                        peak = max(self.peaks.get(process.pid, 0), vm_hwm(process.pid))
                        self.peaks[process.pid] = peak
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue


@dataclass
class TimedStream:
    """A finished stream and its measures: wall time from ``start()`` to the return of
    ``awaitTermination()``, the process tree's CPU over the same span, and the progress
    reports of the micro-batches that had rows."""

    query: Any
    seconds: float
    cpu_seconds: float
    progress: list[dict[str, Any]]


def time_stream(writer: Any, sampler: TreeSampler) -> TimedStream:
    """Start ``writer``'s stream, wait for its end and measure it; ``sampler`` is stopped."""
    sampler.sample()
    cpu_before = sampler.cpu_seconds()
    started = time.perf_counter()
    query = writer.start()
    query.awaitTermination()
    seconds = time.perf_counter() - started
    sampler.stop()
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    return TimedStream(query, seconds, sampler.cpu_seconds() - cpu_before, progress)


class LoadSampler:
    """Samples the 1-minute load average every few seconds (the machine is shared)."""

    def __init__(self, interval: float = 5.0) -> None:
        self.interval = interval
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)

    def start(self) -> LoadSampler:
        self.samples.append(load_average()[0])
        self._thread.start()
        return self

    def stop(self) -> LoadSampler:
        self._stop.set()
        self._thread.join()
        self.samples.append(load_average()[0])
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.samples.append(load_average()[0])

    def summary(self) -> str:
        values = np.array(self.samples)
        return (
            f"1-min load average during the runs: min {values.min():.2f} "
            f"median {np.median(values):.2f} max {values.max():.2f} ({len(values)} samples)"
        )


# -- machine ---------------------------------------------------------------------------------


def load_average() -> tuple[float, float, float]:
    one, five, fifteen = os.getloadavg()
    return one, five, fifteen


def machine_facts() -> dict[str, str]:
    """nproc, memory, CPU model and the versions the results depend on."""
    facts = {"nproc": str(os.cpu_count()), "python": platform.python_version()}
    try:
        meminfo = Path("/proc/meminfo").read_text()
        total_kb = int(re.search(r"MemTotal:\s+(\d+)", meminfo).group(1))  # type: ignore[union-attr]
        facts["memory"] = f"{total_kb / 1024 / 1024:.1f} GiB"
        cpuinfo = Path("/proc/cpuinfo").read_text()
        model = re.search(r"model name\s*:\s*(.+)", cpuinfo)
        facts["cpu"] = model.group(1).strip() if model else platform.machine()
    except (OSError, AttributeError):
        pass
    try:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False)
        facts["java"] = java.stderr.splitlines()[0] if java.stderr else "?"
    except OSError:
        facts["java"] = "not found"
    facts["dedupsink"] = code_revision() + _where_installed()
    facts["pyspark archive bytecode"] = pyspark_archive_bytecode()
    for module in ("pyspark", "pyarrow", "numpy"):
        try:
            facts[module] = __import__(module).__version__
        except ImportError:
            facts[module] = "not installed"
    return facts


def _where_installed() -> str:
    """Where the benchmark's processes import dedupsink from, if not this checkout (a venv the
    package was installed into, maybe at another revision than the checkout's)."""
    import dedupsink

    package = Path(dedupsink.__file__).resolve().parent
    if package.is_relative_to(BENCH_DIR.parent):
        return ""
    return f" (checkout), imported from {package}"


def _git(repo: Path, *args: str) -> str:
    """Run a git command about the sink's code in ``repo`` and return its output."""
    command = ["git", "-C", str(repo), *args, "--", "dedupsink", "pyspark_dedup.py"]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()


def code_revision() -> str:
    """The last commit that changed the sink's code, and whether its working tree differs."""
    repo = BENCH_DIR.parent
    try:
        head = _git(repo, "log", "-1", "--format=%h")
        dirty = _git(repo, "status", "--porcelain")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}{' + local changes' if dirty else ''}"


def pyspark_archive_bytecode() -> str:
    """Whether Spark's Python workers import PySpark from bytecode (tools/precompile_pyspark.py,
    run by ``make install``): without it each Python process Spark starts compiles PySpark."""
    sys.path.insert(0, str(BENCH_DIR.parent / "tools"))
    from precompile_pyspark import UsageError, modules_without_bytecode, spark_python_archives

    try:
        missing = sum(modules_without_bytecode(archive) for archive in spark_python_archives())
    except UsageError:
        return "no archive"
    return "yes" if missing == 0 else f"no ({missing:,} modules without)"


def print_machine() -> None:
    facts = machine_facts()
    print("machine: " + ", ".join(f"{k}={v}" for k, v in facts.items()))
    one, five, fifteen = load_average()
    print(f"load average at start: {one:.2f} {five:.2f} {fifteen:.2f}")


def dir_bytes(path: Path) -> tuple[int, int]:
    """(files, bytes) of every regular file under ``path``."""
    files = size = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            try:
                size += os.path.getsize(os.path.join(dirpath, name))
                files += 1
            except OSError:
                pass
    return files, size


def median(values: list[float]) -> float:
    return float(np.median(np.array(values, dtype=np.float64))) if values else float("nan")


# The bare Python sink's format name, and the name it had before (older commands keep working).
BARE_SINK = "python-bare"
VARIANT_ALIASES = {"python-floor": BARE_SINK}


def variant_names(text: str) -> list[str]:
    """Comma-separated variant names, an old name replaced by its current one."""
    return [VARIANT_ALIASES.get(name, name) for name in text.split(",") if name]


def python_bare_source() -> Any:
    """The bare Python sink: it writes each task's Arrow batches once, to one Parquet file with
    dedupsink's Parquet settings, and commits nothing (no deduplication, no exactly-once): the
    ceiling of any Python sink, what Spark's Python transport alone costs, for ``df.write`` and
    ``df.writeStream`` alike. Defined here, so Spark pickles the classes by value to its
    workers."""
    import uuid

    from pyspark import TaskContext
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceStreamArrowWriter,
        WriterCommitMessage,
    )

    def copy_partition(path: str, iterator: Any) -> WriterCommitMessage:
        from dedupsink.ports.encoding import open_parquet_writer

        name = f"{path}/part-{TaskContext.get().partitionId()}-{uuid.uuid4().hex}.parquet"
        Path(path).mkdir(parents=True, exist_ok=True)
        handle, writer = None, None
        try:
            for batch in iterator:
                if writer is None:  # no file at all for a partition without rows
                    handle = open(name, "wb")  # noqa: SIM115 (closed in finally)
                    writer = open_parquet_writer(handle, batch)
                writer.write_batch(batch)
        finally:
            if writer is not None:
                writer.close()
            if handle is not None:
                handle.close()
        return WriterCommitMessage()

    class ArrowCopyStreamWriter(DataSourceStreamArrowWriter):
        def __init__(self, path: str) -> None:
            self.path = path

        def write(self, iterator: Any) -> WriterCommitMessage:
            return copy_partition(self.path, iterator)

        def commit(self, messages: Any, batchId: int) -> None:
            return None

    class ArrowCopyWriter(DataSourceArrowWriter):
        def __init__(self, path: str) -> None:
            self.path = path

        def write(self, iterator: Any) -> WriterCommitMessage:
            return copy_partition(self.path, iterator)

        def commit(self, messages: Any) -> None:
            return None

    class ArrowCopySource(DataSource):
        @classmethod
        def name(cls) -> str:
            return BARE_SINK

        def streamWriter(self, schema: Any, overwrite: bool) -> ArrowCopyStreamWriter:
            return ArrowCopyStreamWriter(self.options["path"])

        def writer(self, schema: Any, overwrite: bool) -> ArrowCopyWriter:
            return ArrowCopyWriter(self.options["path"])

    return ArrowCopySource


def write_parquet_files(stream: pa.Table, folder: Path, rows_per_file: int) -> None:
    """The stream as numbered Parquet files in ``folder`` (replacing any there), each with its
    own modification second: Spark's file source takes the oldest files first."""
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.parquet"):
        stale.unlink()
    base = int(time.time()) - 86_400
    for index, start in enumerate(range(0, stream.num_rows, rows_per_file)):
        target = folder / f"part-{index:05d}.parquet"
        pq.write_table(stream.slice(start, rows_per_file), target)
        os.utime(target, (base + index, base + index))


# -- variants in fresh processes ---------------------------------------------------------------

# A child prints its record as one JSON line after this prefix (its other output is Spark's).
RESULT_PREFIX = "RESULT "


def run_child(
    script: str,
    name: str,
    options: list[str],
    runs: Path,
    keep: bool = False,
    echo: bool = False,
) -> dict[str, Any]:
    """Run ``script`` in a fresh Python process with ``options`` and ``--work``, a folder of
    its own under ``runs`` that is also its working directory (removed after, unless
    ``keep``), and return the record it prints; a child that fails or prints none stops the
    benchmark with its output. With ``echo`` the child's other output lines are printed as
    they come (a long run's progress)."""
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    runs.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=runs))
    command = [sys.executable, str(Path(script).resolve()), *options, "--work", str(work)]
    try:
        # In its own folder: Spark starts its Python workers in the driver's working directory,
        # and from a checkout they would import the checkout's dedupsink, not the installed one.
        returncode, stdout, stderr = _run_in(command, env, work, echo)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if returncode != 0 or not lines:
        raise SystemExit(f"{name} failed ({returncode}):\n{stdout[-3000:]}\n{stderr[-6000:]}")
    return json.loads(lines[-1][len(RESULT_PREFIX) :])


def _run_in(command: list[str], env: dict[str, str], cwd: Path, echo: bool) -> tuple[int, str, str]:
    """(return code, stdout, stderr) of ``command``; with ``echo``, stdout's lines other than
    the record are printed as they come (stderr goes to a file meanwhile: a pipe nobody reads
    would fill and stall the child)."""
    if not echo:
        done = subprocess.run(
            command, env=env, cwd=cwd, capture_output=True, text=True, check=False
        )
        return done.returncode, done.stdout, done.stderr
    lines = []
    with tempfile.TemporaryFile("w+") as errors:
        with subprocess.Popen(
            command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=errors, text=True
        ) as process:
            assert process.stdout is not None
            for line in process.stdout:
                lines.append(line)
                if not line.startswith(RESULT_PREFIX):
                    print(line, end="", flush=True)
        errors.seek(0)
        return process.returncode, "".join(lines), errors.read()


def run_main(
    parser: argparse.ArgumentParser,
    child_option: str,
    child: Callable[[argparse.Namespace], None],
    orchestrate: Callable[[argparse.Namespace], None],
) -> None:
    """Parse a bench's arguments (with the hidden ``--input`` and ``--work`` its children
    get from ``run_child``) and run one child measurement, if ``child_option`` is given, or
    the whole comparison."""
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    (child if getattr(args, child_option) else orchestrate)(args)
