"""The port formats by name (``outputFormat``): a new format is one module and one entry."""

from __future__ import annotations

from dedupsink.options import DedupOptions
from dedupsink.ports.base import PortFormat
from dedupsink.ports.delta import DeltaPorts
from dedupsink.ports.iceberg import IcebergPorts
from dedupsink.ports.output import FileStats
from dedupsink.ports.parquet import ParquetPorts

FORMATS: dict[str, type[PortFormat]] = {
    ParquetPorts.name: ParquetPorts,
    DeltaPorts.name: DeltaPorts,
    IcebergPorts.name: IcebergPorts,
}


def port_format(options: DedupOptions, file_stats: FileStats = None) -> PortFormat:
    """The ports of ``options.path`` in the format the options name; ``file_stats``: the
    statistics its tasks work out (``PortFormat.file_stats``)."""
    return FORMATS[options.output_format](options, file_stats)
