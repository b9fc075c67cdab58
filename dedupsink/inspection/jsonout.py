"""The JSON the operator commands print (``inspect``, ``history``, ``lookup`` with ``--json``), as
one contract: every object labelled, every time ISO-8601 UTC, one shape for one thing in every
command, a ``format`` naming the document and its version first in each, and a JSON Schema of
each document shipped beside this module (``schemas/``).

The shared shapes: a point (latest, expiry, a key's stamp) is ``{"value", "text"}`` or null
(``PointDomain.to_json``); a column (a key, a column of the input) is ``{"name", "type"}``
in a list in the columns' order (``column``); a duration is a number of seconds in a field
named ``*_seconds``; error reasons are ``[{"reason", "rows"}]``; the state a window's
tasks used is ``{"loaded_bytes", ...}`` or null; a window is the history's columns of it
(``window_record``; a history line adds what the store held after it). ``docs/JSON.md`` says
what each field means and how the format's version changes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from importlib import resources
from typing import Any

from dedupsink.inspection.points import PointDomain, iso_micros
from dedupsink.store.records import StateUse, WindowRecord
from dedupsink.units import micros_since_epoch

__all__ = [
    "DOCUMENTS",
    "FORMAT_VERSIONS",
    "column",
    "document",
    "dumps",
    "history_line",
    "moment_text",
    "reasons",
    "schema",
    "state_use",
    "window_record",
]

# The version of each document's shape: a field added keeps it, a field renamed, removed or
# given another type raises it (and the ``format`` string the document starts with, and the
# ``const`` of its schema). Each document moves on its own: a reader of one is not made to
# re-check another that did not change.
FORMAT_VERSIONS = {"inspect": 2, "history": 1, "lookup": 2}
DOCUMENTS = ("inspect", "history", "lookup", "defs")
_STATE_FIELDS = ("loaded", "loaded_max", "fetched", "private", "mapped")


def document(kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """A document of ``kind`` (``inspect``, ``history``, ``lookup``): its format, then its body."""
    return {"format": f"dedupsink.{kind}/{FORMAT_VERSIONS[kind]}", **body}


def column(name: str, arrow_type: str) -> dict[str, str]:
    """A column as every list of columns writes it (a store's keys, its input's schema):
    ``{"name", "type"}``, its Arrow type. Lists of these keep the columns' order, which an
    object keyed by name would not promise. No ``nullable``: the store records every column
    nullable (``ports.base.schema_record``), so it would say nothing."""
    return {"name": name, "type": arrow_type}


def dumps(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, indent=indent)


def moment_text(moment: datetime) -> str:
    """An aware moment as every time in the JSON: ISO-8601 UTC (``iso_micros``)."""
    text = iso_micros(micros_since_epoch(moment.astimezone(UTC)))
    assert text is not None  # a datetime is always within the years 1 to 9999
    return text


def reasons(pairs: Iterable[tuple[str, int]] | Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Error rows by reason, most first, as ``[{"reason": ..., "rows": ...}]``."""
    shown = []
    for entry in pairs:
        if isinstance(entry, Mapping):
            reason, rows = entry["reason"], entry["rows"]
        else:
            reason, rows = entry
        shown.append({"reason": str(reason), "rows": int(rows)})
    return shown


def state_use(state: StateUse | None) -> dict[str, int] | None:
    """The bytes of remembered keys a window's tasks used; None where it was not counted."""
    if state is None or state == StateUse():
        return None
    values = zip(_STATE_FIELDS, state.to_wire(), strict=True)
    return {f"{name}_bytes": int(value) for name, value in values}


def window_record(record: WindowRecord) -> dict[str, Any]:
    """A window as a manifest records it, under the history's column names."""
    waits = record.store_waits
    return {
        "version": record.version,
        "query_id": record.query,
        "batch_id": record.batch,
        **record.counts.as_dict(),
        "keys_added": record.new_keys,
        "keys_forgotten": record.dropped_keys,
        "cross_partition_duplicates": record.cross_partition_duplicates,
        "task_seconds": record.task_seconds,
        "wall_seconds": record.wall_seconds,
        "commit_seconds": record.commit_seconds,
        "state": state_use(record.state),
        "error_reasons": reasons(record.error_reasons),
        "store_retries": waits.retries if waits.retries else None,
        "store_wait_seconds": round(waits.seconds, 3) if waits.retries else None,
    }


def history_line(row: Mapping[str, Any], domain: PointDomain) -> dict[str, Any]:
    """One row of the history's Arrow table as a ``history`` document: the window's columns,
    the points as point objects (their ``_text`` columns folded in), the ``state_*`` columns as
    one ``state`` object."""
    state = None
    if row.get("state_loaded_bytes") is not None:
        state = StateUse(*(int(row[f"state_{name}_bytes"]) for name in _STATE_FIELDS))
    committed: datetime = row["committed_at"]
    body: dict[str, Any] = {}
    for name, value in row.items():
        if name.endswith("_text") or name.startswith("state_"):
            continue
        if name == "committed_at":
            body[name] = moment_text(committed)
        elif name in ("latest_point", "expiry_point"):
            body[name] = domain.to_json(value)
        elif name == "error_reasons":
            body[name] = reasons(value or [])
        elif name == "task_seconds":
            body[name] = value
            body["state"] = state_use(state)
        else:
            body[name] = value
    return document("history", body)


def schema(kind: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a document: ``inspect``, ``history``, ``lookup``, or
    ``defs`` (the shapes they share, ``$id`` ``urn:dedupsink:defs``, which the others refer
    to)."""
    if kind not in DOCUMENTS:
        raise ValueError(f"no JSON schema {kind!r}: one of {', '.join(DOCUMENTS)}")
    folder = resources.files("dedupsink.inspection").joinpath("schemas")
    text = folder.joinpath(f"{kind}.schema.json").read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded
