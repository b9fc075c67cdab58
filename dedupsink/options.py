"""The sink's options: names paired with defaults, tiny typed parsers, one frozen object.

Spark hands a data source its options as strings, case-insensitively. ``DedupOptions.parse``
turns them into one typed, frozen object, once, on the driver; every error names the option,
the value and what is accepted. The rules for combining options are split by what they need:
those the options alone decide (which options go together) are checked here, on parsing; those
that need the stream's schema (columns, their types, the mode a column implies) are checked by
:mod:`dedupsink.engine.settings` on resolution. Durations and sizes are read by
:mod:`dedupsink.units`; secret values are masked by :mod:`dedupsink.masking`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from dedupsink.errors import DedupError, DedupOptionError
from dedupsink.masking import (
    MASK,
    catalog_secrets,
    is_secret_property,
    mask_values,
    storage_secrets,
)
from dedupsink.units import DURATION_ACCEPTED, Size, Span, parse_duration, parse_size, parse_span

ExpiryMode = Literal["tupleTime", "systemTime", "ordered", "categorical"]
# The modes whose periods, spans and jumps are durations (the others' are plain numbers).
DURATION_MODES = ("tupleTime", "systemTime")
EXPIRY_MODES: tuple[ExpiryMode, ...] = get_args(ExpiryMode)

PATH = "path"
KEYS = "keys"
EXPIRY_KEY = "expiryKey"
# Sequence dedup (Pulsar's design): an integer column per row that grows per producer; the
# store keeps one number per producer (``keys``), its highest sequence id, and nothing expires.
SEQUENCE_KEY = "sequenceKey"
EXPIRY_MODE = "expiryMode"
EXPIRY_PERIOD = "expiryPeriod"
BUCKET_SPAN = "bucketSpan"
NUM_BUCKETS = "numBuckets"
NUM_BUCKETS_DEFAULT = 64
MAX_CACHED_BUCKETS = "maxCachedBuckets"
MAX_CACHED_BUCKETS_DEFAULT = 64
MAX_CACHE_MEMORY = "maxCacheMemory"
# Per executor Python process, and an executor runs one per task slot, all inside Spark's
# memory overhead (by default 10% of executor memory, at least 384 MB): a modest default, at
# 24 bytes a key with its expiry value (16 without); raise it when the hot buckets are larger.
MAX_CACHE_MEMORY_DEFAULT = "64 MB"
MAX_EXPIRY_JUMP = "maxExpiryJump"
STORE_PATH = "storePath"
STORE_DIRNAME_DEFAULT = "_store"
OUTPUT_FORMAT = "outputFormat"
OUTPUT_FORMAT_DEFAULT = "parquet"
OUTPUT_FORMATS = (OUTPUT_FORMAT_DEFAULT, "delta", "iceberg")
# Options named iceberg.catalog.<property> are properties of pyiceberg's load_catalog.
ICEBERG_CATALOG_PREFIX = "iceberg.catalog."
ICEBERG_NAMESPACE = "iceberg.namespace"
ICEBERG_NAMESPACE_DEFAULT = "dedup"
ICEBERG_TABLE = "iceberg.table"  # default: the last segment of path
OWNER_TIMEOUT = "ownerTimeout"
# How long after its last commit a query's hold on the store keeps another query waiting: a
# redeploy right after a query stops waits at most this long (see store/ownership.py).
OWNER_TIMEOUT_DEFAULT = "10 seconds"
# Options named fs.<name> are fsspec storage options <name> for the store and the ports.
STORAGE_OPTION_PREFIX = "fs."
ASSUME_SAME_EXPIRY = "assumeSameExpiry"
# Assumption 1 of the Malhar design: re-sent copies carry their original's expiry value, which
# lets time buckets keep the working set small. Copies stamped with their own (send) time need
# ``false``: keys are then bucketed by hash and each remembers the value of its unique row.
ASSUME_SAME_EXPIRY_DEFAULT = True
BOOLEAN_ACCEPTED = "true or false"
STATE_CACHE_DIR = "stateCacheDir"
# None: the first of the executor's local dirs (Spark's SPARK_EXECUTOR_DIRS, SPARK_LOCAL_DIRS,
# YARN's LOCAL_DIRS), else the system's temporary folder (store/shared.py).
STATE_CACHE_DIR_DEFAULT = None

STORAGE_CONNECT_TIMEOUT = "storageConnectTimeout"
STORAGE_READ_TIMEOUT = "storageReadTimeout"
STORAGE_TIMEOUT = "storageTimeout"
# The bounds suit a stream (store/retry.py): a connection within 5 s (S3A waits 30 s; a
# stream's store is near), a silent socket after 20 s (a window file of tens of MB at a few
# MB/s is read in less), and a silent store given up on within two minutes of wall time per
# operation, retries included (Kafka's delivery.timeout.ms is 120 s).
STORAGE_CONNECT_TIMEOUT_DEFAULT = "5 seconds"
STORAGE_READ_TIMEOUT_DEFAULT = "20 seconds"
STORAGE_TIMEOUT_DEFAULT = "2 minutes"

COMPACT_EVERY = "compactEvery"
# 0: off. N: the driver's commit compacts the port tables (delta, iceberg) after publishing every
# N-th store version, so a day of one-minute windows does not leave thousands of small files.
COMPACT_EVERY_DEFAULT = 0
COMPACT_TARGET_SIZE = "compactTargetSize"
# What Delta's OPTIMIZE aims at by default.
COMPACT_TARGET_SIZE_DEFAULT = "128 MB"
TABLE_FORMATS = ("delta", "iceberg")
MERGE_SCHEMA = "mergeSchema"
# Off by default, as in Delta: an input whose columns differ from the port tables' is refused at
# start; on, new columns are added to the tables and widenings the format allows are made
# (ports/evolution.py).
MERGE_SCHEMA_DEFAULT = False

# A bucket span, when not given, is this fraction of the expiry period: 16 time buckets keep
# each bucket small while one expiry period of history needs few files per bucket.
BUCKETS_PER_PERIOD_DEFAULT = 16

# Options Spark itself puts in a sink's option map; they are Spark's business, not ours.
SPARK_OPTIONS = frozenset({"checkpointlocation", "queryname", "__checkpointlocation"})


def parse_positive_int(option: str, text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError as exc:
        raise DedupOptionError(option, text, "a positive whole number") from exc
    if value <= 0:
        raise DedupOptionError(option, text, "a positive whole number")
    return value


def parse_non_negative_int(option: str, text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError as exc:
        raise DedupOptionError(option, text, "a whole number, 0 or more") from exc
    if value < 0:
        raise DedupOptionError(option, text, "a whole number, 0 or more")
    return value


def parse_columns(option: str, text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(","))
    if not names or any(not name for name in names):
        raise DedupOptionError(
            option, text, "a comma-separated list of column names, e.g. 'id' or 'name,phone'"
        )
    if len(set(names)) != len(names):
        raise DedupOptionError(option, text, "column names without repeats")
    return names


def parse_bool(option: str, text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise DedupOptionError(option, text, BOOLEAN_ACCEPTED)
    return value == "true"


def bool_text(value: bool) -> str:
    """A boolean as an option value: ``true`` or ``false``."""
    return "true" if value else "false"


def parse_choice(option: str, text: str, choices: tuple[str, ...]) -> str:
    for choice in choices:
        if choice.lower() == text.strip().lower():
            return choice
    raise DedupOptionError(option, text, "one of " + ", ".join(choices))


@dataclass(frozen=True)
class StorageBounds:
    """How long a storage call may take: to connect, for a silent socket, and in all (wall time
    of one operation, its retries included), in seconds."""

    connect_timeout: float = 5.0
    read_timeout: float = 20.0
    budget: float = 120.0

    @property
    def attempt(self) -> float:
        """The most one attempt may take: to connect, then a reply (each read of it is bounded
        by the read timeout, the attempt as a whole by this)."""
        return self.connect_timeout + 2 * self.read_timeout

    @property
    def start(self) -> float:
        """The most the check of a query's start (or a CLI command's) waits for the store: a
        store that does not answer then fails the start within seconds."""
        return min(self.budget, self.connect_timeout)


@dataclass(frozen=True)
class DedupOptions:
    """Every sink option, typed; the defaults pair with the constants above."""

    path: str
    keys: tuple[str, ...] | None = None
    expiry_key: str | None = None
    expiry_mode: ExpiryMode | None = None
    expiry_period: Span | None = None
    bucket_span: Span | None = None
    # None: not given; hash-bucket modes apply NUM_BUCKETS_DEFAULT, time-bucket modes refuse a
    # given value (they bucket by time: bucketSpan).
    num_buckets: int | None = None
    max_cached_buckets: int = MAX_CACHED_BUCKETS_DEFAULT
    max_cache_memory: Size = field(
        default_factory=lambda: parse_size(MAX_CACHE_MEMORY, MAX_CACHE_MEMORY_DEFAULT)
    )
    max_expiry_jump: Span | None = None
    store_path: str = ""
    output_format: str = OUTPUT_FORMAT_DEFAULT
    # iceberg only: properties for pyiceberg's load_catalog, and the tables' names.
    iceberg_catalog: dict[str, str] = field(default_factory=dict, repr=False)
    iceberg_namespace: str | None = None
    iceberg_table: str | None = None
    owner_timeout: Span = field(
        default_factory=lambda: parse_duration(OWNER_TIMEOUT, OWNER_TIMEOUT_DEFAULT)
    )
    # Secrets travel here (keys, tokens): never shown by repr, to_strings, logs or errors.
    storage_options: dict[str, object] = field(default_factory=dict, repr=False)
    # None: not given. Resolution applies ASSUME_SAME_EXPIRY_DEFAULT where the option applies
    # (tupleTime, ordered) and refuses a given value where it does not.
    assume_same_expiry: bool | None = None
    sequence_key: str | None = None
    # A local folder for the machine's shared, memory-mapped copy of the store's segments.
    state_cache_dir: str | None = STATE_CACHE_DIR_DEFAULT
    # How long each call to the store and the ports' storage may wait (StorageBounds).
    storage_connect_timeout: Span = field(
        default_factory=lambda: parse_duration(
            STORAGE_CONNECT_TIMEOUT, STORAGE_CONNECT_TIMEOUT_DEFAULT
        )
    )
    storage_read_timeout: Span = field(
        default_factory=lambda: parse_duration(STORAGE_READ_TIMEOUT, STORAGE_READ_TIMEOUT_DEFAULT)
    )
    storage_timeout: Span = field(
        default_factory=lambda: parse_duration(STORAGE_TIMEOUT, STORAGE_TIMEOUT_DEFAULT)
    )
    # Port compaction in the driver's commit: every N store versions (0: never), to this size.
    compact_every: int = COMPACT_EVERY_DEFAULT
    compact_target_size: Size = field(
        default_factory=lambda: parse_size(COMPACT_TARGET_SIZE, COMPACT_TARGET_SIZE_DEFAULT)
    )
    # None: not given (MERGE_SCHEMA_DEFAULT); shown by to_strings only when given.
    merge_schema: bool | None = None

    def __post_init__(self) -> None:
        if not self.store_path:
            object.__setattr__(self, "store_path", default_store_path(self.path))

    @property
    def storage_bounds(self) -> StorageBounds:
        return StorageBounds(
            self.storage_connect_timeout.micros / 1e6,
            self.storage_read_timeout.micros / 1e6,
            self.storage_timeout.micros / 1e6,
        )

    @property
    def merges_schema(self) -> bool:
        """Whether the port tables take an input whose columns differ (``mergeSchema``)."""
        return MERGE_SCHEMA_DEFAULT if self.merge_schema is None else self.merge_schema

    @property
    def has_expiry(self) -> bool:
        return self.expiry_key is not None or self.expiry_mode == "systemTime"

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> DedupOptions:
        """Parse Spark's string options (any case); unknown options are refused by name."""
        # Catalog property names keep their case (pyiceberg's are lower-case, some catalogs' not).
        catalog = parse_catalog_properties(raw)
        _refuse_unknown(
            {
                key: str(value)
                for key, value in raw.items()
                if not is_storage_option(key) and not is_catalog_property(key)
            }
        )
        given = {key.lower(): str(value) for key, value in raw.items()}
        storage = parse_storage_options(given)
        given = {
            key: value
            for key, value in given.items()
            if not is_storage_option(key) and not is_catalog_property(key)
        }

        def text(name: str) -> str | None:
            value = given.get(name.lower())
            return None if value is None or value.strip() == "" else value.strip()

        if text(PATH) is None:
            raise DedupOptionError(
                PATH, None, "the output directory URL, e.g. /data/out or hdfs://nn:8020/out"
            )
        values: dict[str, object] = {"storage_options": storage, "iceberg_catalog": catalog}
        for spec in OPTION_SPECS:
            value = text(spec.name)
            if value is not None:
                values[spec.attribute] = spec.parse(spec.name, value)
        options = cls(**values)  # type: ignore[arg-type]
        options._check_combinations()
        return options

    @property
    def hash_buckets(self) -> int:
        """The number of hash buckets, where keys are bucketed by hash."""
        return NUM_BUCKETS_DEFAULT if self.num_buckets is None else self.num_buckets

    @property
    def table_namespace(self) -> str:
        """The Iceberg namespace of the port tables."""
        return self.iceberg_namespace or ICEBERG_NAMESPACE_DEFAULT

    @property
    def table_prefix(self) -> str:
        """What the Iceberg port tables' names begin with: ``<table>_<port>``."""
        return self.iceberg_table or self.path.rstrip("/").rsplit("/", 1)[-1]

    def _check_combinations(self) -> None:
        """The rules for combining options that the options alone decide; the rules that need
        the stream's schema (and the mode a column implies) are ``engine.settings.resolve``'s."""
        self._check_iceberg()
        self._check_sequence()
        if self.compact_every and self.output_format not in TABLE_FORMATS:
            raise DedupOptionError(
                COMPACT_EVERY,
                str(self.compact_every),
                f"0 (off) with outputFormat={self.output_format}: only the tables of "
                "outputFormat=delta and iceberg are compacted (Parquet ports have no table log "
                "to swap files in)",
            )
        if self.expiry_mode not in (None, "systemTime") and self.expiry_key is None:
            raise DedupOptionError(
                EXPIRY_KEY,
                None,
                f"a column name: expiryMode={self.expiry_mode} needs an expiry key",
            )
        if self.expiry_mode == "systemTime" and self.expiry_key is not None:
            raise DedupOptionError(
                EXPIRY_KEY,
                self.expiry_key,
                "no expiry key with expiryMode=systemTime (it uses batch time)",
            )
        if self.has_expiry and self.expiry_period is None:
            needs = f"expiryMode={self.expiry_mode}" if self.expiry_mode else ""
            needs = needs or f"expiryKey={self.expiry_key}"
            raise DedupOptionError(EXPIRY_PERIOD, None, period_required(needs, self.expiry_mode))
        if self.assume_same_expiry is not None:
            if not self.has_expiry:
                raise misplaced_assume_same_expiry(self.assume_same_expiry, "Basic Dedup")
            if self.expiry_mode in ("systemTime", "categorical"):
                mode = f"expiryMode={self.expiry_mode}"
                raise misplaced_assume_same_expiry(self.assume_same_expiry, mode)
        if not self.has_expiry:
            for option, value in (
                (EXPIRY_PERIOD, self.expiry_period),
                (BUCKET_SPAN, self.bucket_span),
                (MAX_EXPIRY_JUMP, self.max_expiry_jump),
            ):
                if value is not None:
                    raise DedupOptionError(
                        option, value.text, "no value without an expiryKey or expiryMode=systemTime"
                    )

    def _check_sequence(self) -> None:
        """Sequence dedup names its producers, apart from the sequence column, and has nothing
        to expire."""
        if self.sequence_key is None:
            return
        if self.keys is None:
            raise DedupOptionError(
                KEYS,
                None,
                f"the producer columns: {SEQUENCE_KEY}={self.sequence_key} keeps the highest "
                "sequence id of each producer, so keys must name what identifies one",
            )
        expiry_only = (
            (EXPIRY_KEY, self.expiry_key),
            (EXPIRY_MODE, self.expiry_mode),
            (EXPIRY_PERIOD, self.expiry_period and self.expiry_period.text),
            (BUCKET_SPAN, self.bucket_span and self.bucket_span.text),
            (MAX_EXPIRY_JUMP, self.max_expiry_jump and self.max_expiry_jump.text),
            (
                ASSUME_SAME_EXPIRY,
                None if self.assume_same_expiry is None else bool_text(self.assume_same_expiry),
            ),
        )
        for option, value in expiry_only:
            if value is not None:
                raise DedupOptionError(
                    option,
                    value,
                    f"no value with {SEQUENCE_KEY}={self.sequence_key} (sequence dedup keeps "
                    "each producer's highest sequence id, which never expires)",
                )
        if self.sequence_key in self.keys:
            raise DedupOptionError(
                SEQUENCE_KEY,
                self.sequence_key,
                f"a column that is not one of the producer columns (keys={','.join(self.keys)})",
            )

    def _check_iceberg(self) -> None:
        iceberg_only = [
            (ICEBERG_NAMESPACE, self.iceberg_namespace),
            (ICEBERG_TABLE, self.iceberg_table),
            *(
                (ICEBERG_CATALOG_PREFIX + name, value)
                for name, value in self.iceberg_catalog.items()
            ),
        ]
        if self.output_format != "iceberg":
            for option, value in iceberg_only:
                if value is not None:
                    raise DedupOptionError(
                        option, value, "no value unless outputFormat=iceberg (the ports are tables)"
                    )
            return
        if not self.iceberg_catalog and "://" in self.path and not self.path.startswith("file:"):
            raise DedupOptionError(
                ICEBERG_CATALOG_PREFIX + "<property>",
                None,
                f"the catalog of the port tables (e.g. {ICEBERG_CATALOG_PREFIX}uri, "
                f"{ICEBERG_CATALOG_PREFIX}type): path {self.path} is not on the local disk, "
                "where an embedded SQLite catalog would serve",
            )

    def to_strings(self) -> dict[str, str]:
        """The options back as Spark strings (for the CLI and for logs); storage options are
        shown by name only, their values masked."""
        out = {}
        for spec in OPTION_SPECS:
            value = getattr(self, spec.attribute)
            if value is not None:
                out[spec.name] = spec.show(value)
        for name in self.storage_options:
            out[STORAGE_OPTION_PREFIX + name] = MASK
        for name, value in self.iceberg_catalog.items():
            out[ICEBERG_CATALOG_PREFIX + name] = MASK if is_secret_property(name) else value
        return out

    def mask(self, text: str) -> str:
        """``text`` with every storage option's value replaced by ``***``, but where the
        storage is (``masking.SHOWN_STORAGE_OPTIONS``: its endpoint, region, account), and
        every secret catalog property's value."""
        secrets = [*storage_secrets(self.storage_options), *catalog_secrets(self.iceberg_catalog)]
        return mask_values(text, secrets)

    @contextmanager
    def masking(self) -> Iterator[None]:
        """Re-raise a dedupsink error with the storage options' values masked: secrets travel
        in them, and a filesystem's message may quote one."""
        try:
            yield
        except DedupError as exc:
            masked = self.mask(str(exc))
            if masked != str(exc):
                exc.args = (masked,)
            raise


@dataclass(frozen=True)
class OptionSpec:
    """One sink option: its name as users write it, the ``DedupOptions`` field it sets, how its
    text is parsed (naming the option on failure) and how a value is written back."""

    name: str
    attribute: str
    parse: Callable[[str, str], object]
    show: Callable[[Any], str] = str


def _text_of(value: Span | Size) -> str:
    return value.text


OPTION_SPECS: tuple[OptionSpec, ...] = (
    OptionSpec(PATH, "path", lambda _, text: text.rstrip("/") or "/"),
    OptionSpec(KEYS, "keys", parse_columns, ",".join),
    OptionSpec(EXPIRY_KEY, "expiry_key", lambda _, text: text),
    OptionSpec(
        EXPIRY_MODE, "expiry_mode", lambda name, text: parse_choice(name, text, EXPIRY_MODES)
    ),
    OptionSpec(EXPIRY_PERIOD, "expiry_period", parse_span, _text_of),
    OptionSpec(BUCKET_SPAN, "bucket_span", parse_span, _text_of),
    OptionSpec(NUM_BUCKETS, "num_buckets", parse_positive_int),
    OptionSpec(MAX_CACHED_BUCKETS, "max_cached_buckets", parse_positive_int),
    OptionSpec(MAX_CACHE_MEMORY, "max_cache_memory", parse_size, _text_of),
    OptionSpec(MAX_EXPIRY_JUMP, "max_expiry_jump", parse_span, _text_of),
    OptionSpec(STORE_PATH, "store_path", lambda _, text: text.rstrip("/")),
    OptionSpec(
        OUTPUT_FORMAT, "output_format", lambda name, text: parse_choice(name, text, OUTPUT_FORMATS)
    ),
    OptionSpec(ICEBERG_NAMESPACE, "iceberg_namespace", lambda _, text: text),
    OptionSpec(ICEBERG_TABLE, "iceberg_table", lambda _, text: text),
    OptionSpec(OWNER_TIMEOUT, "owner_timeout", parse_duration, _text_of),
    OptionSpec(ASSUME_SAME_EXPIRY, "assume_same_expiry", parse_bool, bool_text),
    OptionSpec(SEQUENCE_KEY, "sequence_key", lambda _, text: text),
    OptionSpec(STATE_CACHE_DIR, "state_cache_dir", lambda _, text: text.rstrip("/") or "/"),
    OptionSpec(STORAGE_CONNECT_TIMEOUT, "storage_connect_timeout", parse_duration, _text_of),
    OptionSpec(STORAGE_READ_TIMEOUT, "storage_read_timeout", parse_duration, _text_of),
    OptionSpec(STORAGE_TIMEOUT, "storage_timeout", parse_duration, _text_of),
    OptionSpec(COMPACT_EVERY, "compact_every", parse_non_negative_int),
    OptionSpec(COMPACT_TARGET_SIZE, "compact_target_size", parse_size, _text_of),
    OptionSpec(MERGE_SCHEMA, "merge_schema", parse_bool, bool_text),
)
SINK_OPTIONS = tuple(spec.name for spec in OPTION_SPECS)


def is_storage_option(name: str) -> bool:
    return name.lower().startswith(STORAGE_OPTION_PREFIX)


def parse_storage_options(given: Mapping[str, str]) -> dict[str, object]:
    """``fs.<name>`` options as fsspec storage options: ``true``/``false`` become booleans,
    every other value stays a string."""
    parsed: dict[str, object] = {}
    for key, text in given.items():
        if not is_storage_option(key):
            continue
        name = key[len(STORAGE_OPTION_PREFIX) :]
        if not name:
            raise DedupOptionError(key, MASK, "fs.<name>, an fsspec storage option such as fs.key")
        lowered = text.strip().lower()
        parsed[name] = lowered == "true" if lowered in ("true", "false") else text
    return parsed


def is_catalog_property(name: str) -> bool:
    return name.lower().startswith(ICEBERG_CATALOG_PREFIX)


def parse_catalog_properties(raw: Mapping[str, str]) -> dict[str, str]:
    """``iceberg.catalog.<property>`` options as pyiceberg catalog properties."""
    properties = {}
    for key, value in raw.items():
        if not is_catalog_property(key):
            continue
        name = key[len(ICEBERG_CATALOG_PREFIX) :]
        if not name:
            raise DedupOptionError(
                key,
                str(value),
                f"{ICEBERG_CATALOG_PREFIX}<property>, e.g. {ICEBERG_CATALOG_PREFIX}uri",
            )
        properties[name] = str(value)
    return properties


# Refusals said alike by parsing and by resolution (where the mode is inferred from a column).


def period_required(setting: str, mode: str | None = None) -> str:
    """What a missing expiryPeriod is expected to be, naming the setting that requires it; the
    kind of value the mode takes where the mode is known, else each mode's."""
    kinds = {
        "tupleTime": DURATION_ACCEPTED,
        "systemTime": DURATION_ACCEPTED,
        "ordered": "a number in the expiry key's units",
        "categorical": "a count of categories",
    }
    if mode in kinds:
        return f"a period, required with {setting}: {kinds[mode]}"
    return (
        f"a period, required with {setting}: a duration such as '24 hours' for tupleTime and "
        "systemTime, a number in the expiry key's units for ordered, a count of categories "
        "for categorical"
    )


def misplaced_assume_same_expiry(value: bool, where: str) -> DedupOptionError:
    """The error for assumeSameExpiry in a mode it does not apply to."""
    return DedupOptionError(
        ASSUME_SAME_EXPIRY,
        bool_text(value),
        f"no value in {where}: it applies to expiryMode=tupleTime and expiryMode=ordered only",
    )


def close_match(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate most like ``name``, compared without case, as the candidate is spelt; None
    when none is close. The one source of every "did you mean" of options and columns."""
    by_lower = {candidate.lower(): candidate for candidate in candidates}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1)
    return by_lower[close[0]] if close else None


def _refuse_unknown(given: Mapping[str, str]) -> None:
    """Refuse an option no one reads, echoed as it arrived. Spark hands a Python data source
    its option names lower-cased, so the refusal of a lower-case name says that case does not
    matter: the user may have written ``expiryPeriode`` and sees ``expiryperiode``."""
    known = {name.lower() for name in SINK_OPTIONS}
    for name in given:
        if name.lower() in known or name.lower() in SPARK_OPTIONS:
            continue
        notes = ["option names are case-insensitive"] if name == name.lower() else []
        close = close_match(name, SINK_OPTIONS)
        if close is not None:
            notes.append(f"did you mean {close}?")
        hint = f" ({'; '.join(notes)})" if notes else ""
        raise DedupOptionError(
            name, given[name], "a known option" + hint + ": " + ", ".join(SINK_OPTIONS)
        )


def default_store_path(path: str) -> str:
    """Where the store goes when ``storePath`` is not given: ``<path>/_store``."""
    return f"{path.rstrip('/')}/{STORE_DIRNAME_DEFAULT}"
