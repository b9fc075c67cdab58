"""``dedupsink inspect``: what a store and its ports hold, read from disk without Spark.

``locate`` accepts an output path (``<path>/_store`` is its store) or a store path (its ports
are found next to it when it is the default ``_store`` folder). ``report`` reads the latest
manifest through ``BucketStore`` and the ports through their format (``ports``); ``render``
prints it for people, ``--json`` prints the same dictionary for machines.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dedupsink.cli.config import resolve_path
from dedupsink.cli.display import human_bytes, point_text, table, utc_text
from dedupsink.cli.errors import ConfigError
from dedupsink.engine.classify import PORTS
from dedupsink.engine.fingerprint import Fingerprints
from dedupsink.engine.sequence import highest_per_producer
from dedupsink.engine.settings import TIME_BUCKET_MODES, human_span
from dedupsink.options import (
    ASSUME_SAME_EXPIRY,
    ASSUME_SAME_EXPIRY_DEFAULT,
    OUTPUT_FORMAT_DEFAULT,
    STORE_DIRNAME_DEFAULT,
    DedupOptions,
    bool_text,
)
from dedupsink.ports.base import PortFormat
from dedupsink.ports.formats import port_format
from dedupsink.ports.output import Output
from dedupsink.store.cache import BucketCache, BucketManager
from dedupsink.store.format import Manifest
from dedupsink.store.ownership import now_ms
from dedupsink.store.records import Owner, StoreSettings
from dedupsink.store.storage import Storage, join
from dedupsink.store.store import LOG_DIR, BucketStore, find_store

__all__ = ["Location", "locate", "render", "report", "to_json"]


@dataclass(frozen=True)
class Location:
    """A store and, when known, the output root whose ports it commits, with the storage
    options to reach them (never shown)."""

    store_url: str
    output_url: str | None
    storage_options: dict[str, Any] = field(default_factory=dict, repr=False)

    def store(self) -> BucketStore:
        return BucketStore(self.store_url, self.storage_options)

    def output(self) -> Output | None:
        return None if self.output_url is None else Output(self.output_url, self.storage_options)

    def ports(self, manifest: Manifest | None) -> PortFormat | None:
        """The ports in the format the store was created with (an Iceberg catalog other than
        the embedded one is not known here)."""
        if self.output_url is None:
            return None
        recorded = OUTPUT_FORMAT_DEFAULT if manifest is None else manifest.settings.output_format
        options = DedupOptions(
            path=self.output_url,
            store_path=self.store_url,
            output_format=recorded,
            storage_options=self.storage_options,
        )
        return port_format(options)


def locate(
    path: str, store: str | None = None, storage_options: dict[str, Any] | None = None
) -> Location:
    """Find the store of an output path, or the ports of a store path."""
    options = dict(storage_options or {})
    url = resolve_path(path).rstrip("/")
    if store is not None:
        store_url = resolve_path(store).rstrip("/")
        Storage.for_url(store_url, options, "--store").check_reachable("--store")
        return Location(store_url, url, options)
    # One request on an object store, so that no credentials, no endpoint or no bucket is
    # said as such, not as "no dedup store" or the client's traceback.
    Storage.for_url(url, options, "PATH").check_reachable("PATH")
    found = find_store(url, options)
    if found is not None:
        return Location(found[0], found[1], options)
    raise ConfigError(
        "PATH",
        f"no dedup store at {url} (looked for {url}/{LOG_DIR} and "
        f"{url}/{STORE_DIRNAME_DEFAULT}/{LOG_DIR}); pass an output path or a store path",
    )


def report(location: Location) -> dict[str, Any]:
    """Everything ``inspect`` shows, as plain JSON-able values."""
    store = location.store()
    manifest = store.read()
    files_on_disk, bytes_on_disk = store.disk_usage()
    result: dict[str, Any] = {
        "store": store.url,
        "output": location.output_url,
        "version": None if manifest is None else manifest.version,
        "disk": {"window_files": files_on_disk, "bytes": bytes_on_disk},
    }
    if manifest is None:
        return result
    ports = location.ports(manifest)
    result.update(_store_part(manifest, ports))
    if manifest.settings.mode == "sequence":
        result["producers"] = _producers_part(store, manifest)
    result["ports"] = _ports_part(manifest, ports)
    return result


def _store_part(manifest: Manifest, ports: PortFormat | None) -> dict[str, Any]:
    settings = manifest.settings
    shown = settings.to_wire()
    if settings.mode not in TIME_BUCKET_MODES:  # recorded, but it applies to none of them
        shown["assume_same_expiry"] = None
    latest = manifest.latest
    expiry = settings.expiry_point(latest)
    categories = list(manifest.categories)
    return {
        "store_id": manifest.store_id,
        "format": manifest.format,
        "committed": utc_text(manifest.committed_ms // 1000 * 1_000_000),
        "settings": shown,
        "windows": manifest.totals.windows,
        "last_window": _last_window_part(manifest),
        "latest": {"value": latest, "text": point_text(latest, settings, categories)},
        "expiry_point": {"value": expiry, "text": point_text(expiry, settings, categories)},
        "categories": categories,
        "remembered_keys": manifest.remembered_keys,
        "index": {
            "window_files": len(manifest.files),
            "bytes": sum(window_file.nbytes for window_file in manifest.files.values()),
        },
        "owner": _owner_part(manifest.owner),
        "fenced": [
            {"query": f.query, "run": f.run, "by": f.by, "version": f.version}
            for f in manifest.fenced
        ],
        "totals": manifest.totals.to_wire(),
        "publication_pending": manifest.publication is not None
        and ports is not None
        and not ports.is_published(manifest.publication, manifest.store_id),
    }


def _producers_part(store: BucketStore, manifest: Manifest) -> dict[str, Any]:
    """Sequence dedup: how many producers the store holds and the range of their highest ids
    (every segment read: one entry a producer, few next to a key mode's keys)."""
    reader = BucketManager(store, BucketCache(1), np.dtype(np.int64)).use(manifest)
    segments = [segment for kept in manifest.buckets.values() for segment in kept]
    keys = reader.read_segments(segments)
    if keys.stamps is None or len(keys.h1) == 0:
        return {"count": 0, "lowest": None, "highest": None}
    _, highest = highest_per_producer(Fingerprints(keys.h1, keys.h2), keys.stamps)
    return {"count": len(highest), "lowest": int(highest.min()), "highest": int(highest.max())}


def _last_window_part(manifest: Manifest) -> dict[str, Any] | None:
    """The last window's record, numbered as ``run``'s batch lines and the sink's log number
    windows (the store's count of committed windows, ``windows``), with the version that
    committed it: the record itself holds the version, a larger number (the store's creation
    and each release take a version too)."""
    last = manifest.last_window
    if last is None:
        return None
    return {
        "window": manifest.totals.windows,
        "version": last.version,
        **{name: value for name, value in last.to_wire().items() if name != "window"},
    }


def _owner_part(owner: Owner | None) -> dict[str, Any] | None:
    if owner is None:
        return None
    age_ms = now_ms() - owner.heartbeat_ms
    return {
        "query": owner.query,
        "run": owner.run,
        "since_version": owner.since,
        "heartbeat": utc_text(owner.heartbeat_ms * 1000),
        "age_seconds": round(age_ms / 1000, 1),
        "timeout_seconds": owner.timeout_ms / 1000,
        "lease_live": age_ms < owner.timeout_ms,
    }


def _ports_part(manifest: Manifest, ports: PortFormat | None) -> dict[str, Any]:
    output_url = None if ports is None else ports.output.url
    found: dict[str, Any] = {}
    for port in PORTS:
        state = manifest.ports.get(port)
        entry: dict[str, Any] = {
            "rows": state.rows if state else 0,
            "files": state.files if state else 0,
            "batches": state.next_log if state else 0,
            "path": join(output_url, port) if output_url else None,
        }
        if ports is not None:
            entry["address"] = ports.address(port)
        if ports is not None:
            entry.update(ports.describe(port, manifest.store_id))
        found[port] = entry
    return found


def to_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=False, default=str)


def render(data: dict[str, Any]) -> str:
    """The report for people."""
    lines = [f"store       {data['store']}"]
    if data.get("version") is None:
        lines.append("            empty: no window committed yet")
        return "\n".join(lines)
    settings = _reported_settings(data["settings"])
    lines += [
        f"            id {data['store_id']}, format {data['format']}, "
        f"version {data['version']} committed {data['committed']}",
        f"settings    {settings_text(settings)}",
        f"placement   {placement_text(settings)}",
        f"windows     {data['windows']} committed{_last_window_text(data['last_window'])}",
    ]
    index, disk = data["index"], data["disk"]
    remembered = f"{data['remembered_keys']} keys"
    if "producers" in data:
        lines.append(f"producers   {_producers_text(data['producers'])}")
        remembered = f"{data['producers']['count']} producers"
    elif settings.mode != "basic":
        lines.append(f"latest      {data['latest']['text']}")
        lines.append(f"expiry      {data['expiry_point']['text']}  (rows at or before it expire)")
    lines += [
        f"remembered  {remembered} in {index['window_files']} window files "
        f"({human_bytes(index['bytes'])})",
        f"on disk     {disk['window_files']} window files, {human_bytes(disk['bytes'])}",
        f"owner       {_owner_text(data['owner'])}",
    ]
    if data.get("publication_pending"):
        lines.append("            the last window's ports are not fully published yet")
    lines += _ports_text(data)
    return "\n".join(lines)


def _producers_text(producers: dict[str, Any]) -> str:
    if not producers["count"]:
        return "none yet"
    return (
        f"{producers['count']}, their highest sequence ids from {producers['lowest']} to "
        f"{producers['highest']} (nothing expires)"
    )


def _reported_settings(shown: dict[str, Any]) -> StoreSettings:
    """The store's settings back from the report, which shows ``assume_same_expiry`` as None
    in the modes it does not apply to."""
    same = shown["assume_same_expiry"]
    if same is None:
        same = ASSUME_SAME_EXPIRY_DEFAULT
    return StoreSettings.from_wire({**shown, "assume_same_expiry": same})


def settings_text(settings: StoreSettings) -> str:
    text = _mode_text(settings)
    output_format = settings.output_format
    return text if output_format == OUTPUT_FORMAT_DEFAULT else f"{text}, ports as {output_format}"


def placement_text(settings: StoreSettings) -> str:
    """Where the store puts a key, and what that gives a key-partitioned input."""
    if settings.key_hash != "spark":
        return "by fingerprint (tasks share the buckets: partition_for_dedup groups keys only)"
    shards = settings.key_shards if settings.key_shards > 1 else settings.bucket_count
    where = f"{shards} key shards a time bucket" if settings.key_shards > 1 else "hash buckets"
    return f"by Spark's hash(keys), {where}: a task of partition p of N loads shards s % N == p"


def _mode_text(settings: StoreSettings) -> str:
    mode = settings.mode
    keys = ", ".join(settings.keys)
    if mode == "basic":
        return f"Basic Dedup on keys {keys}, {settings.bucket_count} hash buckets"
    if mode == "sequence":
        return (
            f"sequence dedup of producers {keys} by sequenceKey {settings.sequence_key} "
            f"({settings.sequence_type}), {settings.bucket_count} hash buckets"
        )
    text = f"{mode} on keys {keys}"
    if settings.expiry_key:
        text += f", expiryKey {settings.expiry_key} ({settings.expiry_type})"
    text += f", expiryPeriod {human_span(settings.period, mode)}"
    if settings.span is not None:
        text += f", bucketSpan {human_span(settings.span, mode)}"
    if mode not in TIME_BUCKET_MODES:
        return text + f", {settings.bucket_count} buckets"
    same = settings.assume_same_expiry
    kind = "" if same else "hash "  # with false, keys are bucketed as in Basic Dedup
    text += f", {settings.bucket_count} {kind}buckets"
    return text + f", {ASSUME_SAME_EXPIRY} {bool_text(same)}"


def _last_window_text(last: dict[str, Any] | None) -> str:
    if not last:
        return ""
    counts = " ".join(f"{port}={last.get('counts', {}).get(port, 0)}" for port in PORTS)
    return f"; the last was batch {last.get('batch')} of query {last.get('query')}: {counts}"


def _owner_text(owner: dict[str, Any] | None) -> str:
    if owner is None:
        return "none (released): a new query can start at once"
    state = (
        f"a new query waits up to {owner['timeout_seconds']:g}s for the lease to lapse"
        if owner["lease_live"]
        else "lease lapsed: a new query can start at once"
    )
    return (
        f"query {owner['query']} (run {owner['run'] or '-'}, since version "
        f"{owner['since_version']}), last commit {owner['heartbeat']} "
        f"({owner['age_seconds']:.0f}s ago; {state})"
    )


def _ports_text(data: dict[str, Any]) -> list[str]:
    ports = data["ports"]
    if data.get("output") is None:
        lines = [
            "ports       output path unknown (store not in <path>/_store; pass the output path)"
        ]
    else:
        lines = [f"ports       {data['output']}"]
    rows = [
        [port, info["batches"], info["files"], info["rows"], _table_state(info), _where(info)]
        for port, info in ports.items()
    ]
    headings = ["port", "batches", "files", "rows", "table", "location"]
    if all(row[4] == "-" for row in rows):  # Parquet folders: no table state to show
        rows = [row[:4] + row[5:] for row in rows]
        headings = headings[:4] + headings[5:]
    return lines + table(headings, rows, indent="  ")


def _table_state(info: dict[str, Any]) -> str:
    """A table port's state: its Delta version or Iceberg snapshots, and the last store
    version it holds."""
    if "table_version" in info:
        state = f"version {info['table_version']}"
    elif "snapshots" in info:
        state = f"{info['snapshots']} snapshots"
    else:
        return "-"
    if info.get("published_version") is not None:
        state += f", store version {info['published_version']}"
    return state


def _where(info: dict[str, Any]) -> str:
    return str(info.get("address") or info.get("path") or "-")
