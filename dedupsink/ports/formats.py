"""The port formats by name (``outputFormat``), and the compactors of the table formats: a new
format is one module and one entry (and one compactor, if its ports are tables)."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from dedupsink.errors import PortTableError
from dedupsink.options import DedupOptions
from dedupsink.ports.output import FileStats

if TYPE_CHECKING:
    from dedupsink.ports.base import PortFormat
    from dedupsink.ports.compaction import TableCompactor

# Each by its module and class, imported when a query uses it: Spark's planner and commit
# processes import the sink afresh for a query's first batch, and a format's modules (its
# table log, schema evolution, compactor) cost those processes tens of milliseconds each. An
# entry may also be the class itself (the fault tests put subclasses in place).
FORMATS: dict[str, str | type[PortFormat]] = {
    "parquet": "dedupsink.ports.parquet:ParquetPorts",
    "delta": "dedupsink.ports.delta:DeltaPorts",
    "iceberg": "dedupsink.ports.iceberg:IcebergPorts",
}
# Parquet ports have none: without a table log there is no commit that swaps files, so a
# rewrite would show a reader listing the folder rows twice or not at all (README).
COMPACTORS: dict[str, str | type[TableCompactor]] = {
    "delta": "dedupsink.ports.delta_compaction:DeltaCompactor",
    "iceberg": "dedupsink.ports.iceberg_compaction:IcebergCompactor",
}


def _class_of(where: str | type) -> type:
    if isinstance(where, type):
        return where
    module, _, name = where.partition(":")
    kind: type = getattr(import_module(module), name)
    return kind


def port_format(options: DedupOptions, file_stats: FileStats = None) -> PortFormat:
    """The ports of ``options.path`` in the format the options name; ``file_stats``: the
    statistics its tasks work out (``PortFormat.file_stats``)."""
    ports: PortFormat = _class_of(FORMATS[options.output_format])(options, file_stats)
    return ports


def compactor_for(ports: PortFormat) -> TableCompactor:
    """The compactor of ``ports``' tables; an error for a format without tables."""
    where = COMPACTORS.get(ports.name)
    if where is None:
        raise PortTableError(
            f"outputFormat={ports.name} ports cannot be compacted: only the tables of "
            "outputFormat=delta and iceberg can (Parquet ports have no table log to swap files "
            "in; see README, 'Compacting the ports')"
        )
    compactor: TableCompactor = _class_of(where)(ports)
    return compactor
