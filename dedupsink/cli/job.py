"""A job config checked without Spark: ``prepare`` turns a ``JobConfig`` into a ``PreparedJob``.

It is what ``dedupsink validate`` reports and what ``dedupsink run`` does first, so that a bad
config stops before a JVM starts: the sink options parse (``DedupOptions.parse``), the source
schema parses (``ddl.parse_schema``), the keys and expiry key resolve against it
(``engine.settings.resolve``), the source path exists, and an existing store was created with
the same settings. Every problem is a ``ConfigError`` naming the key and where it was set.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import fsspec
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from dedupsink.cli.config import (
    SOURCE_FORMAT,
    SOURCE_PATH,
    SOURCE_SCHEMA,
    TRIGGER,
    JobConfig,
    Trigger,
    parse_trigger,
)
from dedupsink.cli.ddl import parse_schema
from dedupsink.cli.errors import ConfigError
from dedupsink.engine.settings import Settings, resolve
from dedupsink.errors import DedupOptionError
from dedupsink.options import PATH, STORE_PATH, DedupOptions
from dedupsink.store.format import Manifest
from dedupsink.store.storage import Storage, basename
from dedupsink.store.store import BucketStore, check_settings

log = logging.getLogger("dedupsink.cli")

FILE_FORMATS = ("json", "csv", "parquet", "orc", "avro", "xml")
# Sources whose schema Spark fixes; the CLI knows it so keys can be checked before a run.
FIXED_SCHEMAS = {
    "kafka": "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, "
    "timestamp TIMESTAMP, timestampType INT",
    "rate": "timestamp TIMESTAMP, value BIGINT",
    "rate-micro-batch": "timestamp TIMESTAMP, value BIGINT",
    "text": "value STRING",
}
_GLOB_CHARS = set("*?[{")


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
        return BucketStore(self.options.store_path, self.options.storage_options)


def prepare(config: JobConfig, check_source: bool = True) -> PreparedJob:
    """Check everything that can be checked without Spark; raises ConfigError."""
    source_format = _required(config, SOURCE_FORMAT).lower()
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
    job.manifest = check_store(config, job)
    return job


def _required(config: JobConfig, key: str) -> str:
    value = config.get(key)
    if value is None:
        raise ConfigError(key, f"{key} is required", config.origin)
    return value


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
        converted: pa.Schema = to_arrow_schema(schema, timezone="UTC")
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


def check_store(config: JobConfig, job: PreparedJob) -> Manifest | None:
    """The store's latest manifest, if it exists; its settings must match the job's. The output
    and the store are checked first as the sink checks them when its query starts: a missing
    bucket, refused credentials or an endpoint where nothing answers fail here, before Spark."""
    try:
        Storage.for_url(job.options.path, job.options.storage_options).check_reachable(PATH)
        job.store.storage.check_reachable(STORE_PATH)
        manifest = job.store.read()
    except DedupOptionError as exc:
        raise _as_config_error(config, exc) from exc
    except (ImportError, OSError) as exc:
        job.notes.append(f"store not checked: {job.options.mask(str(exc))}")
        return None
    if manifest is not None and job.settings is not None:
        try:
            check_settings(manifest.settings, job.settings.identity(), job.store.url)
        except DedupOptionError as exc:
            raise _as_config_error(config, exc) from exc
    return manifest
