"""Spark's hash(...) over Arrow: the values Spark's own Murmur3Hash gives, type by type."""

from __future__ import annotations

import datetime
import decimal
import random
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from dedupsink.engine.fingerprint import UnsupportedKeyType
from dedupsink.engine.sparkhash import SEED, hash_int, spark_hash, spark_hashable

D = decimal.Decimal
UTC = datetime.UTC

# (Arrow type, value, what Spark 4.3's SQL hash(...) of that value of that type gave).
SPARK_VALUES: list[tuple[pa.DataType, Any, int]] = [
    (pa.int32(), 0, 933211791),
    (pa.int32(), 1, -559580957),
    (pa.int32(), -1, -1604776387),
    (pa.int32(), 7, 1079293707),
    (pa.int32(), 2**31 - 1, 133916647),
    (pa.int32(), -(2**31), 723455942),
    (pa.int8(), -5, 1369497261),
    (pa.int8(), -128, 1110053733),
    (pa.int16(), -300, -1692660704),
    (pa.int16(), 32767, 1249274084),
    (pa.bool_(), True, -559580957),
    (pa.bool_(), False, 933211791),
    (pa.int64(), 0, -1670924195),
    (pa.int64(), 1, -1712319331),
    (pa.int64(), -1, -939490007),
    (pa.int64(), 2**40, -1596767687),
    (pa.int64(), 2**63 - 1, -1604625029),
    (pa.int64(), -(2**63), -853646085),
    (pa.float32(), 0.0, 933211791),
    (pa.float32(), -0.0, 933211791),
    (pa.float32(), float("nan"), -349261430),
    (pa.float32(), 1.5, -221251528),
    (pa.float32(), float("-inf"), 427440766),
    (pa.float64(), 0.0, -1670924195),
    (pa.float64(), -0.0, -1670924195),
    (pa.float64(), float("nan"), -1281358385),
    (pa.float64(), -2.25, 170083257),
    (pa.float64(), float("inf"), 833680482),
    (pa.date32(), datetime.date(2024, 5, 1), -1880666920),
    (pa.date32(), datetime.date(1969, 12, 31), -1604776387),
    (
        pa.timestamp("us", "UTC"),
        datetime.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC),
        -624382164,
    ),
    (pa.timestamp("us", "UTC"), datetime.datetime(1900, 1, 1, tzinfo=UTC), 785859604),
    (pa.timestamp("us"), datetime.datetime(1969, 12, 31, 23, 59, 59, 999999), -939490007),
    (pa.decimal128(10, 4), D("123.4567"), 1295238093),
    (pa.decimal128(10, 4), D("-123.4567"), 1097290729),
    (pa.decimal128(18, 0), D(10**18 - 1), -1795328666),
    (pa.decimal128(18, 0), D(1 - 10**18), 1962370902),
    (pa.decimal128(19, 0), D(10**19 - 1), 584036537),
    (pa.decimal128(19, 0), D(1 - 10**19), -66784248),
    (pa.decimal128(30, 2), D(0), -783713497),
    (pa.decimal128(30, 2), D(-1), -893129661),
    (pa.decimal128(30, 2), D("-0.01"), 1398487324),
    (pa.decimal128(30, 2), D("1.28"), -544401882),
    (pa.decimal128(30, 2), D("12345678901234567890123.45"), 992557280),
    (pa.decimal128(30, 2), D("-12345678901234567890123.45"), -241151136),
    (pa.decimal128(30, 0), D(-128), 775851899),
    (pa.decimal128(38, 0), D(10**38 - 1), -817514053),
    (pa.decimal128(38, 0), D(1 - 10**38), 1400911110),
    (pa.string(), "héllo", 1212979866),
    (pa.string(), "日本語", -1143049834),
    (pa.string(), "ü", -1098725648),
    (pa.string(), "€uro", -1829438951),
    (pa.binary(), b"", 142593372),
    (pa.binary(), b"\x80", 775851899),
    (pa.binary(), b"\xff\x7f\x80", -1080783321),
    (pa.binary(), b"\x01\x02\x03\x04\x80\xff", -1145114843),
    (pa.binary(), b"\xff\xff\xff\xff\x80", 2067484405),
    (pa.binary(), b"\x00\x00\x00\x00\xfe\x7f", -1278125776),
]
# Spark's hash('abcdefghijklm'[:k]) for k = 0..13: every count of words and of trailing bytes.
SPARK_PREFIXES = [
    142593372,
    1485273170,
    -97053317,
    1322437556,
    -396302900,
    814637928,
    724255765,
    2132013596,
    -804741815,
    -1830117711,
    -1837419305,
    731715327,
    -1271380920,
    1587760139,
]
SUPPORTED = [
    pa.int8(),
    pa.int16(),
    pa.int32(),
    pa.int64(),
    pa.bool_(),
    pa.float32(),
    pa.float64(),
    pa.date32(),
    pa.timestamp("us", "UTC"),
    pa.timestamp("us"),
    pa.string(),
    pa.large_string(),
    pa.string_view(),
    pa.binary(),
    pa.large_binary(),
    pa.binary_view(),
    pa.decimal128(10, 2),
    pa.decimal128(30, 2),
    pa.dictionary(pa.int32(), pa.string()),
    pa.null(),
]
UNSUPPORTED = [
    pa.uint8(),
    pa.uint32(),
    pa.uint64(),
    pa.float16(),
    pa.timestamp("ns"),
    pa.date64(),
    pa.time64("us"),
    pa.binary(16),
    pa.decimal256(40, 2),
    pa.list_(pa.int64()),
    pa.struct([("a", pa.int64())]),
    pa.map_(pa.string(), pa.int64()),
    pa.dictionary(pa.int32(), pa.uint16()),
]


def reference_bytes_hash(data: bytes, seed: int = SEED) -> int:
    """Murmur3_x86_32.hashUnsafeBytes, one byte at a time as the Java source reads."""

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    def mix_k1(k1: int) -> int:
        return rotl(k1 * 0xCC9E2D51 & 0xFFFFFFFF, 15) * 0x1B873593 & 0xFFFFFFFF

    def mix_h1(h1: int, k1: int) -> int:
        return (rotl(h1 ^ k1, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF

    h1 = seed & 0xFFFFFFFF
    aligned = len(data) - len(data) % 4
    for i in range(0, aligned, 4):
        h1 = mix_h1(h1, mix_k1(int.from_bytes(data[i : i + 4], "little")))
    for byte in data[aligned:]:
        h1 = mix_h1(h1, mix_k1((byte - 256 if byte >= 128 else byte) & 0xFFFFFFFF))
    h1 ^= len(data)
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & 0xFFFFFFFF
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & 0xFFFFFFFF
    h1 ^= h1 >> 16
    return h1 - 2**32 if h1 >= 2**31 else h1


@pytest.mark.parametrize(("kind", "value", "expected"), SPARK_VALUES)
def test_values_hash_as_spark_hashed_them(kind: pa.DataType, value: Any, expected: int) -> None:
    assert spark_hash([pa.array([value], kind)]).tolist() == [expected]


def test_every_count_of_words_and_trailing_bytes() -> None:
    prefixes = ["abcdefghijklm"[:k] for k in range(14)]
    assert spark_hash([pa.array(prefixes)]).tolist() == SPARK_PREFIXES
    assert [reference_bytes_hash(p.encode()) for p in prefixes] == SPARK_PREFIXES


def test_hash_int_is_murmur3_hash_int() -> None:
    for kind, value, expected in SPARK_VALUES:
        if kind == pa.int32():
            assert hash_int(value) == expected
    assert hash_int(8, seed=hash_int(7)) == 1822376539  # Spark's hash(7, 8)
    with pytest.raises(ValueError):
        hash_int(2**31)


def test_the_result_is_int32() -> None:
    result = spark_hash([pa.array([1, 2], pa.int64())])
    assert result.dtype == np.int32


def test_columns_fold_left_to_right_with_the_running_hash_as_seed() -> None:
    ints, text, longs = pa.array([1], pa.int32()), pa.array(["a"]), pa.array([1], pa.int64())
    assert spark_hash([ints, text, longs]).tolist() == [-1210269203]  # Spark's hash(1, 'a', 1L)
    pair = [pa.array([True]), pa.array([False])]
    assert spark_hash(pair).tolist() == [292098604]  # Spark's hash(true, false)
    xs, ys = [-3, 0, 5, 2**31 - 1], [9, -9, 0, 1]
    folded = [hash_int(y, seed=hash_int(x)) for x, y in zip(xs, ys, strict=True)]
    assert spark_hash([pa.array(xs, pa.int32()), pa.array(ys, pa.int32())]).tolist() == folded


def test_a_null_leaves_the_running_hash_unchanged() -> None:
    assert spark_hash([pa.array([None, None], pa.int32())]).tolist() == [SEED, SEED]
    assert spark_hash([pa.array([None], pa.null())]).tolist() == [SEED]
    nulls = [pa.array([None], pa.int32()), pa.array([None], pa.string())]
    assert spark_hash(nulls).tolist() == [SEED]  # Spark's hash(NULL, NULL)
    a, b = pa.array(["a"]), pa.array(["b"])
    assert spark_hash([a, pa.array([None], pa.int32()), b]).tolist() == [190734147]
    assert spark_hash([a, b]).tolist() == [190734147]  # Spark's hash('a', 'b') alike
    for kind, value, _ in SPARK_VALUES:
        mixed = pa.array([value, None, value], kind)
        alone = spark_hash([pa.array([value], kind)])[0]
        assert spark_hash([mixed]).tolist() == [alone, SEED, alone], kind


def test_sliced_arrays_hash_as_their_rows() -> None:
    """Arrow arrays with a non-zero offset (bit offsets of booleans and validity included)."""
    rng = random.Random(3)
    for kind in {kind for kind, _, _ in SPARK_VALUES}:
        pool = [value for k, value, _ in SPARK_VALUES if k == kind] + [None]
        whole = pa.array([rng.choice(pool) for _ in range(45)], kind)
        expected = spark_hash([whole]).tolist()
        for start in (1, 3, 8, 13):
            assert spark_hash([whole[start:]]).tolist() == expected[start:], kind
            assert spark_hash([whole[start : start + 9]]).tolist() == expected[start : start + 9]


def test_string_layouts_hash_alike() -> None:
    values = [str(uuid.UUID(int=i)) for i in range(40)] + ["", "abc", None, "日本語", "z" * 300]
    plain = spark_hash([pa.array(values)]).tolist()
    for kind in (pa.large_string(), pa.string_view()):
        assert spark_hash([pa.array(values, kind)]).tolist() == plain
    encoded = [None if v is None else v.encode() for v in values]
    for kind in (pa.binary(), pa.large_binary(), pa.binary_view()):
        assert spark_hash([pa.array(encoded, kind)]).tolist() == plain
    assert spark_hash([pa.array(values, pa.large_string())[5:30]]).tolist() == plain[5:30]


def test_dictionary_and_chunked_columns_hash_as_their_values() -> None:
    values = ["x", "yy", None, "x", "zzzzz", "yy"]
    plain = spark_hash([pa.array(values)]).tolist()
    assert spark_hash([pa.array(values).dictionary_encode()]).tolist() == plain
    assert spark_hash([pa.array(values).dictionary_encode()[2:]]).tolist() == plain[2:]
    # Chunks of one column, each with a dictionary of its own.
    chunked = pa.chunked_array([pa.array(v).dictionary_encode() for v in (values[:2], values[2:])])
    assert spark_hash([chunked]).tolist() == plain
    ints = pa.chunked_array([[1, None], [], [-1]], pa.int64())
    together = spark_hash([pa.array([1, None, -1], pa.int64()), pa.array(values[:3])])
    assert spark_hash([ints, chunked.slice(0, 3)]).tolist() == together.tolist()


def test_bytes_of_any_length_at_any_offset_match_the_reference() -> None:
    """Mixed lengths, starts at every byte offset, high bytes in the trailing positions."""
    rng = random.Random(7)
    for longest in (3, 9, 40, 700):
        values = [
            None if rng.random() < 0.05 else rng.randbytes(rng.randint(0, longest))
            for _ in range(300)
        ]
        array = pa.array(values, pa.binary())
        expected = [SEED if v is None else reference_bytes_hash(v) for v in values]
        assert spark_hash([array]).tolist() == expected
        assert spark_hash([array[7:]]).tolist() == expected[7:]


def test_large_decimals_hash_their_minimal_two_complement_bytes() -> None:
    rng = random.Random(11)
    edges = [0, 1, -1, 127, 128, -128, -129, 255, 256, -256, -257, 2**63, -(2**63)]
    values = edges + [rng.randint(1 - 10**38, 10**38 - 1) for _ in range(200)]
    array = pa.array([D(v) for v in values], pa.decimal128(38, 0))
    expected = []
    for v in values:
        size = (~v if v < 0 else v).bit_length() // 8 + 1  # BigInteger.toByteArray's length
        expected.append(reference_bytes_hash(v.to_bytes(size, "big", signed=True)))
    assert spark_hash([array]).tolist() == expected


def test_every_nan_hashes_as_the_canonical_one() -> None:
    payloads = np.array([0x7FF0000000000001, 0xFFF8000000000000], dtype=np.uint64)
    doubles = pa.array(payloads.view(np.float64))
    assert spark_hash([doubles]).tolist() == [-1281358385, -1281358385]
    floats = pa.array(np.array([0x7F800001, 0xFFC00000], dtype=np.uint32).view(np.float32))
    assert spark_hash([floats]).tolist() == [-349261430, -349261430]


def test_coarser_timestamps_hash_as_their_microseconds() -> None:
    micros = pa.array([1_714_564_800_000_000, -1_000_000], pa.timestamp("us"))
    expected = spark_hash([micros]).tolist()
    for unit in ("s", "ms"):
        assert spark_hash([micros.cast(pa.timestamp(unit))]).tolist() == expected


def test_supported_types_are_hashable() -> None:
    assert spark_hashable(SUPPORTED)
    assert spark_hashable([])


@pytest.mark.parametrize("kind", UNSUPPORTED, ids=str)
def test_types_spark_hashes_otherwise_are_refused(kind: pa.DataType) -> None:
    assert not spark_hashable([pa.int64(), kind])
    with pytest.raises(UnsupportedKeyType):
        spark_hash([pa.array([1, 2], pa.int64()), pa.array([None, None], kind)])


def test_columns_must_be_given_and_of_one_length() -> None:
    with pytest.raises(ValueError):
        spark_hash([])
    with pytest.raises(ValueError):
        spark_hash([pa.array([1, 2]), pa.array([1])])
    assert spark_hash([pa.array([], pa.string())]).tolist() == []


def _spark_rows() -> tuple[str, list[tuple[Any, ...]]]:
    """Rows covering every supported type: nulls, edges, every string length up to 13."""
    strings: list[str | None] = ["abcdefghijklm"[:k] for k in range(14)]
    strings += ["héllo wörld", "日本語テキスト", "ü", "€", "\U0001f600x", None, "\x7f\x80"]
    strings += ["123e4567-e89b-12d3-a456-426614174000", "y" * 200, "長" * 333 + "z"]
    binaries: list[bytes | None] = [bytes([0x80 + k] * k) for k in range(9)]
    binaries += [b"\xff\x7f\x80\x00\x01", None, bytes(range(256))]
    ints = [0, 1, -1, 2**31 - 1, -(2**31), None, 12345, -99]
    longs = [0, -1, 2**63 - 1, -(2**63), None, 2**40 + 3, -(10**15)]
    floats = [0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1.5, -3.25e-7, None]
    doubles = [0.0, -0.0, float("nan"), float("-inf"), 1e300, -2.5, None, 5e-324]
    small = [D("123.4567"), D("-123.4567"), D(0), None, D("999999.9999"), D("-0.0001")]
    big = [D(0), D(-1), D("1.28"), D("-1.28"), D("-0.01"), None]
    big += [D("9999999999999999999999999999.99"), D("-12345678901234567890123.45")]
    huge = [D(10**38 - 1), D(1 - 10**38), D(-128), D(2**64), None, D(2**63 - 1)]
    epoch = datetime.datetime(1970, 1, 1, tzinfo=UTC)
    rows = []
    for i in range(3 * len(strings)):
        day = datetime.timedelta(days=(i * 7919) % 40000 - 20000)
        rows.append(
            (
                i,
                strings[i % len(strings)],
                binaries[i % len(binaries)],
                ints[i % len(ints)],
                longs[i % len(longs)],
                [127, -128, 0, None, -1][i % 5],
                [32767, -32768, 0, None, 300][i % 5],
                [True, False, None][i % 3],
                floats[i % len(floats)],
                doubles[i % len(doubles)],
                small[i % len(small)],
                big[i % len(big)],
                huge[i % len(huge)],
                None if i % 11 == 4 else datetime.date(1970, 1, 1) + day,
                None if i % 13 == 5 else epoch + day + datetime.timedelta(microseconds=i * 7777),
                None if i % 9 == 2 else datetime.datetime(1969, 12, 31) + day / 3,
            )
        )
    schema = (
        "id INT, s STRING, bin BINARY, i INT, l BIGINT, b TINYINT, sh SMALLINT, t BOOLEAN, "
        "f FLOAT, d DOUBLE, small DECIMAL(10,4), big DECIMAL(30,2), huge DECIMAL(38,0), "
        "dt DATE, ts TIMESTAMP, ntz TIMESTAMP_NTZ"
    )
    return schema, rows


@pytest.mark.spark
def test_every_supported_type_hashes_as_spark_does(spark: Any) -> None:
    from pyspark.sql import functions as F

    schema, rows = _spark_rows()
    df = spark.createDataFrame(rows, schema)
    columns = [name for name in df.columns if name != "id"]
    combos = [[name] for name in columns]
    combos += [["s", "l"], ["i", "s", "small"], ["ts", "bin", "big"], ["t", "f", "d", "huge"]]
    combos += [["ntz", "dt", "sh", "b"], columns]
    hashes = [F.hash(*combo).alias(f"h{k}") for k, combo in enumerate(combos)]
    table = df.select("id", *columns, *hashes).orderBy("id").toArrow()
    assert table.column("id").to_pylist() == list(range(len(rows)))
    for k, combo in enumerate(combos):
        expected = table.column(f"h{k}").to_pylist()
        got = spark_hash([table.column(name) for name in combo]).tolist()
        assert got == expected, combo


@pytest.mark.spark
def test_hash_partitioning_is_pmod_of_the_hash(spark: Any) -> None:
    """What the hash is for: Spark's repartition by columns puts a row in pmod(hash, N)."""
    from pyspark.sql import functions as F

    schema, rows = _spark_rows()
    df = spark.createDataFrame(rows, schema).repartition(5, "s", "l", "big")
    table = df.select("id", "s", "l", "big", F.spark_partition_id().alias("p")).toArrow()
    hashes = spark_hash([table.column("s"), table.column("l"), table.column("big")])
    assert np.mod(hashes.astype(np.int64), 5).tolist() == table.column("p").to_pylist()
    literals = [0, 1, -1, 7, 2**31 - 1, -(2**31)]
    row = spark.range(1).select(*(F.hash(F.lit(v)).alias(f"h{k}") for k, v in enumerate(literals)))
    got = row.collect()[0]
    assert [got[f"h{k}"] for k in range(len(literals))] == [hash_int(v) for v in literals]
