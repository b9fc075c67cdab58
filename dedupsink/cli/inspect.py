"""``dedupsink inspect``: an ``Inspection`` (``dedupsink.inspection.state``) as text for people,
or as its ``inspect`` JSON document (``to_dict()``, ``dedupsink.inspection.jsonout``) for
machines."""

from __future__ import annotations

from datetime import datetime

from dedupsink.cli.display import counted, table
from dedupsink.engine.classify import PORTS
from dedupsink.engine.settings import TIME_BUCKET_MODES, human_span
from dedupsink.inspection.jsonout import dumps
from dedupsink.inspection.state import (
    Inspection,
    LastWindow,
    OwnerState,
    PortState,
    Producers,
    StoreState,
)
from dedupsink.inspection.verdict import Verdict
from dedupsink.options import ASSUME_SAME_EXPIRY, OUTPUT_FORMAT_DEFAULT, bool_text
from dedupsink.ports.base import CatalogInfo
from dedupsink.store.records import StoreSettings
from dedupsink.units import human_bytes, micros_since_epoch, utc_text

__all__ = ["placement_text", "render", "settings_text", "table_state", "to_json"]


def to_json(inspection: Inspection) -> str:
    return dumps(inspection.to_dict(), indent=2)


def render(inspection: Inspection) -> str:
    """The inspection for people."""
    lines = [f"store       {inspection.store}"]
    state = inspection.state
    if state is None:
        lines.append("            empty: no window committed yet")
        return "\n".join(lines)
    settings = state.settings
    lines += [
        f"            id {state.store_id}, format {state.format}, "
        f"version {inspection.version} committed {_second(state.committed)}",
        f"settings    {settings_text(settings)}",
        f"placement   {placement_text(settings)}",
        f"windows     {state.windows} committed{_last_window_text(state.last_window)}",
        *_verdict_lines(inspection.verdict),
    ]
    if state.schema is not None:
        lines.append(f"schema      {state.schema.text()}")
    remembered = f"{state.remembered_keys} keys"
    if state.producers is not None:
        lines.append(f"producers   {_producers_text(state.producers)}")
        remembered = f"{state.producers.count} producers"
    elif settings.mode != "basic":
        lines.append(f"latest      {state.latest.text}")
        lines.append(f"expiry      {state.expiry_point.text}  (rows at or before it expire)")
    lines += [
        f"remembered  {remembered} in {state.index.window_files} window files "
        f"({human_bytes(state.index.bytes)})",
        *_expired_unfolded_lines(state.expired_unfolded_keys),
        f"on disk     {inspection.disk.window_files} window files, "
        f"{human_bytes(inspection.disk.bytes)}",
        f"owner       {_owner_text(state.owner)}",
    ]
    if state.publication_pending:
        lines.append("            the last window's ports are not fully published yet")
    lines += _ports_text(inspection.output, state)
    if state.catalog is not None:
        lines += catalog_lines(state.catalog)
    return "\n".join(lines)


def _verdict_lines(verdict: Verdict | None) -> list[str]:
    """Healthy or not, and each finding on a line of its own (README, "Is it healthy?")."""
    if verdict is None:
        return []
    return [
        f"health      {verdict.headline()}",
        *(f"            {f.kind} {f.rule}: {f.message}" for f in verdict.findings),
    ]


def _expired_unfolded_lines(keys: int) -> list[str]:
    """The keys that expired but wait in window files for a fold, apart from the remembered."""
    if not keys:
        return []
    return [f"            and {keys} expired keys awaiting fold (at or below the expiry point)"]


def catalog_lines(catalog: CatalogInfo, label: str = "catalog     ") -> list[str]:
    """Where the port tables' catalog is, and the Python that opens it."""
    indent = " " * len(label)
    where = f"{catalog.kind or 'a'} catalog {catalog.name!r}"
    if catalog.uri:
        where += f" at {catalog.uri}"
    if catalog.warehouse:
        where += f", warehouse {catalog.warehouse}"
    return [
        f"{label}{where}",
        f"{indent}read: from pyiceberg.catalog import load_catalog",
        f"{indent}      {catalog.load_call()}.load_table({catalog.tables['unique']!r})",
    ]


def _second(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _producers_text(producers: Producers) -> str:
    if not producers.count:
        return "none yet"
    return (
        f"{producers.count}, their highest sequence ids from {producers.lowest} to "
        f"{producers.highest} (nothing expires)"
    )


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


def _last_window_text(last: LastWindow | None) -> str:
    if last is None:
        return ""
    counts = last.record.counts.as_dict()
    text = " ".join(f"{port}={counts.get(port, 0)}" for port in PORTS)
    record = last.record
    return (
        f"; the last was window {last.window}, batch {record.batch} of query {record.query}: {text}"
    )


def _owner_text(owner: OwnerState | None) -> str:
    if owner is None:
        return "none (released): a new query can start at once"
    state = (
        f"a new query waits up to {owner.timeout_seconds:g}s for the lease to lapse"
        if owner.lease_live
        else "lease lapsed: a new query can start at once"
    )
    return (
        f"query {owner.query} (run {owner.run or '-'}, since version "
        f"{owner.since_version}), last commit {utc_text(micros_since_epoch(owner.heartbeat))} "
        f"({owner.age_seconds:.0f}s ago; {state})"
    )


def _ports_text(output: str | None, state: StoreState) -> list[str]:
    if output is None:
        lines = [
            "ports       output path unknown (store not in <path>/_store; pass the output path)"
        ]
    else:
        lines = [f"ports       {output}"]
    rows = [
        [port.port, port.batches, port.files, port.rows, table_state(port), _where(port)]
        for port in state.ports
    ]
    headings = ["port", "batches", "files", "rows", "table", "location"]
    if all(row[4] == "-" for row in rows):  # Parquet folders: no table state to show
        rows = [row[:4] + row[5:] for row in rows]
        headings = headings[:4] + headings[5:]
    return lines + table(headings, rows, indent="  ")


def table_state(port: PortState) -> str:
    """A table port's state: its Delta version or Iceberg snapshots, and the last store
    version it holds; a table not created yet, or without a snapshot, said so."""
    if "table_version" in port.described:
        if port.table_version is None:
            return f"{port.table}: no table yet"
        state = f"version {port.table_version}"
    elif "snapshots" in port.described:
        if port.snapshots is None:
            return f"{port.table}: no table yet"
        has = counted(port.snapshots, "snapshot") if port.snapshots else "no snapshot yet"
        state = f"{port.table} with {has}"
    else:
        return "-"
    # Iceberg says -1 for a table holding no window of this store yet
    if port.published_version is not None and port.published_version >= 0:
        state += f", store version {port.published_version}"
    return state


def _where(port: PortState) -> str:
    return str(port.address or port.path or "-")
