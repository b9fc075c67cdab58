"""Options: ``DedupOptions.parse`` and ``engine.settings.resolve`` against Arrow schemas.

Covers case-insensitive option names, durations and numbers, defaults (all columns as the key,
nested ``a.b`` keys, inferred modes, bucket layout) and that every refused option raises a
``DedupOptionError`` naming the option, the bad value and what is accepted.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from dedupsink.engine.settings import Settings, resolve
from dedupsink.errors import DedupOptionError
from dedupsink.options import NUM_BUCKETS_DEFAULT, DedupOptions
from dedupsink.units import parse_duration

SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("ts", pa.timestamp("us")),
        ("day", pa.date32()),
        ("seq", pa.int64()),
        ("score", pa.float64()),
        ("category", pa.string()),
        ("flag", pa.bool_()),
        ("tags", pa.list_(pa.string())),
        ("attrs", pa.map_(pa.string(), pa.int32())),
        ("customer", pa.struct([("id", pa.int64()), ("name", pa.string())])),
    ]
)
SCALAR_SCHEMA = pa.schema([("id", pa.string()), ("seq", pa.int64()), ("ts", pa.timestamp("ms"))])


def settings_of(raw: dict[str, str], schema: pa.Schema = SCHEMA) -> Settings:
    return resolve(DedupOptions.parse({"path": "/out", **raw}), schema)


def option_error(raw: dict[str, str], schema: pa.Schema = SCHEMA) -> DedupOptionError:
    with pytest.raises(DedupOptionError) as caught:
        resolve(DedupOptions.parse(raw), schema)
    return caught.value


def assert_names(error: DedupOptionError, option: str, value: object, *accepted: str) -> None:
    """The error names the option and the value, and says what would have been accepted."""
    message = str(error)
    assert error.option == option
    assert error.value == value
    assert option in message
    if value is not None:
        assert repr(value) in message
    for text in accepted:
        assert text in message


# -- parsing ------------------------------------------------------------------------------


def test_option_names_are_case_insensitive() -> None:
    options = DedupOptions.parse(
        {"PATH": "/out/", "KEYS": "id", "EXPIRYKEY": "ts", "expiryperiod": "24 hours"}
    )
    assert options.path == "/out"
    assert options.keys == ("id",)
    assert options.expiry_key == "ts"
    assert options.expiry_period is not None and options.expiry_period.micros == 86_400_000_000


def test_expiry_mode_value_is_case_insensitive() -> None:
    options = DedupOptions.parse(
        {"path": "/o", "expiryKey": "category", "expiryMode": "CATEGORICAL", "expiryPeriod": "3"}
    )
    assert options.expiry_mode == "categorical"


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        ("24 hours", 86_400_000_000),
        ("90 minutes", 5_400_000_000),
        ("30 s", 30_000_000),
        ("1 day", 86_400_000_000),
        ("2 weeks", 1_209_600_000_000),
        ("1.5h", 5_400_000_000),
        ("500 ms", 500_000),
        ("250 milliseconds", 250_000),
        ("10 us", 10),
        ("3 secs", 3_000_000),
        (" 7 MINUTES ", 420_000_000),
    ],
)
def test_durations_parse_to_microseconds(text: str, micros: int) -> None:
    assert parse_duration("expiryPeriod", text).micros == micros


def test_store_path_defaults_under_path() -> None:
    assert DedupOptions.parse({"path": "/data/out/"}).store_path == "/data/out/_store"
    assert DedupOptions.parse({"path": "/o", "storePath": "/s/"}).store_path == "/s"


def test_spark_own_options_are_ignored() -> None:
    options = DedupOptions.parse({"path": "/o", "checkpointLocation": "/c", "queryName": "q"})
    assert options.path == "/o"


def test_options_round_trip_through_strings() -> None:
    raw = {"path": "/o", "keys": "id,seq", "expiryKey": "ts", "expiryPeriod": "1 day"}
    options = DedupOptions.parse(raw)
    assert DedupOptions.parse(options.to_strings()) == options


# -- parse errors -------------------------------------------------------------------------


def test_missing_path_is_refused() -> None:
    error = option_error({"keys": "id"})
    assert_names(error, "path", None, "output directory URL")


def test_blank_path_is_refused() -> None:
    assert option_error({"path": "  "}).option == "path"


def test_unknown_option_is_refused_with_a_suggestion() -> None:
    error = option_error({"path": "/o", "expiryPeriode": "1 day"})
    assert_names(error, "expiryPeriode", "1 day", "(did you mean expiryPeriod?)", "bucketSpan")


def test_unknown_option_as_spark_hands_it_says_names_are_case_insensitive() -> None:
    """Spark lower-cases a Python data source's option names before the sink sees them, so the
    name echoed is not the one typed; the refusal says why, and still finds the option meant."""
    error = option_error({"path": "/o", "expiryperiode": "1 day"})
    message = str(error)
    assert_names(error, "expiryperiode", "1 day")
    assert "(option names are case-insensitive; did you mean expiryPeriod?)" in message
    assert len(message.splitlines()) == 1


def test_unknown_option_without_a_close_match_lists_the_known_ones() -> None:
    error = option_error({"path": "/o", "zzz": "1"})
    assert "did you mean" not in str(error)
    assert "maxCachedBuckets" in str(error)


@pytest.mark.parametrize("text", ["ten hours", "5 fortnights", "hours", "1 day 2 hours"])
def test_bad_duration_is_refused(text: str) -> None:
    error = option_error({"path": "/o", "expiryKey": "ts", "expiryPeriod": text})
    assert_names(error, "expiryPeriod", text, "'24 hours'", "'90 minutes'", "'30 s'")


@pytest.mark.parametrize("text", ["-5", "0", "0 s", "-1 hours", "0.0", "inf"])
def test_negative_or_zero_period_is_refused(text: str) -> None:
    error = option_error({"path": "/o", "expiryKey": "seq", "expiryPeriod": text})
    assert_names(error, "expiryPeriod", text, "positive")


def test_expiry_mode_without_expiry_key_is_refused() -> None:
    error = option_error({"path": "/o", "expiryMode": "ordered", "expiryPeriod": "5"})
    assert_names(error, "expiryKey", None, "a column name", "expiryMode=ordered")


def test_unknown_expiry_mode_is_refused() -> None:
    error = option_error({"path": "/o", "expiryKey": "ts", "expiryMode": "wallClock"})
    assert_names(error, "expiryMode", "wallClock", "tupleTime, systemTime, ordered, categorical")


def test_expiry_key_with_system_time_is_refused() -> None:
    raw = {"path": "/o", "expiryKey": "ts", "expiryMode": "systemTime", "expiryPeriod": "1 h"}
    assert_names(option_error(raw), "expiryKey", "ts", "systemTime")


def test_expiry_key_without_period_is_refused() -> None:
    error = option_error({"path": "/o", "expiryKey": "ts"})
    assert_names(error, "expiryPeriod", None, "required")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"expiryKey": "ts"},
            "option expiryPeriod is missing: expected a period, required with expiryKey=ts: a "
            "duration such as '24 hours' for tupleTime and systemTime, a number in the expiry "
            "key's units for ordered, a count of categories for categorical",
        ),
        (
            {"expiryMode": "systemTime"},
            "option expiryPeriod is missing: expected a period, required with "
            "expiryMode=systemTime: a duration such as '24 hours', '90 minutes', '30 s' or "
            "'500 ms'",
        ),
        (
            {"expiryKey": "seq", "expiryMode": "ordered"},
            "option expiryPeriod is missing: expected a period, required with "
            "expiryMode=ordered: a number in the expiry key's units",
        ),
        (
            {"keys": "id"},  # no path
            "option path is missing: expected the output directory URL, e.g. /data/out or "
            "hdfs://nn:8020/out",
        ),
    ],
)
def test_a_missing_option_is_said_to_be_missing(raw: dict[str, str], message: str) -> None:
    assert str(option_error({"path": "/o", **raw} if "keys" not in raw else raw)) == message


def test_a_period_refused_by_an_inferred_mode_says_the_mode_was_inferred() -> None:
    """A time held as text (ts STRING) infers categorical: the refusal of a duration says so
    and names the mode that reads the text as times."""
    schema = pa.schema([("id", pa.string()), ("ts", pa.string())])
    raw = {"path": "/o", "keys": "id", "expiryKey": "ts", "expiryPeriod": "1 hour"}
    assert str(option_error(raw, schema)) == (
        "option expiryPeriod='1 hour' is invalid: expected a count of categories with "
        "expiryMode=categorical, the mode inferred from column 'ts' of type string: for times "
        "written as text, set expiryMode=tupleTime (it reads ISO-8601 text)"
    )
    assert settings_of({**raw, "expiryMode": "tupleTime"}, schema).period == 3_600_000_000
    # given, not inferred, the mode is not said to be inferred
    assert str(option_error({**raw, "expiryMode": "categorical"}, schema)) == (
        "option expiryPeriod='1 hour' is invalid: expected a count of categories with "
        "expiryMode=categorical"
    )
    # a number inferred to be ordered, a timestamp inferred to be tupleTime
    assert str(option_error({**raw, "expiryKey": "seq"})) == (
        "option expiryPeriod='1 hour' is invalid: expected a plain number in the expiry key's "
        "units with expiryMode=ordered, the mode inferred from column 'seq' of type int64"
    )
    assert str(option_error({**raw, "expiryPeriod": "24"})) == (
        "option expiryPeriod='24' is invalid: expected a duration such as '24 hours' with "
        "expiryMode=tupleTime, the mode inferred from column 'ts' of type timestamp[us]"
    )


def test_period_without_expiry_is_refused() -> None:
    error = option_error({"path": "/o", "expiryPeriod": "1 day"})
    assert_names(error, "expiryPeriod", "1 day", "expiryKey")


@pytest.mark.parametrize("text", ["0", "-3", "many", "1.5"])
def test_num_buckets_must_be_a_positive_whole_number(text: str) -> None:
    error = option_error({"path": "/o", "numBuckets": text})
    assert_names(error, "numBuckets", text, "positive whole number")


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [("128 MB", 128 * 2**20), ("512m", 512 * 2**20), ("1.5 GiB", 3 * 2**29), ("65536", 65536)],
)
def test_cache_memory_reads_binary_sizes(text: str, nbytes: int) -> None:
    options = DedupOptions.parse({"path": "/o", "maxCacheMemory": text})
    assert options.max_cache_memory.nbytes == nbytes


def test_cache_memory_defaults_to_64_mb() -> None:
    assert DedupOptions.parse({"path": "/o"}).max_cache_memory.nbytes == 64 * 2**20


@pytest.mark.parametrize("text", ["0", "-1 MB", "lots", "12 parsecs", "0.1 b"])
def test_cache_memory_must_be_a_positive_size(text: str) -> None:
    error = option_error({"path": "/o", "maxCacheMemory": text})
    assert_names(error, "maxCacheMemory", text, "'128 MB'", "number of bytes")


@pytest.mark.parametrize("text", ["id,id", "id,", ","])
def test_malformed_key_lists_are_refused(text: str) -> None:
    assert option_error({"path": "/o", "keys": text}).option == "keys"


def test_unknown_output_format_is_refused() -> None:
    error = option_error({"path": "/o", "outputFormat": "csv"})
    assert_names(error, "outputFormat", "csv", "parquet")


# -- resolution against a schema ----------------------------------------------------------


def test_default_key_is_all_columns() -> None:
    settings = settings_of({}, SCALAR_SCHEMA)
    assert settings.mode == "basic"
    assert settings.keys == ("id", "seq", "ts")
    assert settings.key_types == ("string", "int64", "timestamp[ms]")
    assert settings.bucket_count == 64


def test_default_key_with_a_list_column_asks_for_explicit_keys() -> None:
    error = option_error({"path": "/o"})
    assert error.option == "keys"
    assert "'tags'" in str(error)
    assert "set keys explicitly" in str(error)


def test_nested_key_resolves_to_the_struct_field() -> None:
    settings = settings_of({"keys": "customer.id,id"})
    assert settings.keys == ("customer.id", "id")
    assert settings.key_types == ("int64", "string")


def test_whole_struct_key_is_accepted() -> None:
    assert settings_of({"keys": "customer"}).key_types[0].startswith("struct<")


@pytest.mark.parametrize("keys", ["nope", "id,nope", "customer.nope", "id.sub"])
def test_unknown_key_column_is_refused(keys: str) -> None:
    error = option_error({"path": "/o", "keys": keys})
    assert_names(error, "keys", keys, "columns of the stream", "not one of")


@pytest.mark.parametrize(
    ("raw", "option", "value"),
    [
        ({"keys": "id,sqe"}, "keys", "id,sqe"),
        ({"keys": "Seq"}, "keys", "Seq"),
        ({"keys": "id", "expiryKey": "sqe", "expiryPeriod": "10"}, "expiryKey", "sqe"),
        ({"keys": "id", "sequenceKey": "sqe"}, "sequenceKey", "sqe"),
    ],
    ids=["keys", "keys-in-another-case", "expiryKey", "sequenceKey"],
)
def test_a_misspelt_column_gets_a_did_you_mean(
    raw: dict[str, str], option: str, value: str
) -> None:
    """Every option naming a column suggests the column spelt most like it, after the list."""
    error = option_error({"path": "/o", **raw})
    assert_names(error, option, value, str(SCHEMA.names), "(did you mean 'seq'?)")
    assert len(str(error).splitlines()) == 1


@pytest.mark.parametrize(
    "raw",
    [
        {"keys": "zzz"},
        {"keys": "id", "expiryKey": "zzz", "expiryPeriod": "10"},
        {"keys": "id", "sequenceKey": "zzz"},
    ],
    ids=["keys", "expiryKey", "sequenceKey"],
)
def test_a_column_like_none_gets_no_did_you_mean(raw: dict[str, str]) -> None:
    error = option_error({"path": "/o", **raw})
    assert str(SCHEMA.names) in str(error)
    assert "did you mean" not in str(error)


@pytest.mark.parametrize(("keys", "kind"), [("tags", "list<"), ("attrs", "map<")])
def test_list_and_map_key_columns_are_refused(keys: str, kind: str) -> None:
    error = option_error({"path": "/o", "keys": keys})
    assert_names(error, "keys", keys, "comparable types", kind)


def test_unknown_expiry_column_is_refused() -> None:
    error = option_error({"path": "/o", "keys": "id", "expiryKey": "when", "expiryPeriod": "1 h"})
    assert_names(error, "expiryKey", "when", "a column of the stream", "'ts'")


@pytest.mark.parametrize(
    ("column", "mode"),
    [("ts", "tupleTime"), ("day", "tupleTime"), ("seq", "ordered"), ("score", "ordered")],
)
def test_mode_is_inferred_from_the_expiry_column_type(column: str, mode: str) -> None:
    period = "1 day" if mode == "tupleTime" else "10"
    assert settings_of({"keys": "id", "expiryKey": column, "expiryPeriod": period}).mode == mode


def test_string_expiry_column_infers_categorical() -> None:
    settings = settings_of({"keys": "id", "expiryKey": "category", "expiryPeriod": "3"})
    assert (settings.mode, settings.period, settings.span) == ("categorical", 3, None)


def test_expiry_column_of_an_uninterpretable_type_is_refused() -> None:
    error = option_error({"path": "/o", "keys": "id", "expiryKey": "flag", "expiryPeriod": "1"})
    assert_names(error, "expiryKey", "flag", "timestamp, date, numeric or string", "bool")


@pytest.mark.parametrize(
    ("column", "mode", "period"),
    [
        ("seq", "tupleTime", "1 day"),
        ("flag", "ordered", "10"),
        ("ts", "ordered", "10"),
        ("attrs", "categorical", "3"),
    ],
)
def test_expiry_column_type_that_does_not_fit_the_mode_is_refused(
    column: str, mode: str, period: str
) -> None:
    raw = {"path": "/o", "keys": "id", "expiryKey": column, "expiryMode": mode}
    error = option_error({**raw, "expiryPeriod": period})
    assert_names(error, "expiryMode", mode, f"column {column!r}")


@pytest.mark.parametrize("kind", [pa.binary(), pa.large_binary(), pa.binary(4)])
def test_a_binary_expiry_column_is_refused_as_categories(kind: pa.DataType) -> None:
    """Categories are text; a value that is not UTF-8 would fail its task at every retry."""
    schema = pa.schema([("id", pa.int64()), ("release", kind)])
    raw = {"path": "/o", "keys": "id", "expiryKey": "release", "expiryMode": "categorical"}
    error = option_error({**raw, "expiryPeriod": "3"}, schema)
    assert_names(error, "expiryMode", "categorical", "column 'release'")


@pytest.mark.parametrize(
    ("column", "period", "accepted"),
    [
        ("ts", "86400", "a duration"),
        ("seq", "24 hours", "a plain number"),
        ("category", "1 day", "a count of categories"),
        ("category", "2.5", "whole number of categories"),
    ],
)
def test_period_must_suit_the_mode(column: str, period: str, accepted: str) -> None:
    error = option_error({"path": "/o", "keys": "id", "expiryKey": column, "expiryPeriod": period})
    assert_names(error, "expiryPeriod", period, accepted)


def test_system_time_period_must_be_a_duration() -> None:
    raw = {"path": "/o", "keys": "id", "expiryMode": "systemTime", "expiryPeriod": "30"}
    assert_names(option_error(raw), "expiryPeriod", "30", "a duration", "systemTime")


def test_time_modes_convert_durations_to_microseconds() -> None:
    settings = settings_of(
        {
            "keys": "id",
            "expiryKey": "ts",
            "expiryPeriod": "24 hours",
            "bucketSpan": "90 minutes",
            "maxExpiryJump": "30 s",
        }
    )
    assert settings.period == 86_400_000_000
    assert settings.span == 5_400_000_000
    assert settings.bucket_count == 16
    assert settings.max_expiry_jump == 30_000_000


def test_ordered_mode_keeps_plain_numbers() -> None:
    settings = settings_of({"keys": "id", "expiryKey": "seq", "expiryPeriod": "100"})
    assert (settings.period, settings.span, settings.bucket_count) == (100, 6, 17)
    assert settings.stamp_kind == "int"


def test_float_expiry_column_stores_float_stamps() -> None:
    settings = settings_of({"keys": "id", "expiryKey": "score", "expiryPeriod": "2.5"})
    assert settings.stamp_kind == "float"
    assert settings.span == pytest.approx(2.5 / 16)


def test_max_expiry_jump_must_suit_the_mode() -> None:
    raw = {"path": "/o", "keys": "id", "expiryKey": "seq", "expiryPeriod": "10"}
    error = option_error({**raw, "maxExpiryJump": "1 day"})
    assert_names(error, "maxExpiryJump", "1 day", "a plain number")


def test_bucket_span_longer_than_the_period_is_refused() -> None:
    raw = {"path": "/o", "keys": "id", "expiryKey": "ts", "expiryPeriod": "1 hour"}
    error = option_error({**raw, "bucketSpan": "2 hours"})
    assert_names(error, "bucketSpan", "2 hours", "at most the expiry period", "1 hour")


def test_bucket_span_equal_to_the_period_gives_one_bucket() -> None:
    raw = {"keys": "id", "expiryKey": "seq", "expiryPeriod": "10", "bucketSpan": "10"}
    assert settings_of(raw).bucket_count == 1


def test_bucket_span_is_refused_in_hash_bucketed_modes() -> None:
    raw = {"path": "/o", "keys": "id", "expiryMode": "systemTime", "expiryPeriod": "1 h"}
    error = option_error({**raw, "bucketSpan": "1 minute"})
    assert_names(error, "bucketSpan", "1 minute", "numBuckets")


@pytest.mark.parametrize(
    "raw",
    [
        {"keys": "id", "expiryKey": "ts", "expiryPeriod": "1 hour"},
        {"keys": "id", "expiryKey": "seq", "expiryPeriod": "100", "assumeSameExpiry": "true"},
    ],
    ids=["tupleTime", "ordered"],
)
def test_num_buckets_is_refused_where_keys_are_bucketed_by_time(raw: dict[str, str]) -> None:
    error = option_error({"path": "/o", **raw, "numBuckets": "32"})
    assert_names(error, "numBuckets", "32", "assumeSameExpiry=true", "bucketSpan")


def test_hash_bucketed_modes_take_the_default_number_of_buckets() -> None:
    for raw in ({"keys": "id"}, {"keys": "id", "expiryMode": "systemTime", "expiryPeriod": "1 h"}):
        assert settings_of(raw).bucket_count == NUM_BUCKETS_DEFAULT


def test_system_time_needs_no_expiry_column() -> None:
    settings = settings_of({"keys": "id", "expiryMode": "systemTime", "expiryPeriod": "30 s"})
    assert (settings.mode, settings.expiry_key, settings.period) == ("systemTime", None, 30_000_000)


def test_nested_expiry_column_is_found() -> None:
    settings = settings_of({"keys": "id", "expiryKey": "customer.id", "expiryPeriod": "5"})
    assert (settings.mode, settings.expiry_type) == ("ordered", "int64")


def test_identity_leaves_out_max_expiry_jump() -> None:
    raw = {"keys": "id", "expiryKey": "ts", "expiryPeriod": "1 day"}
    plain = settings_of(raw)
    jumpy = settings_of({**raw, "maxExpiryJump": "2 days"})
    assert plain.identity() == jumpy.identity()
    assert "max_expiry_jump" not in plain.identity()


# -- assumeSameExpiry -------------------------------------------------------------------------

TIME_RAW = {"keys": "id", "expiryKey": "ts", "expiryPeriod": "1 hour"}


@pytest.mark.parametrize(
    ("text", "value"), [("true", True), ("FALSE", False), (" False ", False), ("True", True)]
)
def test_assume_same_expiry_reads_true_or_false_in_any_case(text: str, value: bool) -> None:
    options = DedupOptions.parse({"path": "/o", **TIME_RAW, "ASSUMESAMEEXPIRY": text})
    assert options.assume_same_expiry is value


@pytest.mark.parametrize("text", ["yes", "0", "f", "truee"])
def test_assume_same_expiry_must_be_true_or_false(text: str) -> None:
    error = option_error({"path": "/o", **TIME_RAW, "assumeSameExpiry": text})
    assert_names(error, "assumeSameExpiry", text, "true or false")


def test_assume_same_expiry_defaults_to_true_with_time_buckets() -> None:
    settings = settings_of(TIME_RAW)
    assert settings.assume_same_expiry is True
    assert settings.buckets_by_time
    assert settings.identity()["assume_same_expiry"] is True


@pytest.mark.parametrize(
    "raw",
    [
        TIME_RAW,
        {"keys": "id", "expiryKey": "seq", "expiryPeriod": "100"},
        {"keys": "id", "expiryKey": "score", "expiryPeriod": "2.5"},
    ],
    ids=["tupleTime", "ordered-int", "ordered-float"],
)
def test_assume_same_expiry_false_buckets_by_key_hash(raw: dict[str, str]) -> None:
    settings = settings_of({**raw, "assumeSameExpiry": "false", "numBuckets": "32"})
    assert settings.assume_same_expiry is False
    assert not settings.buckets_by_time
    assert settings.stores_stamps
    assert (settings.span, settings.bucket_count) == (None, 32)
    assert settings.identity()["assume_same_expiry"] is False


def test_assume_same_expiry_false_refuses_a_bucket_span() -> None:
    raw = {"path": "/o", **TIME_RAW, "assumeSameExpiry": "false", "bucketSpan": "5 minutes"}
    error = option_error(raw)
    assert_names(error, "bucketSpan", "5 minutes", "assumeSameExpiry=false", "numBuckets")


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        ({"keys": "id"}, "Basic Dedup"),
        ({"keys": "id", "expiryMode": "systemTime", "expiryPeriod": "1 h"}, "systemTime"),
        ({"keys": "id", "expiryKey": "category", "expiryPeriod": "3"}, "categorical"),
        (
            {
                "keys": "id",
                "expiryKey": "category",
                "expiryMode": "categorical",
                "expiryPeriod": "3",
            },
            "categorical",
        ),
    ],
    ids=["basic", "systemTime", "categorical-inferred", "categorical-given"],
)
@pytest.mark.parametrize("text", ["true", "false"])
def test_assume_same_expiry_is_refused_where_it_does_not_apply(
    raw: dict[str, str], where: str, text: str
) -> None:
    error = option_error({"path": "/o", **raw, "assumeSameExpiry": text})
    assert_names(error, "assumeSameExpiry", text, where, "tupleTime", "ordered")


def test_assume_same_expiry_round_trips_through_strings() -> None:
    options = DedupOptions.parse({"path": "/o", **TIME_RAW, "assumeSameExpiry": "FALSE"})
    assert options.to_strings()["assumeSameExpiry"] == "false"
    assert DedupOptions.parse(options.to_strings()) == options
    assert "assumeSameExpiry" not in DedupOptions.parse({"path": "/o", **TIME_RAW}).to_strings()
