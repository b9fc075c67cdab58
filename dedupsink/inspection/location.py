"""Where a store and its ports are: an output path (``<path>/_store`` is its store) or a store
path (its ports are found next to it when it is the default ``_store`` folder)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dedupsink.errors import ConfigError
from dedupsink.options import OUTPUT_FORMAT_DEFAULT, STORE_DIRNAME_DEFAULT, DedupOptions
from dedupsink.ports.base import PortFormat
from dedupsink.ports.formats import port_format
from dedupsink.ports.output import Output
from dedupsink.store.format import Manifest
from dedupsink.store.storage import Storage, resolve_path
from dedupsink.store.store import LOG_DIR, BucketStore, find_store

__all__ = ["Location", "TableNames", "locate"]


@dataclass(frozen=True)
class TableNames:
    """Where Iceberg port tables are named, as the sink's ``iceberg.*`` options say: catalog
    properties (none: the embedded catalog of a local output), namespace and table."""

    catalog: dict[str, str] = field(default_factory=dict, repr=False)
    namespace: str | None = None
    table: str | None = None


@dataclass(frozen=True)
class Location:
    """A store and, when known, the output root whose ports it commits, with the storage
    options to reach them (never shown) and where its Iceberg tables are named."""

    store_url: str
    output_url: str | None
    storage_options: dict[str, Any] = field(default_factory=dict, repr=False)
    tables: TableNames = field(default_factory=TableNames)

    def store(self) -> BucketStore:
        return BucketStore(self.store_url, self.storage_options)

    def output(self) -> Output | None:
        return None if self.output_url is None else Output(self.output_url, self.storage_options)

    def ports(self, manifest: Manifest | None) -> PortFormat | None:
        """The ports in the format the store was created with (Iceberg tables in the catalog
        ``tables`` names)."""
        if self.output_url is None:
            return None
        recorded = OUTPUT_FORMAT_DEFAULT if manifest is None else manifest.settings.output_format
        options = DedupOptions(
            path=self.output_url,
            store_path=self.store_url,
            output_format=recorded,
            storage_options=self.storage_options,
            iceberg_catalog=self.tables.catalog,
            iceberg_namespace=self.tables.namespace,
            iceberg_table=self.tables.table,
        )
        return port_format(options)


def locate(
    path: str,
    store: str | None = None,
    storage_options: dict[str, Any] | None = None,
    tables: TableNames | None = None,
) -> Location:
    """Find the store of an output path, or the ports of a store path."""
    options = dict(storage_options or {})
    tables = tables or TableNames()
    url = resolve_path(path).rstrip("/")
    if store is not None:
        store_url = resolve_path(store).rstrip("/")
        Storage.for_url(store_url, options, "--store").check_reachable("--store")
        return Location(store_url, url, options, tables)
    # One request on an object store, so that no credentials, no endpoint or no bucket is
    # said as such, not as "no dedup store" or the client's traceback.
    Storage.for_url(url, options, "PATH").check_reachable("PATH")
    found = find_store(url, options)
    if found is not None:
        return Location(found[0], found[1], options, tables)
    raise ConfigError(
        "PATH",
        f"no dedup store at {url} (looked for {url}/{LOG_DIR} and "
        f"{url}/{STORE_DIRNAME_DEFAULT}/{LOG_DIR}); pass an output path or a store path",
    )
