"""Spark's hash(...) over Arrow: the values Spark's own Murmur3Hash gives, type by type."""

from __future__ import annotations

import datetime
import decimal
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from dedupsink.engine.fingerprint import UnsupportedKeyType
from dedupsink.engine.sparkhash import SEED, hash_int, spark_hash, spark_hashable

# Values Spark 4.3 gave for hash(i), hash(s), hash(l) and hash(i, s, l) of these rows.
SPARK_ROWS = [
    ((1, "a", 1), (-559580957, 1485273170, -1712319331, -1210269203)),
    ((-7, "abcde", -2), (-1618159745, 814637928, -981642528, 1960476830)),
    ((2147483647, "héllo", 2**40), (133916647, 1212979866, -1596767687, -1206234657)),
]


def test_known_values_of_ints_strings_longs_and_their_combination() -> None:
    i = pa.array([row[0] for row, _ in SPARK_ROWS], pa.int32())
    s = pa.array([row[1] for row, _ in SPARK_ROWS], pa.string())
    n = pa.array([row[2] for row, _ in SPARK_ROWS], pa.int64())
    expected = np.array([values for _, values in SPARK_ROWS]).T
    assert spark_hash([i]).tolist() == expected[0].tolist()
    assert spark_hash([s]).tolist() == expected[1].tolist()
    assert spark_hash([n]).tolist() == expected[2].tolist()
    assert spark_hash([i, s, n]).tolist() == expected[3].tolist()
    assert hash_int(1) == expected[0][0]


def test_a_null_leaves_the_running_hash_unchanged() -> None:
    s = pa.array(["a", None], pa.string())
    n = pa.array([None, 1], pa.int64())
    assert spark_hash([pa.array([None, None], pa.int32())]).tolist() == [SEED, SEED]
    assert spark_hash([s, n]).tolist() == [spark_hash([s])[0], spark_hash([n])[1]]


def test_slices_large_strings_views_and_dictionaries_hash_as_their_values() -> None:
    values = [str(uuid.UUID(int=i)) for i in range(40)] + ["", "abc", None, "日本語"]
    plain = spark_hash([pa.array(values)])
    assert spark_hash([pa.array(values, pa.large_string())]).tolist() == plain.tolist()
    assert spark_hash([pa.array(values, pa.string_view())]).tolist() == plain.tolist()
    assert spark_hash([pa.array(values).dictionary_encode()]).tolist() == plain.tolist()
    assert spark_hash([pa.array(values)[5:30]]).tolist() == plain[5:30].tolist()
    chunked = pa.chunked_array([pa.array(values[:10]), pa.array(values[10:])])
    assert spark_hash([chunked]).tolist() == plain.tolist()


def test_strings_of_one_length_and_of_many_hash_alike() -> None:
    """The one-length path (contiguous rows as a matrix) and the grouped path agree."""
    same = [f"{i:08d}" for i in range(100)]
    mixed = [*same, "x" * 13]
    assert spark_hash([pa.array(mixed)])[:100].tolist() == spark_hash([pa.array(same)]).tolist()


@pytest.mark.parametrize(
    "kind", [pa.uint64(), pa.uint8(), pa.list_(pa.int64()), pa.struct([("a", pa.int64())])]
)
def test_types_spark_hashes_otherwise_are_refused(kind: pa.DataType) -> None:
    assert not spark_hashable([pa.int64(), kind])
    with pytest.raises(UnsupportedKeyType):
        spark_hash([pa.array([None], kind)])


def test_supported_types_are_hashable() -> None:
    kinds = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.bool_(), pa.float32()]
    kinds += [pa.float64(), pa.date32(), pa.timestamp("us", "UTC"), pa.timestamp("us")]
    kinds += [pa.string(), pa.large_binary(), pa.decimal128(10, 2), pa.decimal128(30, 2)]
    assert spark_hashable(kinds)


@pytest.mark.spark
def test_every_supported_type_hashes_as_spark_does(spark: Any) -> None:
    from pyspark.sql import functions as F

    strings = ["", "a", "ab", "abc", "abcd", "abcde", "héllo wörld", "日本語テキスト", "x" * 13]
    strings += [None, "\xff\x80", "123e4567-e89b-12d3-a456-426614174000", "y" * 200]
    rows = []
    epoch = datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.UTC)
    for i, text in enumerate(strings * 3):
        j = i - 15
        rows.append(
            (
                i,
                text,
                j,
                j * 10**12 - 7,
                j % 3 == 0,
                float(j) / 3 if j else -0.0,
                float("nan") if j == 4 else float(j) * 1.5,
                decimal.Decimal(j) / 7,
                decimal.Decimal(j) * decimal.Decimal(10**25) + j,
                datetime.date(2020, 1, 1) + datetime.timedelta(days=j),
                epoch + datetime.timedelta(seconds=j * 1001),
                datetime.datetime(2024, 5, 1) + datetime.timedelta(microseconds=j * 123457),
                bytes([j % 256, 0x80, 1][: i % 4]) if i % 5 else None,
                j % 100,
                j * 1000 % 30000,
            )
        )
    schema = (
        "i INT, s STRING, n INT, l BIGINT, b BOOLEAN, f FLOAT, d DOUBLE, dec DECIMAL(10,4), "
        "big DECIMAL(30,2), dt DATE, ts TIMESTAMP, ntz TIMESTAMP_NTZ, bin BINARY, by TINYINT, "
        "sh SMALLINT"
    )
    df = spark.createDataFrame(rows, schema)
    columns = [name for name in df.columns if name != "i"]
    combos = [[name] for name in columns] + [["s", "l"], ["n", "s", "dec"], ["ts", "bin", "big"]]
    hashes = [F.hash(*combo).alias("h_" + "_".join(combo)) for combo in combos]
    table = df.select("i", *columns, *hashes).orderBy("i").toArrow()
    for combo in combos:
        expected = table.column("h_" + "_".join(combo)).to_pylist()
        got = spark_hash([table.column(name) for name in combo]).tolist()
        assert got == expected, combo


@pytest.mark.spark
def test_hash_int_is_sparks_hash_of_an_int_literal(spark: Any) -> None:
    from pyspark.sql import functions as F

    values = [0, 1, -1, 7, 2**31 - 1, -(2**31)]
    row = spark.range(1).select(*(F.hash(F.lit(v)).alias(f"h{k}") for k, v in enumerate(values)))
    got = row.collect()[0]
    assert [got[f"h{k}"] for k in range(len(values))] == [hash_int(v) for v in values]
