"""Options resolved against the stream's Arrow schema: the mode, the key and expiry columns.

``resolve`` is where ``keys`` and ``expiryKey`` meet the schema: it finds (possibly nested)
columns, infers the expiry mode from the expiry column's type, converts periods and spans into
the expiry domain's units and picks the bucket layout. The result, ``Settings``, is what the
engine classifies with and what a bucket store records at creation and checks on reopen.
The rules for combining options checked here are those that need the schema (a column, its
type, the mode it implies, the units of its domain); the rest are checked on parsing, by
:mod:`dedupsink.options`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, TypeAlias

import pyarrow as pa

from dedupsink.engine.expiry_policy import ExpiryPolicy, Mode
from dedupsink.engine.sparkhash import spark_hashable
from dedupsink.errors import DedupOptionError
from dedupsink.options import (
    ASSUME_SAME_EXPIRY,
    ASSUME_SAME_EXPIRY_DEFAULT,
    BUCKET_SPAN,
    BUCKETS_PER_PERIOD_DEFAULT,
    DURATION_MODES,
    EXPIRY_KEY,
    EXPIRY_MODE,
    EXPIRY_PERIOD,
    KEYS,
    MAX_EXPIRY_JUMP,
    NUM_BUCKETS,
    OUTPUT_FORMAT_DEFAULT,
    SEQUENCE_KEY,
    DedupOptions,
    bool_text,
    close_match,
    misplaced_assume_same_expiry,
    period_required,
)
from dedupsink.units import Span, human_duration, number_text

StampKind = Literal["int", "float"]
KeyHash = Literal["spark", "fingerprint"]
# A new store in a time-bucket mode splits each time bucket into this many key shards, so that
# a task of a key-partitioned input loads its share of a time bucket (up to 16 partitions
# divide it evenly); the hash-bucket modes' buckets are their shards.
TIME_BUCKET_KEY_SHARDS = 16
# Input rows as the engine takes them: one record batch, or a table of several (a task's chunk).
Rows: TypeAlias = pa.RecordBatch | pa.Table

ERROR_COLUMN = "_dedup_error"
TIME_BUCKET_MODES = ("tupleTime", "ordered")


@dataclass(frozen=True)
class Settings:
    """Everything the engine needs; the fields in ``identity()`` must match an existing store."""

    mode: Mode
    keys: tuple[str, ...]
    key_types: tuple[str, ...]
    expiry_key: str | None
    expiry_type: str | None
    stamp_kind: StampKind
    period: float | None
    span: float | None
    bucket_count: int
    max_expiry_jump: float | None = None
    # Only tupleTime and ordered can assume it; in the other modes it stays at its default.
    assume_same_expiry: bool = ASSUME_SAME_EXPIRY_DEFAULT
    # How the ports are written, fixed when the store is created like the rest.
    output_format: str = OUTPUT_FORMAT_DEFAULT
    # Sequence dedup only: the sequence column and its type (the keys are the producers).
    sequence_key: str | None = None
    sequence_type: str | None = None
    # Where a key is placed, fixed when the store is created (docs/ARCHITECTURE.md, "State
    # that scales out"): ``key_hash`` "spark" puts Spark's ``hash(keys)`` in the fingerprint's
    # high word, so a key's shard follows Spark's hash partitioning; "fingerprint" (stores
    # created before placement existed, or keys Spark's hash is not matched for) uses the
    # fingerprint alone. ``key_shards``: the key shards a time bucket is split into.
    key_hash: KeyHash = "fingerprint"
    key_shards: int = 1

    @property
    def has_expiry(self) -> bool:
        return self.mode not in ("basic", "sequence")

    @property
    def by_sequence(self) -> bool:
        """Sequence dedup: the store remembers each producer's highest sequence id, not keys."""
        return self.mode == "sequence"

    @property
    def buckets_by_time(self) -> bool:
        """tupleTime/ordered bucket by expiry value under Assumption 1 (copies carry their
        original's value, so they meet it in its bucket); the others by key hash
        (docs/SEMANTICS.md, Modes)."""
        return self.mode in TIME_BUCKET_MODES and self.assume_same_expiry

    @property
    def stores_stamps(self) -> bool:
        """Whether each remembered key carries its own expiry value on disk (systemTime keys
        are written with a placeholder meaning "my window's time", real after compaction; a
        producer of sequence dedup carries its highest sequence id)."""
        return self.mode != "basic"

    @property
    def provisional_stamps(self) -> bool:
        """Whether a window file's stamps may be provisional, meaningful only with its own
        index entry (categorical: numbers of the file's new categories; systemTime: the
        placeholder for the file's window time)."""
        return self.mode in ("categorical", "systemTime")

    @property
    def expiry(self) -> ExpiryPolicy:
        return ExpiryPolicy(self.mode, self.period, self.expiry_type)

    def expiry_point(self, latest: float | None) -> float | None:
        """``E = L - expiryPeriod``: rows at or below it are expired, keys forgotten."""
        return self.expiry.expiry_point(latest)

    @property
    def shard_count(self) -> int:
        """The key shards the keys are spread over: a task of partition p of N of an input
        partitioned by ``dedupsink.partition_for_dedup`` holds the shards ``s`` with
        ``s % N == p``."""
        return self.key_shards if self.buckets_by_time else self.bucket_count

    def laid_out_as(self, recorded: Settings | Any) -> Settings:
        """These settings with the key placement of a store (its ``key_hash``, ``key_shards``):
        a store keeps the placement it was created with, whatever the query's defaults."""
        if (self.key_hash, self.key_shards) == (recorded.key_hash, recorded.key_shards):
            return self
        return replace(self, key_hash=recorded.key_hash, key_shards=recorded.key_shards)

    def identity(self) -> dict[str, Any]:
        record = asdict(self)
        record.pop("max_expiry_jump")
        record["keys"] = list(self.keys)
        record["key_types"] = list(self.key_types)
        return record


def human_span(value: float | None, mode: str) -> str:
    """A period or bucket span in the expiry key's domain of ``mode``, for people: a duration
    in the time modes, else a number."""
    if value is None:
        return "-"
    if mode in DURATION_MODES:
        return human_duration(value)
    return number_text(value)


def find_field(schema: pa.Schema, name: str) -> pa.Field | None:
    """A top-level field, or a nested one by dotted path ``a.b.c``."""
    index = schema.get_field_index(name)
    if index >= 0:
        return schema.field(index)
    parts = name.split(".")
    if len(parts) < 2:
        return None
    field: pa.Field | None = schema.field(parts[0]) if parts[0] in schema.names else None
    for part in parts[1:]:
        if field is None or not pa.types.is_struct(field.type):
            return None
        struct: pa.StructType = field.type
        position = struct.get_field_index(part)
        field = struct.field(position) if position >= 0 else None
    return field


def column(rows: Rows, name: str) -> pa.Array:
    """The array of a top-level or dotted nested column (struct nulls propagate to children), in
    one piece whatever the chunks of ``rows``."""
    index = rows.schema.get_field_index(name)
    parts = [name] if index >= 0 else name.split(".")
    array = rows.column(rows.schema.get_field_index(parts[0]))
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    for part in parts[1:]:
        array = pa.compute.struct_field(array, [array.type.get_field_index(part)])
    return array


def _missing_column(
    option: str, value: str, name: str, schema: pa.Schema, accepted: str = "a column of the stream:"
) -> DedupOptionError:
    """The refusal of ``name``, which names no column: the columns listed, and the closest
    one where a column is spelt much like it (a typo of ``serial`` as ``serail``)."""
    close = close_match(name, schema.names)
    hint = f" (did you mean {close!r}?)" if close is not None else ""
    return DedupOptionError(option, value, f"{accepted} one of {schema.names}{hint}")


def _supported_key_type(kind: pa.DataType) -> bool:
    if pa.types.is_struct(kind):
        return all(_supported_key_type(kind.field(i).type) for i in range(kind.num_fields))
    return not (
        pa.types.is_list(kind)
        or pa.types.is_large_list(kind)
        or pa.types.is_fixed_size_list(kind)
        or pa.types.is_map(kind)
        or pa.types.is_union(kind)
        or pa.types.is_null(kind)
    )


def _infer_mode(kind: pa.DataType) -> Mode | None:
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        return "tupleTime"
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind):
        return "ordered"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "categorical"
    return None


def _mode_fits(mode: Mode, kind: pa.DataType) -> bool:
    is_text = pa.types.is_string(kind) or pa.types.is_large_string(kind)
    if mode == "tupleTime":
        return pa.types.is_timestamp(kind) or pa.types.is_date(kind) or is_text
    if mode == "ordered":
        return _infer_mode(kind) == "ordered" or is_text
    if mode == "categorical":
        # Categories are text: bytes need not be UTF-8, and one such value would fail the task.
        binary = pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
        binary = binary or pa.types.is_fixed_size_binary(kind)
        return _supported_key_type(kind) and not pa.types.is_struct(kind) and not binary
    return True


def _resolve_keys(
    options: DedupOptions, schema: pa.Schema
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    names = options.keys if options.keys is not None else tuple(schema.names)
    types = []
    for name in names:
        field = find_field(schema, name)
        if field is None:
            raise _missing_column(
                KEYS, ",".join(names), name, schema, f"columns of the stream; {name!r} is not"
            )
        if not _supported_key_type(field.type):
            hint = (
                ""
                if options.keys is not None
                else " (keys defaults to all columns; set keys explicitly)"
            )
            raise DedupOptionError(
                KEYS,
                ",".join(names),
                f"columns of comparable types; {name!r} has type {field.type}{hint}",
            )
        types.append(str(field.type))
    return names, tuple(types)


def _in_domain(option: str, span: Span, mode: Mode, inferred_from: str | None = None) -> float:
    """A period, span or jump in the expiry key's domain. ``inferred_from`` (the expiry
    column and its type) says the mode was not given but inferred, which a refusal says."""
    setting = f"expiryMode={mode}"
    if inferred_from is not None:
        setting += f", the mode inferred from {inferred_from}"
    if mode in DURATION_MODES:
        if not span.is_duration:
            raise DedupOptionError(
                option, span.text, f"a duration such as '24 hours' with {setting}"
            )
        return span.micros
    if span.is_duration:
        if mode == "categorical":
            accepted = f"a count of categories with {setting}"
            if inferred_from is not None:
                accepted += (
                    ": for times written as text, set expiryMode=tupleTime (it reads ISO-8601 text)"
                )
        else:
            accepted = f"a plain number in the expiry key's units with {setting}"
        raise DedupOptionError(option, span.text, accepted)
    if mode == "categorical" and span.amount != int(span.amount):
        raise DedupOptionError(option, span.text, f"a whole number of categories with {setting}")
    return int(span.amount) if span.amount == int(span.amount) else span.amount


def resolve(options: DedupOptions, schema: pa.Schema) -> Settings:
    """Resolve options against the input schema; errors name the option and the value. The
    key placement is a new store's (an existing store's is adopted: ``laid_out_as``)."""
    settings = _resolve(options, schema)
    key_fields = [find_field(schema, name) for name in settings.keys]
    found = [f.type for f in key_fields if f is not None]
    hashable = len(found) == len(key_fields) and spark_hashable(found)
    return replace(
        settings,
        key_hash="spark" if hashable else "fingerprint",
        key_shards=TIME_BUCKET_KEY_SHARDS if settings.buckets_by_time else 1,
    )


def _resolve(options: DedupOptions, schema: pa.Schema) -> Settings:
    keys, key_types = _resolve_keys(options, schema)
    if options.sequence_key is not None:
        return _resolve_sequence(options, schema, keys, key_types, options.sequence_key)
    mode, expiry_type, stamp_kind = _resolve_mode(options, schema)
    if mode == "basic":
        return _without_expiry("basic", keys, key_types, options)
    if options.expiry_period is None:
        raise DedupOptionError(EXPIRY_PERIOD, None, period_required(f"expiryMode={mode}", mode))
    inferred_from = None
    if options.expiry_mode is None and options.expiry_key is not None:
        inferred_from = f"column {options.expiry_key!r} of type {expiry_type}"
    period = _in_domain(EXPIRY_PERIOD, options.expiry_period, mode, inferred_from)
    jump = (
        _in_domain(MAX_EXPIRY_JUMP, options.max_expiry_jump, mode, inferred_from)
        if options.max_expiry_jump
        else None
    )
    same_expiry = _assume_same_expiry(options, mode)
    span, bucket_count = _bucket_layout(options, mode, period, stamp_kind, same_expiry)
    return Settings(
        mode,
        keys,
        key_types,
        options.expiry_key,
        expiry_type,
        stamp_kind,
        period,
        span,
        bucket_count,
        jump,
        same_expiry,
        options.output_format,
    )


def _resolve_sequence(
    options: DedupOptions,
    schema: pa.Schema,
    keys: tuple[str, ...],
    key_types: tuple[str, ...],
    name: str,
) -> Settings:
    """Sequence dedup: producers bucketed by hash, each stored with its highest sequence id."""
    field = find_field(schema, name)
    if field is None:
        raise _missing_column(SEQUENCE_KEY, name, name, schema)
    if not sequence_type_fits(field.type):
        raise DedupOptionError(
            SEQUENCE_KEY,
            name,
            f"an integer column (a whole-valued float or decimal column also serves: rows whose "
            f"value is not a whole number go to error); {name!r} has type {field.type}",
        )
    return _without_expiry(
        "sequence", keys, key_types, options, sequence_key=name, sequence_type=str(field.type)
    )


def _without_expiry(
    mode: Mode,
    keys: tuple[str, ...],
    key_types: tuple[str, ...],
    options: DedupOptions,
    sequence_key: str | None = None,
    sequence_type: str | None = None,
) -> Settings:
    """Settings of a mode that keeps keys (or producers) by hash and never expires them."""
    return Settings(
        mode,
        keys,
        key_types,
        None,
        None,
        "int",
        None,
        None,
        options.hash_buckets,
        output_format=options.output_format,
        sequence_key=sequence_key,
        sequence_type=sequence_type,
    )


def sequence_type_fits(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)


def _resolve_mode(options: DedupOptions, schema: pa.Schema) -> tuple[Mode, str | None, StampKind]:
    """The expiry mode, the expiry column's type and the kind of stamps it gives."""
    if options.expiry_key is None:
        return ("systemTime" if options.expiry_mode == "systemTime" else "basic"), None, "int"
    field = find_field(schema, options.expiry_key)
    if field is None:
        raise _missing_column(EXPIRY_KEY, options.expiry_key, options.expiry_key, schema)
    mode = options.expiry_mode or _infer_mode(field.type)
    if mode is None:
        raise DedupOptionError(
            EXPIRY_KEY,
            options.expiry_key,
            f"a timestamp, date, numeric or string column; it has type {field.type}",
        )
    if not _mode_fits(mode, field.type):
        raise DedupOptionError(
            EXPIRY_MODE,
            mode,
            f"a mode that fits column {options.expiry_key!r} of type {field.type}",
        )
    fractional = pa.types.is_floating(field.type) or pa.types.is_decimal(field.type)
    stamp_kind: StampKind = "float" if mode == "ordered" and fractional else "int"
    return mode, str(field.type), stamp_kind


def _bucket_layout(
    options: DedupOptions, mode: Mode, period: float, stamp_kind: StampKind, same_expiry: bool
) -> tuple[float | None, int]:
    """(bucket span, bucket count): time buckets under Assumption 1, else hash buckets."""
    if mode in TIME_BUCKET_MODES and same_expiry:
        if options.num_buckets is not None:
            raise DedupOptionError(
                NUM_BUCKETS,
                str(options.num_buckets),
                f"no value with expiryMode={mode} and {ASSUME_SAME_EXPIRY}=true (keys are "
                f"bucketed by time, see bucketSpan; it applies with {ASSUME_SAME_EXPIRY}=false)",
            )
        span = _time_bucket_span(options, mode, period, stamp_kind)
        return span, max(1, math.ceil(period / span))
    if options.bucket_span is not None:
        setting = f"expiryMode={mode}"
        if mode in TIME_BUCKET_MODES:
            setting += f" and {ASSUME_SAME_EXPIRY}={bool_text(same_expiry)}"
        raise DedupOptionError(
            BUCKET_SPAN,
            options.bucket_span.text,
            f"no value with {setting} (it buckets by key hash; see numBuckets)",
        )
    return None, options.hash_buckets


def _assume_same_expiry(options: DedupOptions, mode: Mode) -> bool:
    """The setting for an expiry mode: given or default in tupleTime and ordered, refused in
    categorical (the parser already refused it in Basic Dedup and systemTime)."""
    given = options.assume_same_expiry
    if given is None:
        return ASSUME_SAME_EXPIRY_DEFAULT
    if mode not in TIME_BUCKET_MODES:
        raise misplaced_assume_same_expiry(given, f"expiryMode={mode}")
    return given


def _time_bucket_span(options: DedupOptions, mode: Mode, period: float, kind: StampKind) -> float:
    """The bucket span in the expiry domain: as given (at most the period), or a sixteenth of
    the period (whole units for integer domains)."""
    if options.bucket_span is None:
        span = period / BUCKETS_PER_PERIOD_DEFAULT
        return max(1.0, math.floor(span)) if kind == "int" else span
    span = _in_domain(BUCKET_SPAN, options.bucket_span, mode)
    if span > period:
        given = options.expiry_period.text if options.expiry_period else period
        raise DedupOptionError(
            BUCKET_SPAN, options.bucket_span.text, f"at most the expiry period ({given})"
        )
    return span
