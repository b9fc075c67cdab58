"""``dedupsink compact``: the small files of Delta or Iceberg port tables rewritten into fewer,
larger ones, one table commit a port that changes no data (``ports/compaction.py``).

Safe while a query writes to the ports: a window's commit and a compaction each take the next
table version only if it is free, and the loser reads the table again. Parsing and printing
only; Parquet ports are refused with what to do instead.
"""

from __future__ import annotations

import argparse

from dedupsink.engine.classify import PORTS
from dedupsink.errors import DedupOptionError
from dedupsink.inspection import Location
from dedupsink.inspection.location import TableNames
from dedupsink.options import (
    ICEBERG_CATALOG_PREFIX,
    OUTPUT_FORMAT_DEFAULT,
    TABLE_FORMATS,
    DedupOptions,
    parse_catalog_properties,
)
from dedupsink.ports.compaction import TARGET_SIZE_DEFAULT, PortCompaction, compact_ports
from dedupsink.ports.formats import compactor_for, port_format
from dedupsink.units import parse_size

TARGET_SIZE_ARGUMENT = "--target-size"
DESCRIPTION = (
    "Rewrite the small files of an output's port tables into fewer, larger ones: one table "
    "commit a port that changes no data, safe while a query writes to the ports (no Spark). It "
    "works on ports written as Delta or Iceberg tables (the sink's outputFormat=delta or "
    "iceberg; an Iceberg output in another catalog than its embedded one needs --catalog). "
    "Parquet ports, the default, have no table log to compact in and are refused. See the "
    "README, 'Compacting the ports'."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        TARGET_SIZE_ARGUMENT,
        metavar="SIZE",
        default=TARGET_SIZE_DEFAULT,
        help=f"the size compacted files aim at, e.g. '64 MB' (default {TARGET_SIZE_DEFAULT}); "
        "files this large or larger are left as they are",
    )
    parser.add_argument(
        "--port",
        dest="ports",
        action="append",
        choices=PORTS,
        help="compact only this port (repeatable; default: all four)",
    )
    add_catalog_arguments(parser)


def add_catalog_arguments(parser: argparse.ArgumentParser) -> None:
    """Where an output's Iceberg tables are named: ``--catalog``, ``--namespace``, ``--table``
    (``compact`` and ``inspect``)."""
    parser.add_argument(
        "--catalog",
        dest="catalog",
        action="append",
        default=[],
        metavar="PROPERTY=VALUE",
        help="Iceberg: a catalog property (repeatable), as the sink's iceberg.catalog.<property> "
        "options; none: the embedded catalog of a local output",
    )
    parser.add_argument("--namespace", help="Iceberg: the sink's iceberg.namespace")
    parser.add_argument("--table", help="Iceberg: the sink's iceberg.table")


def tables_of(args: argparse.Namespace) -> TableNames:
    """The ``--catalog``, ``--namespace`` and ``--table`` arguments."""
    return TableNames(catalog_properties(args.catalog), args.namespace, args.table)


def compact(location: Location, args: argparse.Namespace) -> list[PortCompaction]:
    """Compact the ports of ``location`` as the arguments say."""
    target = parse_size(TARGET_SIZE_ARGUMENT, args.target_size)
    store = location.store()
    manifest = store.read()
    if location.output_url is None:
        raise DedupOptionError("PATH", location.store_url, "a store whose output path is known")
    recorded = OUTPUT_FORMAT_DEFAULT if manifest is None else manifest.settings.output_format
    if recorded not in TABLE_FORMATS:
        raise DedupOptionError(
            "PATH",
            location.output_url,
            f"an output of Delta or Iceberg ports: its ports are outputFormat={recorded}, "
            "which have no table log to compact in (see README, 'Compacting the ports')",
        )
    options = DedupOptions(
        path=location.output_url,
        store_path=location.store_url,
        output_format=recorded,
        storage_options=location.storage_options,
        iceberg_catalog=catalog_properties(args.catalog),
        iceberg_namespace=args.namespace,
        iceberg_table=args.table,
    )
    ports = port_format(options)
    with options.masking():
        return compact_ports(compactor_for(ports), target.nbytes, args.ports or PORTS)


def catalog_properties(items: list[str]) -> dict[str, str]:
    """``--catalog PROPERTY=VALUE`` arguments as the sink's parsed catalog properties."""
    pairs = {}
    for item in items:
        name, separator, value = item.partition("=")
        if not separator or not name.strip():
            raise DedupOptionError("--catalog", item.split("=")[0], "PROPERTY=VALUE, e.g. uri=...")
        pairs[ICEBERG_CATALOG_PREFIX + name.strip()] = value
    return parse_catalog_properties(pairs)


def render(results: list[PortCompaction], output_url: str | None) -> str:
    """One line a port, then the total."""
    lines = [f"compacted the ports of {output_url}:"]
    lines += [f"  {result.line()}" for result in results]
    before = sum(r.files_before for r in results)
    after = sum(r.files_after for r in results)
    lines.append(f"  files: {before} -> {after}")
    return "\n".join(lines)
