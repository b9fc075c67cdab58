"""``dedupsink run``: start a job's streaming query, report each batch, summarise, release.

The CLI follows the query through the store, not Spark callbacks: between
``awaitTermination(timeout)`` calls it prints a line per manifest this query committed. Ctrl-C
stops the query between batches (twice: at once); at the end the owner lease is released.
Without ``checkpointLocation`` each run gets a fresh checkpoint (``job.checkpoint_for``),
removed at the end: the source is read again, while the store remembers the keys.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from dedupsink.cli.config import SOURCE_PATH
from dedupsink.cli.display import counted, table
from dedupsink.cli.inspect import catalog_lines
from dedupsink.cli.job import FIXED_SCHEMAS, PreparedJob, checkpoint_for, spark_has_filesystem
from dedupsink.cli.sparkhome import SPARK_HOME_ENV, compiled_spark_home
from dedupsink.engine.classify import PORTS
from dedupsink.engine.settings import TIME_BUCKET_MODES, human_span
from dedupsink.errors import DedupError, StoreError
from dedupsink.inspection.points import point_text
from dedupsink.masking import catalog_secrets, mask_values, storage_secrets, url_password
from dedupsink.options import (
    ICEBERG_CATALOG_PREFIX,
    STORAGE_OPTION_PREFIX,
    DedupOptions,
    bool_text,
    default_store_path,
)
from dedupsink.ports.formats import port_format
from dedupsink.sink.partitioning import partition_for_dedup
from dedupsink.sink.worker import COMMIT_LOG_ENV
from dedupsink.store.format import Manifest
from dedupsink.store.ownership import BATCH_WRITE_PREFIX, release
from dedupsink.store.records import WindowCounts, WindowRecord
from dedupsink.store.storage import Storage
from dedupsink.store.storage import parent as storage_parent
from dedupsink.store.store import BucketStore
from dedupsink.units import human_bytes

log = logging.getLogger("dedupsink.cli")

MASTER_DEFAULT = "local[2]"
MASTER_ENV = "SPARK_MASTER"
POLL_SECONDS = 0.5
SECRET_PLACEHOLDER = "..."  # a storage option's value in the Inspect: hint that may be a secret
SPARK_DEFAULTS = {"spark.ui.showConsoleProgress": "false"}
_OPTION_ERRORS = ("DedupOptionError", "StoreSettingsError", "UnsupportedKeyType")
# A dedupsink error at a line's start (in a traceback), or after Spark's words when the sink
# handed it over as its one line ("... Python data source writer: dedupsink.errors.X: ...").
_DEDUP_ERROR_LINE = re.compile(r"(?m)(?:^\s*|: )dedupsink\.[\w.]+?\.(\w+): (.+)$")
_PYTHON_ERROR_LINE = re.compile(r"(?m)^\s*((?:[a-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)): (.+)$")
_JVM_PACKAGES = ("org.", "java.", "javax.", "scala.", "py4j.", "com.")
_LOG4J = """\
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{HH:mm:ss}} %p %c{{1}}: %m%n
"""


class QueryFailed(DedupError):
    """The streaming query failed; the message is the root cause in one line."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        self.exit_code = exit_code
        super().__init__(message)


@dataclass
class RunOutcome:
    """What one run did: its query, the windows it committed, how it ended."""

    query_id: str = ""
    windows: list[WindowRecord] = field(default_factory=list)
    interrupted: bool = False
    seconds: float = 0.0

    def headline(self) -> str:
        """The summary's first line: how the run ended, its batches, its time and its query."""
        state = "interrupted" if self.interrupted else "finished"
        return (
            f"Run {state}: {counted(len(self.windows), 'batch')} in {self.seconds:.1f} s "
            f"(query {self.query_id or '-'})"
        )


# -- the Spark session ------------------------------------------------------------------------


def spark_master(job: PreparedJob) -> str:
    """``spark.master`` from the config, else ``$SPARK_MASTER``, else ``local[2]``."""
    return job.config.spark_conf.get("spark.master") or os.environ.get(MASTER_ENV) or MASTER_DEFAULT


def _quiet_log_config(level: str, folder: Path) -> str:
    path = folder / "log4j2.properties"
    path.write_text(_LOG4J.format(level=level), encoding="utf-8")
    return f"-Dlog4j2.configurationFile=file:{path}"


@contextmanager
def spark_session(job: PreparedJob, log_level: str) -> Iterator[Any]:
    """A SparkSession for the job (workers run this interpreter), stopped on exit."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    home = compiled_spark_home()
    if home is not None:
        os.environ[SPARK_HOME_ENV] = str(home)  # this run's Spark only: see cli/sparkhome.py
    # The commit's worker inherits this: run prints its own line per batch, not the sink's too.
    os.environ[COMMIT_LOG_ENV] = "off"
    conf = {**SPARK_DEFAULTS, **job.config.spark_conf}
    conf.pop("spark.master", None)
    with tempfile.TemporaryDirectory(prefix="dedupsink-") as scratch:
        java_options = conf.get("spark.driver.extraJavaOptions", "")
        if "log4j2.configurationFile" not in java_options:
            quiet = _quiet_log_config(log_level, Path(scratch))
            conf["spark.driver.extraJavaOptions"] = f"{java_options} {quiet}".strip()
        builder = SparkSession.builder.master(spark_master(job))
        builder = builder.appName(conf.pop("spark.app.name", f"dedupsink {job.config.name}"))
        for key, value in conf.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel(log_level)
        try:
            yield session
        finally:
            session.stop()


# -- the query -------------------------------------------------------------------------------


def source_frame(reader: Any, job: PreparedJob) -> Any:
    """The job's source through ``reader`` (``spark.read`` or ``spark.readStream``)."""
    reader = reader.format(job.source_format)
    if job.schema is not None and job.source_format not in FIXED_SCHEMAS:
        reader = reader.schema(job.schema)
    reader = reader.options(**job.config.source_options)
    path = job.config.get(SOURCE_PATH)
    return reader.load(path) if path else reader.load()


def start_query(spark: Any, job: PreparedJob, checkpoint: str) -> Any:
    frame = partition_for_dedup(source_frame(spark.readStream, job), job.config.sink_options)
    writer = frame.writeStream.format("dedup").options(**job.config.sink_options)
    writer = writer.option("checkpointLocation", checkpoint)
    trigger = job.trigger
    if trigger.kind == "availableNow":
        writer = writer.trigger(availableNow=True)
    elif trigger.kind == "once":
        writer = writer.trigger(once=True)
    else:
        writer = writer.trigger(processingTime=f"{trigger.interval_ms} milliseconds")
    return writer.start()


def write_batch(spark: Any, job: PreparedJob) -> None:
    """A batch job: the source read once with ``spark.read`` and written as one window."""
    frame = partition_for_dedup(source_frame(spark.read, job), job.config.sink_options)
    frame.write.format("dedup").options(**job.config.sink_options).mode("append").save()


def failure_of(exc: Exception) -> QueryFailed:
    """The root cause of a Spark failure in one line: a dedupsink error when there is one, else
    the Python error of the failed task, else Spark's own words (its error class and message,
    not py4j's "An error occurred while calling o34.load.")."""
    text = str(exc)
    found = _DEDUP_ERROR_LINE.findall(text)
    if found:
        name, message = found[-1]
        return QueryFailed(f"{name}: {message.strip()}", 2 if name in _OPTION_ERRORS else 1)
    first = java_cause(exc) or _first_line(text) or type(exc).__name__
    python = [m for m in _PYTHON_ERROR_LINE.findall(text) if not m[0].startswith(_JVM_PACKAGES)]
    if python:
        name, message = python[-1]
        return QueryFailed(f"{name}: {message.strip()} (in the streaming query: {first})")
    return QueryFailed(first)


def java_cause(exc: Exception) -> str | None:
    """What the JVM said, in one line, for a py4j error that PySpark did not convert (its text
    starts "An error occurred while calling oNN.method."): of the Java exception and its
    causes, the first with an error class (``[DATA_SOURCE_NOT_FOUND] ...``), else the first
    with a message, named by its class (``UnsupportedFileSystemException: No FileSystem for
    scheme "s3"``)."""
    from py4j.protocol import Py4JError

    chain: list[tuple[str, str]] = []  # (class name, first line of the message)
    java = getattr(exc, "java_exception", None)
    try:
        while java is not None and len(chain) < 16:
            chain.append((str(java.getClass().getName()), _first_line(str(java.getMessage()))))
            java = java.getCause()
    except Py4JError:  # the gateway is gone: Spark's text names the Java exception too
        chain = []
    if not chain:
        lines = [line[2:] for line in str(exc).splitlines() if line.startswith(": ")]
        chain = [(name, message.strip()) for name, _, message in (x.partition(": ") for x in lines)]
    chain = [(name, message) for name, message in chain if message and message != "None"]
    classified = next((message for _, message in chain if message.startswith("[")), None)
    if classified is not None:
        return classified
    if chain:
        name, message = chain[0]
        return f"{name.rsplit('.', 1)[-1]}: {message}"
    return None


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


class WindowWatcher:
    """Reads the manifests committed since the last look and prints this query's windows."""

    def __init__(self, store: BucketStore, out: TextIO, err: TextIO | None = None) -> None:
        self.store = store
        self.out = out
        self.err = err
        versions = store.versions()
        self.seen = versions[-1] if versions else -1
        start = store.read(self.seen) if versions else None
        self.latest = None if start is None else start.latest  # the latest point seen last
        self.gap = _versions_after_last_window(start)  # told before this run's first window
        self.query_id = ""
        self.batch = False  # a batch job: its write's id is learnt from the window it commits
        self.windows: list[WindowRecord] = []

    def poll(self) -> None:
        for version in [v for v in self.store.versions() if v > self.seen]:
            manifest = self.store.read(version)
            self.seen = version
            if manifest is not None:
                self._report(manifest)
                self.latest = manifest.latest

    def _report(self, manifest: Manifest) -> None:
        window = manifest.last_window
        if window is None or window.version != manifest.version:
            return
        ours = window.query == self.query_id or (
            self.batch and not self.query_id and window.query.startswith(BATCH_WRITE_PREFIX)
        )
        if not ours:
            return
        self.query_id = window.query
        if not self.windows and self.gap:
            print(_gap_text(self.gap, window.version), file=self.out, flush=True)
        self.windows.append(window)
        ports = "  ".join(f"{port} {window.counts[port]:>4}" for port in PORTS)
        state = f"{counted(window.new_keys, 'new key')}, {window.dropped_keys} forgotten"
        if manifest.settings.mode == "sequence":
            state = counted(window.new_keys, "new producer")
        print(
            f"batch {window.batch:>3} (window {window.version}): "
            f"{counted(window.counts.total, 'row', 5)}  {ports}  | {state}{_times_text(window)}",
            file=self.out,
            flush=True,
        )
        warning = jump_warning(manifest, self.latest)
        if warning is not None:
            print(f"dedupsink: warning: {warning}", file=self.err or sys.stderr, flush=True)


def _versions_after_last_window(start: Manifest | None) -> list[int]:
    """The store's versions after its last window, when a run starts: versions that are no
    window (a release at the end of a run, the store's creation), which the window numbers
    skip."""
    if start is None:
        return []
    last = start.last_window
    first = 0 if last is None else last.version + 1
    return list(range(first, start.version + 1))


def _gap_text(gap: list[int], first_window: int) -> str:
    """Why this run's first window number is not one after the last window before it."""
    versions = f"version {gap[0]}" if len(gap) == 1 else f"versions {gap[0]}-{gap[-1]}"
    what = "the store's creation" if gap == [0] else "the store's release when a run ended"
    return (
        f"(window numbers are store versions: {versions} before window {first_window} "
        f"{'is' if len(gap) == 1 else 'are'} no window but {what}, so no window has "
        f"{'that number' if len(gap) == 1 else 'those numbers'})"
    )


def _times_text(window: WindowRecord) -> str:
    """How long the window took: wall time from its first task's start to its commit point,
    the commit's share of it, and its tasks' seconds summed."""
    if window.wall_seconds is None:
        return ""
    return (
        f" | {window.wall_seconds:.1f} s wall (commit {window.commit_seconds or 0:.1f} s), "
        f"tasks {window.task_seconds:.2f} s"
    )


def jump_warning(manifest: Manifest, before: float | None) -> str | None:
    """What to say when a window moved the latest point by more than the expiry period
    (``tupleTime``, ``ordered``): every key remembered before it is forgotten and older rows
    expire, which one far-future row does; None for an ordinary window."""
    settings = manifest.settings
    period, after = settings.period, manifest.latest
    if settings.mode not in TIME_BUCKET_MODES or period is None:
        return None
    if before is None or after is None or after - before <= period:
        return None
    expiry = settings.expiry_point(after)
    categories = manifest.categories
    return (
        f"window {manifest.version} moved the latest point from "
        f"{point_text(before, settings, categories)} to {point_text(after, settings, categories)}, "
        f"more than expiryPeriod ({human_span(period, settings.mode)}): rows at or before "
        f"{point_text(expiry, settings, categories)} now go to expired/ and the keys remembered "
        "until then are forgotten; if one far-ahead row did it, set maxExpiryJump to make such "
        "rows errors"
    )


class Stopper:
    """Ctrl-C asks for a stop between batches; a second Ctrl-C asks for it at once."""

    def __init__(self) -> None:
        self.requested = False
        self.urgent = False
        self.announced = False
        self._previous: Any = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            self.urgent = True
        self.requested = True

    def __enter__(self) -> Stopper:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def follow(query: Any, watcher: WindowWatcher, stopper: Stopper) -> None:
    """Wait for the query to end, printing windows as they commit; stop it on request."""
    while True:
        finished = query.awaitTermination(POLL_SECONDS)
        watcher.poll()
        if finished:
            return
        if stopper.requested and not stopper.announced:
            stopper.announced = True
            print(
                "stopping after the current batch (Ctrl-C again to stop now)",
                file=sys.stderr,
                flush=True,
            )
        if stopper.requested and (stopper.urgent or not query.status["isTriggerActive"]):
            query.stop()


# -- checkpoint, lease, summary ---------------------------------------------------------------


def remove_checkpoint(url: str, storage_options: dict[str, object]) -> None:
    """Remove a fresh checkpoint, then the folder of checkpoints if that leaves it empty."""
    storage = Storage.for_url(url, storage_options)
    storage.delete_folder(storage.root)  # its name taken literally, with the output's options
    parent = storage_parent(storage.root)
    with suppress(FileNotFoundError, OSError):
        if not storage.fs.ls(parent, detail=False):
            storage.fs.rmdir(parent)


def release_lease(store: BucketStore, query_id: str) -> bool:
    if not query_id:
        return False
    try:
        return release(store, query_id) is not None
    except StoreError as exc:
        log.warning("owner lease not released: %s", exc)
        return False


def summary(job: PreparedJob, outcome: RunOutcome, released: bool) -> list[str]:
    store = job.store
    manifest = store.read()
    totals = manifest.totals.counts if manifest else WindowCounts()
    this_run = {port: sum(w.counts[port] for w in outcome.windows) for port in PORTS}
    ports = port_format(job.options)
    rows = [[port, this_run[port], totals[port], ports.address(port)] for port in PORTS]
    rows.append(["total", sum(this_run.values()), totals.total, ""])
    lines = [
        "",
        outcome.headline(),
        *table(["port", "this run", "all runs", ports.address_heading], rows),
    ]
    catalog = ports.catalog_info()
    if catalog is not None:
        lines += catalog_lines(catalog, "Catalog: ")
    lines += _store_lines(store, manifest)
    lines.append(
        "Owner lease released: the next run can start at once."
        if released
        else "Owner lease not released (see above)."
    )
    command, hidden = inspect_command(job.options, command_name())
    lines.append(f"Inspect: {command}")
    if hidden:
        names = ", ".join(hidden)
        lines.append(f"         (each ... stands for the value of {names} in {job.config.origin})")
    return lines


def command_name() -> str:
    """How to call this command again: ``dedupsink`` where that name finds it on PATH, else the
    path it was started by (``.venv/bin/dedupsink`` from ``make run``, the venv not active)."""
    started = sys.argv[0] if sys.argv else ""
    if os.path.basename(started) != "dedupsink":  # python -m dedupsink, or a test
        return "dedupsink"
    found = shutil.which("dedupsink")
    if found is not None and os.path.realpath(found) == os.path.realpath(started):
        return "dedupsink"
    return shlex.quote(started)


def inspect_command(options: DedupOptions, program: str = "dedupsink") -> tuple[str, list[str]]:
    """The ``dedupsink inspect`` command for the job's store and port tables, and the options
    whose values it hides: the output path, ``--store`` when the store is not the default one,
    ``--fs NAME=VALUE`` for each storage option the job used, and for Iceberg ports in a catalog
    of their own ``--catalog PROPERTY=VALUE``, ``--namespace`` and ``--table`` (without them
    ``inspect`` would look in the embedded catalog, which has no such tables). A value is shown
    where it says where things are (an endpoint, a region, a catalog's URI; a password in a URL
    masked) and is ``...`` where it may be a secret."""
    words = [program, "inspect", shlex.quote(options.path)]
    if options.store_path != default_store_path(options.path):
        words += ["--store", shlex.quote(options.store_path)]
    given: list[tuple[str, str, str, object, Sequence[object]]] = [
        ("--fs", STORAGE_OPTION_PREFIX, name, value, storage_secrets({name: value}))
        for name, value in options.storage_options.items()
    ]
    given += [
        ("--catalog", ICEBERG_CATALOG_PREFIX, name, value, catalog_secrets({name: value}))
        for name, value in options.iceberg_catalog.items()
    ]
    hidden: list[str] = []
    for flag, prefix, name, value, secrets in given:
        text = bool_text(value) if isinstance(value, bool) else str(value)  # true/false: shown
        if text in [str(secret) for secret in secrets]:
            text = SECRET_PLACEHOLDER
            hidden.append(prefix + name)
        else:
            text = mask_values(text, [*secrets, url_password(text)])  # a password in a URL
        words += [flag, shlex.quote(f"{name}={text}")]
    for flag, table_name in (
        ("--namespace", options.iceberg_namespace),
        ("--table", options.iceberg_table),
    ):
        if table_name is not None:
            words += [flag, shlex.quote(table_name)]
    return " ".join(words), hidden


def _store_lines(store: BucketStore, manifest: Manifest | None) -> list[str]:
    if manifest is None:
        return [f"Store {store.url}: empty"]
    files, nbytes = store.disk_usage()
    kept = "producer" if manifest.settings.mode == "sequence" else "remembered key"
    expired = manifest.expired_unfolded_keys
    awaiting = f" (and {counted(expired, 'expired key')} awaiting fold)" if expired else ""
    lines = [
        f"Store {store.url}: {counted(manifest.remembered_keys, kept)}{awaiting}; on disk "
        f"{counted(files, 'window file')}, {human_bytes(nbytes)}"
    ]
    settings = manifest.settings
    if settings.mode != "basic" and manifest.latest is not None and settings.period is not None:
        latest = point_text(manifest.latest, settings, manifest.categories)
        point = settings.expiry_point(manifest.latest)
        expiry = point_text(point, settings, manifest.categories)
        lines.append(f"Latest point {latest}; expiry point {expiry}")
    return lines


def run_query(spark: Any, job: PreparedJob, checkpoint: str, watcher: WindowWatcher) -> bool:
    """Start the query and follow it to its end; True if Ctrl-C stopped it."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    query = None
    try:
        if job.trigger.kind == "batch":
            watcher.batch = True
            write_batch(spark, job)
            return False
        query = start_query(spark, job, checkpoint)
        watcher.query_id = str(query.id)
        with Stopper() as stopper:
            follow(query, watcher, stopper)
        return stopper.requested
    except (PySparkException, Py4JError) as exc:
        raise failure_of(exc) from exc
    finally:
        if query is not None and query.isActive:
            query.stop()
        watcher.poll()


def run(job: PreparedJob, out: TextIO, log_level: str = "ERROR") -> int:
    """Run a prepared job to its end (or Ctrl-C), release the store, print the summary."""
    checkpoint, fresh = checkpoint_for(job)
    fresh = fresh and job.trigger.kind != "batch"  # a batch job has no checkpoint
    outcome = RunOutcome()
    watcher = WindowWatcher(job.store, out)
    started = time.monotonic()
    print(f"{job.config.origin}: {job.source_format} -> {job.options.path}", file=out, flush=True)
    try:
        with spark_session(job, log_level) as spark:
            outcome.interrupted = run_query(spark, job, checkpoint, watcher)
    finally:
        outcome.query_id = watcher.query_id
        outcome.windows = watcher.windows
        outcome.seconds = time.monotonic() - started
        released = release_lease(job.store, outcome.query_id)
        if fresh:
            # A fresh checkpoint is under the output, with its storage options, or local.
            under_output = spark_has_filesystem(job.options.path)
            remove_checkpoint(checkpoint, job.options.storage_options if under_output else {})
    for line in summary(job, outcome, released):
        print(line, file=out)
    return 130 if outcome.interrupted else 0
