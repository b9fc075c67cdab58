"""A job config checked without Spark: ``prepare`` turns a ``JobConfig`` into a ``PreparedJob``.

It is what ``dedupsink validate`` reports and what ``dedupsink run`` does first, so that a bad
config stops before a JVM starts: the source format is one Spark has, the sink options parse
(``DedupOptions.parse``), the source schema parses (``ddl.parse_schema``), the keys and expiry
key resolve against it (``engine.settings.resolve``), the source path exists, the output and
the store are reachable, an existing store was created with the same settings, and a local
checkpoint folder can be written. Every problem is a ``ConfigError`` naming the key and where
it was set.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import tempfile
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

import fsspec
import pyarrow as pa
from pyspark.sql.types import StructType

from dedupsink.cli.config import (
    CHECKPOINT,
    SOURCE_FORMAT,
    SOURCE_PATH,
    SOURCE_SCHEMA,
    TRIGGER,
    JobConfig,
    Trigger,
    parse_trigger,
)
from dedupsink.cli.ddl import parse_schema
from dedupsink.cli.source_options import check_source_options
from dedupsink.engine.settings import Settings, resolve
from dedupsink.errors import ConfigError, DedupOptionError
from dedupsink.options import PATH, STORE_PATH, DedupOptions
from dedupsink.sink.compat import arrow_schema as spark_arrow_schema
from dedupsink.store.format import Manifest
from dedupsink.store.storage import Storage, basename, join
from dedupsink.store.store import BucketStore, check_settings

log = logging.getLogger("dedupsink.cli")

# The sources a job may name: Spark's file sources (avro needs Spark's spark-avro package) and
# its streaming sources (kafka needs spark-sql-kafka). Any other source is named by its class,
# a dotted name that only Spark can check.
FILE_FORMATS = ("parquet", "json", "csv", "orc", "xml", "avro")
STREAM_SOURCES = ("kafka", "rate", "rate-micro-batch")
SOURCE_FORMATS = (*FILE_FORMATS, "text", *STREAM_SOURCES)
# Sources whose schema Spark fixes; the CLI knows it so keys can be checked before a run.
FIXED_SCHEMAS = {
    "kafka": "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, "
    "timestamp TIMESTAMP, timestampType INT",
    "rate": "timestamp TIMESTAMP, value BIGINT",
    "rate-micro-batch": "timestamp TIMESTAMP, value BIGINT",
    "text": "value STRING",
}
_GLOB_CHARS = set("*?[{")
_CLASS_NAME = re.compile(r"^[A-Za-z_][\w$]*(\.[A-Za-z_][\w$]*)+$")

CHECKPOINTS_DIR = "_checkpoints"
# Hadoop's filesystems, which every Spark has. An object store needs a connector on Spark's
# classpath (s3a:// hadoop-aws, gs:// the GCS connector, abfs:// hadoop-azure), and s3://,
# memory:// and fsspec's other schemes have no Hadoop filesystem at all.
SPARK_FILESYSTEMS = ("file", "hdfs", "viewfs")
LOCAL_CHECKPOINTS = "dedupsink-checkpoints"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


@dataclass
class PreparedJob:
    """A config whose options, schema, columns, source and store were all checked."""

    config: JobConfig
    options: DedupOptions
    trigger: Trigger
    source_format: str
    schema: StructType | None
    settings: Settings | None
    source_files: int | None = None
    manifest: Manifest | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def store(self) -> BucketStore:
        options = self.options
        return BucketStore(
            options.store_path, options.storage_options, bounds=options.storage_bounds
        )


def prepare(config: JobConfig, check_source: bool = True) -> PreparedJob:
    """Check everything that can be checked without Spark; raises ConfigError."""
    source_format = check_source_format(config)
    check_source_options(config, source_format)
    options = parse_options(config)
    trigger = parse_trigger(config.get(TRIGGER), config.where(TRIGGER))
    schema = source_schema(config, source_format)
    job = PreparedJob(config, options, trigger, source_format, schema, None)
    if schema is not None:
        job.settings = resolve_settings(config, options, arrow_schema(config, schema))
    else:
        job.notes.append("no source.schema: keys are checked against the stream when it starts")
    if check_source:
        job.source_files = check_source_path(config, source_format, job.notes)
    job.manifest = checked_manifest(config, job)
    if trigger.kind != "batch":  # a batch job has no checkpoint
        check_checkpoint(config, job)
    return job


def _required(config: JobConfig, key: str) -> str:
    value = config.get(key)
    if value is None:
        raise ConfigError(key, f"{key} is required", config.origin)
    return value


def check_source_format(config: JobConfig) -> str:
    """``source.format`` as Spark is given it: a source's short name (any case, given in lower
    case) or a data source's class name (as written); any other name is refused, so that a typo
    stops here and not in Spark's planner."""
    value = _required(config, SOURCE_FORMAT)
    if value.lower() in SOURCE_FORMATS:
        return value.lower()
    if _CLASS_NAME.match(value):
        return value
    close = difflib.get_close_matches(value.lower(), SOURCE_FORMATS, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise ConfigError(
        SOURCE_FORMAT,
        f"{SOURCE_FORMAT}={value!r} is invalid: expected a source Spark has: "
        f"{', '.join(FILE_FORMATS)}, text (files), {', '.join(STREAM_SOURCES)}, or a data "
        f"source's class name such as com.example.MySource{hint}",
        config.where(SOURCE_FORMAT),
    )


def _as_config_error(config: JobConfig, exc: DedupOptionError) -> ConfigError:
    return ConfigError(exc.option, str(exc), config.where(exc.option))


def parse_options(config: JobConfig) -> DedupOptions:
    try:
        return DedupOptions.parse(config.sink_options)
    except DedupOptionError as exc:
        raise _as_config_error(config, exc) from exc


def source_schema(config: JobConfig, source_format: str) -> StructType | None:
    """The schema the source will produce, or None when only Spark can tell."""
    text = config.get(SOURCE_SCHEMA)
    where = config.where(SOURCE_SCHEMA)
    if source_format in FIXED_SCHEMAS:
        if text is not None:
            raise ConfigError(
                SOURCE_SCHEMA,
                f"{SOURCE_SCHEMA} cannot be set for source.format={source_format}: its schema "
                f"is fixed ({FIXED_SCHEMAS[source_format]})",
                where,
            )
        return parse_schema(FIXED_SCHEMAS[source_format])
    if text is None:
        if source_format in FILE_FORMATS:
            raise ConfigError(
                SOURCE_SCHEMA,
                f"{SOURCE_SCHEMA} is required for source.format={source_format} (a streaming "
                "file source needs its schema), e.g. 'id BIGINT, name STRING, ts TIMESTAMP'",
                config.origin,
            )
        return None
    return parse_schema(text, SOURCE_SCHEMA, where)


def arrow_schema(config: JobConfig, schema: StructType) -> pa.Schema:
    """The Arrow schema the sink will see (the same conversion the data source makes)."""
    try:
        converted: pa.Schema = spark_arrow_schema(schema)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            SOURCE_SCHEMA,
            f"{SOURCE_SCHEMA} has a type Arrow cannot hold: {exc}",
            config.where(SOURCE_SCHEMA),
        ) from exc
    return converted


def resolve_settings(config: JobConfig, options: DedupOptions, schema: pa.Schema) -> Settings:
    try:
        return resolve(options, schema)
    except DedupOptionError as exc:
        raise _as_config_error(config, exc) from exc


def check_source_path(config: JobConfig, source_format: str, notes: list[str]) -> int | None:
    """The number of files at ``source.path`` (None if it cannot be listed); missing is an error."""
    path = config.get(SOURCE_PATH)
    where = config.where(SOURCE_PATH)
    if path is None:
        if source_format in FILE_FORMATS or source_format == "text":
            raise ConfigError(
                SOURCE_PATH,
                f"{SOURCE_PATH} is required for source.format={source_format}",
                config.origin,
            )
        return None
    try:
        fs, root = fsspec.core.url_to_fs(path)
    except (ImportError, ValueError) as exc:
        notes.append(f"{SOURCE_PATH} not checked: {exc}")
        return None
    if _GLOB_CHARS & set(root):
        matches = fs.glob(root)
        if not matches:
            raise ConfigError(SOURCE_PATH, f"{SOURCE_PATH}={path}: no file matches", where)
        return len(matches)
    if not fs.exists(root):
        raise ConfigError(SOURCE_PATH, f"{SOURCE_PATH}={path}: no such file or directory", where)
    if fs.isdir(root):
        names = [n for n in fs.ls(root, detail=False) if not _hidden(n)]
        return len(names)
    return 1


def _hidden(name: str) -> bool:
    return basename(name).startswith((".", "_"))


def checked_manifest(config: JobConfig, job: PreparedJob) -> Manifest | None:
    """The store's latest manifest, if it exists; its settings must match the job's. The output
    and the store are checked first as the sink checks them when its query starts: a missing
    bucket, refused credentials or an endpoint where nothing answers fail here, before Spark."""
    try:
        options = job.options
        Storage.for_url(
            options.path, options.storage_options, PATH, options.storage_bounds
        ).check_reachable(PATH)
        job.store.storage.check_reachable(STORE_PATH)
        manifest = job.store.read()
    except DedupOptionError as exc:
        raise _as_config_error(config, exc) from exc
    except (ImportError, OSError) as exc:
        job.notes.append(f"store not checked: {job.options.mask(str(exc))}")
        return None
    if manifest is not None and job.settings is not None:
        try:
            check_settings(manifest.settings, job.settings, job.store.url)
        except DedupOptionError as exc:
            raise _as_config_error(config, exc) from exc
    return manifest


# -- the checkpoint ----------------------------------------------------------------------------


def checkpoint_for(job: PreparedJob) -> tuple[str, bool]:
    """The configured checkpoint, or a fresh one (True: remove it after the run): under the
    output when Spark has a filesystem for it, else in a local temporary folder (a fresh
    checkpoint lives only as long as its run, on the driver)."""
    configured = job.config.get(CHECKPOINT)
    if configured:
        return configured, False
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    name = f"run-{stamp}-{uuid.uuid4().hex[:6]}"
    if spark_has_filesystem(job.options.path):
        return join(job.options.path, CHECKPOINTS_DIR, name), True
    return os.path.join(tempfile.gettempdir(), LOCAL_CHECKPOINTS, name), True


def spark_has_filesystem(url: str) -> bool:
    """Whether every Spark can write at ``url``: a plain path, or a Hadoop filesystem's URL."""
    found = _SCHEME.match(url)
    return found is None or found.group(1).lower() in SPARK_FILESYSTEMS


def local_path(url: str) -> str | None:
    """The local path of a plain path or a ``file://`` URL; None for any other URL."""
    found = _SCHEME.match(url)
    if found is None:
        return url
    if found.group(1).lower() == "file":
        return url[len(found.group(0)) :] or "/"
    return None


def check_checkpoint(config: JobConfig, job: PreparedJob) -> None:
    """A local checkpoint folder must be writable: the nearest folder of it that exists takes a
    new file (a probe, removed at once). Other filesystems are left to Spark, with a note where
    Spark needs a connector that only its classpath can tell."""
    location, fresh = checkpoint_for(job)
    path = local_path(location)
    if path is None:
        if not spark_has_filesystem(location):
            scheme = location.split(":", 1)[0]
            job.notes.append(
                f"{CHECKPOINT} {location} needs a Hadoop filesystem for {scheme}:// on Spark's "
                f'classpath (Spark otherwise fails with: No FileSystem for scheme "{scheme}")'
            )
        return
    problem = _unwritable(path)
    if problem is None:
        return
    if fresh:
        raise ConfigError(
            CHECKPOINT,
            f"the fresh checkpoint under {os.path.dirname(path)} cannot be written: {problem}; "
            f"set {CHECKPOINT} to a folder Spark can write",
            config.where(PATH),
        )
    raise ConfigError(
        CHECKPOINT,
        f"{CHECKPOINT}={location} is invalid: expected a folder Spark can write its "
        f"checkpoint in: {problem}",
        config.where(CHECKPOINT),
    )


def _unwritable(path: str) -> str | None:
    """Why a folder cannot be made or written at ``path``, or None if it can."""
    existing = os.path.abspath(path)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{existing} is not a folder"
    try:
        with tempfile.TemporaryFile(dir=existing, prefix=".dedupsink-probe-"):
            pass
    except OSError as exc:
        return f"{existing} is not writable ({exc.strerror or exc})"
    return None
