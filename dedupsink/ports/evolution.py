"""Schema evolution of the port tables (``mergeSchema``): which differences between an input's
columns and a port table's the table takes, and the one-line refusals of the others.

Both sides are given as a format's own (column, type) pairs, top-level columns in order
(``delta._shape``, ``iceberg._shape``), so the rules speak the format's types. With
``mergeSchema=true`` a column new in the input is added at the end of the table (nullable), a
table column the input lacks is null in the input's rows, and a type changes only by a widening
the format's specification lists; without it, any difference is refused. The key and expiry
columns never reach here changed: the store's settings record their types
(``store.check_settings``). The tables change in the commit of the window that first carries
the new schema (``delta.commit_entry``'s ``metaData``, Iceberg's ``union_by_name`` in the
snapshot's transaction), never at query start.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from dedupsink.errors import DedupOptionError
from dedupsink.options import MERGE_SCHEMA, OUTPUT_FORMAT, bool_text

Shape = list[tuple[str, str]]  # (column, type text), top-level, in order


@dataclass(frozen=True)
class Widening:
    """The type changes a format's specification lets a table make, and how to say them."""

    allows: Callable[[str, str], bool]  # (table's type, input's type) -> allowed
    accepted: str


@dataclass(frozen=True)
class Evolution:
    """How an input's columns differ from a table's, every difference one the table takes."""

    added: tuple[str, ...] = ()  # new in the input: added at the end, nullable
    missing: tuple[str, ...] = ()  # the table's, not the input's: null in the input's rows
    widened: tuple[tuple[str, str, str], ...] = ()  # (column, table's type, input's type)

    @property
    def changes_table(self) -> bool:
        return bool(self.added or self.widened)

    def text(self) -> str:
        parts = [f"{name}: {old} -> {new}" for name, old, new in self.widened]
        parts += [f"{name} is new" for name in self.added]
        parts += [f"{name} is missing" for name in self.missing]
        return "; ".join(parts)


def check_evolution(
    fmt: str,
    table: str,
    wanted: Shape,
    found: Shape,
    required: frozenset[str],
    merge: bool | None,
    widening: Widening,
) -> Evolution:
    """The evolution ``table`` (``the Delta table <uri>``) takes for an input of columns
    ``wanted``; refuses, in one line, a type change that is no widening, a missing column the
    table declares NOT NULL, and any difference without ``mergeSchema=true``."""
    found_types, wanted_types = dict(found), dict(wanted)
    changed = [
        (name, found_types[name], kind)
        for name, kind in wanted
        if name in found_types and found_types[name] != kind
    ]
    for name, old, new in changed:
        if not widening.allows(old, new):
            raise DedupOptionError(
                OUTPUT_FORMAT,
                fmt,
                f"an input whose column {name} keeps the type of {table} or widens it "
                f"({name}: {old} -> {new}; {widening.accepted}); write to a new path, or cast "
                "the column, for another type",
            )
    evolution = Evolution(
        added=tuple(name for name, _ in wanted if name not in found_types),
        missing=tuple(name for name, _ in found if name not in wanted_types),
        widened=tuple(changed),
    )
    for name in evolution.missing:
        if name in required:
            raise DedupOptionError(
                OUTPUT_FORMAT,
                fmt,
                f"an input with the column {name}, which {table} declares NOT NULL (a column "
                "missing from the input is written as null)",
            )
    if (evolution.changes_table or evolution.missing) and not merge:
        raise DedupOptionError(
            MERGE_SCHEMA,
            None if merge is None else bool_text(merge),
            f"true to take an input whose columns differ from those of {table} "
            f"({evolution.text()}): "
            "new columns are added, missing ones written as null; without it the columns must "
            "match",
        )
    return evolution


# -- each format's widenings ---------------------------------------------------------------------

_DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)")

# Iceberg's specification, "Schema Evolution": int -> long, float -> double, and a decimal's
# precision raised at the same scale.
ICEBERG_WIDENING = Widening(
    allows=lambda old, new: (
        (old, new) in (("int", "long"), ("float", "double")) or _decimal_widens(old, new)
    ),
    accepted="Iceberg widens int -> long, float -> double, decimal(P, S) -> decimal(P', S) "
    "with P' > P",
)
# Delta changes a column's type only with its typeWidening table feature (reader and writer):
# the sink does not write it, since every reader of the table would then need it.
DELTA_WIDENING = Widening(
    allows=lambda old, new: False,
    accepted="a Delta table widens no column: that needs its typeWidening table feature, "
    "which the sink does not write",
)
# Parquet folders have no table schema: Spark's reader merges the files' schemas on read
# (mergeSchema), which fails on one column of two types.
PARQUET_WIDENING = Widening(
    allows=lambda old, new: False,
    accepted="Parquet ports widen no column: Spark's reader, merging the files' schemas, "
    "refuses a column of two types",
)


def _decimal_widens(old: str, new: str) -> bool:
    was, now = _DECIMAL.fullmatch(old), _DECIMAL.fullmatch(new)
    if was is None or now is None:
        return False
    return int(now.group(2)) == int(was.group(2)) and int(now.group(1)) > int(was.group(1))


def arrow_shape(schema: pa.Schema) -> Shape:
    """An Arrow schema as (column, type) pairs, nullability and metadata aside."""
    return [(field.name, str(field.type)) for field in schema]
