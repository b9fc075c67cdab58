"""The port formats by name (``outputFormat``), and the compactors of the table formats: a new
format is one module and one entry (and one compactor, if its ports are tables)."""

from __future__ import annotations

from dedupsink.errors import PortTableError
from dedupsink.options import DedupOptions
from dedupsink.ports.base import PortFormat
from dedupsink.ports.compaction import TableCompactor
from dedupsink.ports.delta import DeltaPorts
from dedupsink.ports.delta_compaction import DeltaCompactor
from dedupsink.ports.iceberg import IcebergPorts
from dedupsink.ports.iceberg_compaction import IcebergCompactor
from dedupsink.ports.output import FileStats
from dedupsink.ports.parquet import ParquetPorts

FORMATS: dict[str, type[PortFormat]] = {
    ParquetPorts.name: ParquetPorts,
    DeltaPorts.name: DeltaPorts,
    IcebergPorts.name: IcebergPorts,
}
# Parquet ports have none: without a table log there is no commit that swaps files, so a
# rewrite would show a reader listing the folder rows twice or not at all (README).
COMPACTORS: dict[str, type[TableCompactor]] = {
    DeltaPorts.name: DeltaCompactor,
    IcebergPorts.name: IcebergCompactor,
}


def port_format(options: DedupOptions, file_stats: FileStats = None) -> PortFormat:
    """The ports of ``options.path`` in the format the options name; ``file_stats``: the
    statistics its tasks work out (``PortFormat.file_stats``)."""
    return FORMATS[options.output_format](options, file_stats)


def compactor_for(ports: PortFormat) -> TableCompactor:
    """The compactor of ``ports``' tables; an error for a format without tables."""
    compactor = COMPACTORS.get(ports.name)
    if compactor is None:
        raise PortTableError(
            f"outputFormat={ports.name} ports cannot be compacted: only the tables of "
            "outputFormat=delta and iceberg can (Parquet ports have no table log to swap files "
            "in; see README, 'Compacting the ports')"
        )
    return compactor(ports)
