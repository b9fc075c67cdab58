"""What a store and its ports hold, read from disk without Spark: ``inspect_store`` answers
``dedupsink inspect`` with an ``Inspection``, whose ``to_dict()`` is what ``--json`` prints.

The store's latest manifest is read through ``BucketStore``, the ports through their format;
sequence dedup's producers are counted from every segment (one entry a producer)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

import numpy as np

from dedupsink.engine.classify import PORTS
from dedupsink.engine.fingerprint import Fingerprints
from dedupsink.engine.sequence import highest_per_producer
from dedupsink.engine.settings import TIME_BUCKET_MODES
from dedupsink.inspection.jsonout import column, document, moment_text, window_record
from dedupsink.inspection.location import Location
from dedupsink.inspection.points import PointDomain, json_number, point_text
from dedupsink.inspection.verdict import Holder, Verdict, judge
from dedupsink.ports.base import CatalogInfo, PortFormat, recorded_schema
from dedupsink.store.cache import BucketCache, BucketManager
from dedupsink.store.format import Manifest
from dedupsink.store.history import read_history
from dedupsink.store.ownership import RELEASED_BY
from dedupsink.store.records import Owner, StoreSettings, StoreTotals, WindowRecord, now_ms
from dedupsink.store.storage import join
from dedupsink.store.store import BucketStore
from dedupsink.units import utc_moment

__all__ = [
    "DiskUse",
    "FencedRun",
    "Inspection",
    "LastWindow",
    "OwnerState",
    "Point",
    "PortState",
    "Producers",
    "StoreState",
    "inspect_store",
]


@dataclass(frozen=True)
class DiskUse:
    """Window files and their bytes."""

    window_files: int
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"window_files": self.window_files, "bytes": self.bytes}


@dataclass(frozen=True)
class Point:
    """A latest or expiry point: its value in the store's encoding, and as a person reads it
    (the JSON writes it through ``StoreState.domain``)."""

    value: float | None
    text: str


@dataclass(frozen=True)
class LastWindow:
    """The last committed window's record; its number, ``window``, is the version its commit
    created, as every command and the history number windows."""

    record: WindowRecord

    @property
    def window(self) -> int:
        return self.record.version

    def to_dict(self) -> dict[str, Any]:
        return window_record(self.record)


@dataclass(frozen=True)
class OwnerState:
    """The query run that holds the store, and whether its lease is live."""

    query: str
    run: str
    since_version: int
    heartbeat: datetime  # the owner's last commit
    age_seconds: float
    timeout_seconds: float
    lease_live: bool

    @classmethod
    def of(cls, owner: Owner) -> OwnerState:
        age_ms = now_ms() - owner.heartbeat_ms
        return cls(
            query=owner.query,
            run=owner.run,
            since_version=owner.since,
            heartbeat=utc_moment(owner.heartbeat_ms),
            age_seconds=round(age_ms / 1000, 1),
            timeout_seconds=owner.timeout_ms / 1000,
            lease_live=age_ms < owner.timeout_ms,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "query": self.query,
            "run": self.run,
            "since_version": self.since_version,
            "heartbeat": moment_text(self.heartbeat),
            "age_seconds": self.age_seconds,
            "timeout_seconds": self.timeout_seconds,
            "lease_live": self.lease_live,
        }


@dataclass(frozen=True)
class FencedRun:
    """A query run that lost the store and may never commit to it again."""

    query: str
    run: str
    by: str
    version: int

    def to_dict(self) -> dict[str, Any]:
        return {"query": self.query, "run": self.run, "by": self.by, "version": self.version}


@dataclass(frozen=True)
class Producers:
    """Sequence dedup: how many producers the store holds, the range of their highest ids."""

    count: int
    lowest: int | None
    highest: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "lowest": self.lowest, "highest": self.highest}


@dataclass(frozen=True)
class PortState:
    """One port: the store's counts of it, where it is, and what its format says of it
    (``described``: a Delta table's version, an Iceberg table's snapshots, a sink log's
    entries, with the store version the table holds)."""

    port: str
    rows: int
    files: int
    batches: int
    path: str | None
    address: str | None
    described: Mapping[str, Any]

    @property
    def table_version(self) -> int | None:
        return self.described.get("table_version")

    @property
    def snapshots(self) -> int | None:
        return self.described.get("snapshots")

    @property
    def table(self) -> str | None:
        """The table's name in its catalog (Iceberg) or its URI (Delta)."""
        return self.described.get("table")

    @property
    def published_version(self) -> int | None:
        return self.described.get("published_version")

    @property
    def is_table(self) -> bool:
        return "table_version" in self.described or "snapshots" in self.described

    def to_dict(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "rows": self.rows,
            "files": self.files,
            "batches": self.batches,
            "path": self.path,
        }
        if self.address is not None:  # the output path is known: its format was asked
            entry["address"] = self.address
        entry.update(self.described)
        return entry


@dataclass(frozen=True)
class SchemaState:
    """The input's columns the latest window was written with, and the store's schema version
    (0 for the first schema the store recorded, one more with each change of the columns)."""

    version: int
    columns: tuple[tuple[str, str], ...]  # (name, Arrow type), in the input's order

    def text(self) -> str:
        return f"version {self.version}: " + ", ".join(f"{n} {t}" for n, t in self.columns)

    def to_dict(self) -> dict[str, Any]:
        columns = [column(name, kind) for name, kind in self.columns]
        return {"version": self.version, "columns": columns}


def _schema_state(manifest: Manifest) -> SchemaState | None:
    schema = recorded_schema(manifest.publication)
    if manifest.publication is None or schema is None:
        return None
    columns = tuple((field.name, str(field.type)) for field in schema)
    return SchemaState(manifest.publication.schema_version, columns)


@dataclass(frozen=True)
class StoreState:
    """What the store's latest version records."""

    store_id: str
    format: int
    committed: datetime  # when the latest version was committed
    settings: StoreSettings
    windows: int
    last_window: LastWindow | None
    latest: Point
    expiry_point: Point
    categories: tuple[str, ...]
    remembered_keys: int  # the keys that make a re-send a duplicate: above the expiry point
    expired_unfolded_keys: int  # at or below it, still in window files until a fold
    index: DiskUse
    owner: OwnerState | None
    fenced: tuple[FencedRun, ...]
    totals: StoreTotals
    publication_pending: bool
    producers: Producers | None  # sequence dedup only
    ports: tuple[PortState, ...]
    catalog: CatalogInfo | None = None  # the catalog naming the port tables (Iceberg)
    schema: SchemaState | None = None  # None: the store recorded none (older stores)

    def settings_dict(self) -> dict[str, Any]:
        """The settings as recorded, every one named (the placement too where the manifest
        leaves it out), but the keys as one list of columns, the period and span by their
        unit (``_periods``), and ``assume_same_expiry`` None in the modes it does not apply to."""
        recorded = self.settings
        shown: dict[str, Any] = {}
        for name in (f.name for f in fields(recorded)):
            if name == "keys":
                pairs = zip(recorded.keys, recorded.key_types, strict=True)
                shown["keys"] = [column(key, kind) for key, kind in pairs]
            elif name in ("period", "span"):
                shown.update(self._periods(name, getattr(recorded, name)))
            elif name != "key_types":  # in ``keys``
                shown[name] = getattr(recorded, name)
        if recorded.mode not in TIME_BUCKET_MODES:
            shown["assume_same_expiry"] = None
        return shown

    def _periods(self, name: str, value: float | None) -> dict[str, Any]:
        """The period or span under a name that says its unit: ``<name>_seconds`` where the
        expiry key is a time, ``<name>_key_units`` (the key's own numbers, or a count of
        categories) where it is not; the other null, both in Basic and sequence dedup."""
        seconds = self.domain.seconds(value)
        in_key_units = None if value is None or seconds is not None else json_number(value)
        return {f"{name}_seconds": seconds, f"{name}_key_units": in_key_units}

    @property
    def domain(self) -> PointDomain:
        """The domain of the store's points, as the JSON writes them."""
        return PointDomain.of(self.settings, self.categories)

    def to_dict(self) -> dict[str, Any]:
        totals = self.totals
        result: dict[str, Any] = {
            "store_id": self.store_id,
            "store_format": self.format,
            "committed_at": moment_text(self.committed),
            "settings": self.settings_dict(),
            "windows": self.windows,
            "last_window": None if self.last_window is None else self.last_window.to_dict(),
            "latest_point": self.domain.to_json(self.latest.value),
            "expiry_point": self.domain.to_json(self.expiry_point.value),
            "categories": list(self.categories),
            "remembered_keys": self.remembered_keys,
            "expired_unfolded_keys": self.expired_unfolded_keys,
            "index": self.index.to_dict(),
            "owner": None if self.owner is None else self.owner.to_dict(),
            "fenced": [fence.to_dict() for fence in self.fenced],
            "totals": {"windows": totals.windows, "remembered": totals.remembered}
            | totals.counts.as_dict(),
            "publication_pending": self.publication_pending,
        }
        if self.producers is not None:
            result["producers"] = self.producers.to_dict()
        if self.schema is not None:
            result["schema"] = self.schema.to_dict()
        result["ports"] = {p.port: p.to_dict() for p in self.ports}
        if self.catalog is not None:
            result["catalog"] = self.catalog.to_dict()
        return result


@dataclass(frozen=True)
class Inspection:
    """What ``dedupsink inspect`` shows: the store, its output root, its latest version (None:
    nothing committed yet, and ``state`` None), its window files on disk, and its state;
    ``to_dict()`` is the ``inspect`` JSON document (``jsonout``, its schema
    ``schemas/inspect.schema.json``)."""

    store: str
    output: str | None
    version: int | None
    disk: DiskUse
    state: StoreState | None
    verdict: Verdict | None = None  # None: nothing committed yet

    def to_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = {
            "store": self.store,
            "output": self.output,
            "version": self.version,
            "disk": self.disk.to_dict(),
        }
        if self.verdict is not None:
            result["verdict"] = self.verdict.to_dict()
        if self.state is not None:
            result.update(self.state.to_dict())
        return document("inspect", result)


def inspect_store(location: Location) -> Inspection:
    """What the located store and its ports hold."""
    store = location.store()
    manifest = store.read()
    disk = DiskUse(*store.disk_usage())
    if manifest is None:
        return Inspection(store.url, location.output_url, None, disk, None)
    state = _store_state(store, manifest, location.ports(manifest))
    verdict = store_verdict(store, manifest)
    return Inspection(store.url, location.output_url, manifest.version, disk, state, verdict)


def store_verdict(store: BucketStore, manifest: Manifest, now: datetime | None = None) -> Verdict:
    """Is the store healthy? Its history judged by the README's rules (``verdict.judge``)."""
    rows = read_history(store).to_pylist()
    return judge(rows, holder_of(manifest), now or utc_moment(now_ms()), period_seconds(manifest))


def holder_of(manifest: Manifest) -> Holder:
    """Who holds the store, and the runs another query took it from."""
    owner = manifest.owner
    taken = tuple((f.query, f.by, f.version) for f in manifest.fenced if f.by != RELEASED_BY)
    if owner is None:
        return Holder(taken_over=taken)
    return Holder(owner.query, utc_moment(owner.lapses_at_ms()), taken)


def period_seconds(manifest: Manifest) -> float | None:
    """The expiry period in seconds where the points are times (µs), else None."""
    settings = manifest.settings
    return PointDomain.of(settings, manifest.categories).seconds(settings.period)


def _store_state(store: BucketStore, manifest: Manifest, ports: PortFormat | None) -> StoreState:
    settings = manifest.settings
    categories = tuple(manifest.categories)
    expiry = settings.expiry_point(manifest.latest)
    return StoreState(
        store_id=manifest.store_id,
        format=manifest.format,
        committed=utc_moment(manifest.committed_ms),
        settings=settings,
        windows=manifest.totals.windows,
        last_window=_last_window(manifest),
        latest=Point(manifest.latest, point_text(manifest.latest, settings, categories)),
        expiry_point=Point(expiry, point_text(expiry, settings, categories)),
        categories=categories,
        remembered_keys=manifest.remembered_keys,
        expired_unfolded_keys=manifest.expired_unfolded_keys,
        index=DiskUse(len(manifest.files), sum(f.nbytes for f in manifest.files.values())),
        owner=None if manifest.owner is None else OwnerState.of(manifest.owner),
        fenced=tuple(FencedRun(f.query, f.run, f.by, f.version) for f in manifest.fenced),
        totals=manifest.totals,
        publication_pending=manifest.publication is not None
        and ports is not None
        and not ports.is_published(manifest.publication, manifest.store_id),
        producers=_producers(store, manifest) if settings.mode == "sequence" else None,
        ports=_port_states(manifest, ports),
        catalog=None if ports is None else ports.catalog_info(),
        schema=_schema_state(manifest),
    )


def _last_window(manifest: Manifest) -> LastWindow | None:
    last = manifest.last_window
    return None if last is None else LastWindow(last)


def _producers(store: BucketStore, manifest: Manifest) -> Producers:
    """Every segment read: one entry a producer, few next to a key mode's keys."""
    reader = BucketManager(store, BucketCache(1), np.dtype(np.int64)).use(manifest)
    segments = [segment for kept in manifest.buckets.values() for segment in kept]
    keys = reader.read_segments(segments)
    if keys.stamps is None or len(keys.h1) == 0:
        return Producers(0, None, None)
    _, highest = highest_per_producer(Fingerprints(keys.h1, keys.h2), keys.stamps)
    return Producers(len(highest), int(highest.min()), int(highest.max()))


def _port_states(manifest: Manifest, ports: PortFormat | None) -> tuple[PortState, ...]:
    output_url = None if ports is None else ports.output.url
    states = []
    for port in PORTS:
        recorded = manifest.ports.get(port)
        states.append(
            PortState(
                port=port,
                rows=recorded.rows if recorded else 0,
                files=recorded.files if recorded else 0,
                batches=recorded.next_log if recorded else 0,
                path=join(output_url, port) if output_url else None,
                address=None if ports is None else ports.address(port),
                described={} if ports is None else ports.describe(port, manifest.store_id),
            )
        )
    return tuple(states)
