"""The bucket store's on-disk format: manifests (the three indexes) and window files.

A *window file* holds the keys one task found new in one window, bucket after bucket, so one
bucket's keys are one range read: per segment ``h1[n] | h2[n] | stamps[n]`` as little-endian
64-bit words (stamps only in modes where each key carries its own expiry value).

A *manifest* is one committed version of the store: msgpack behind a 16-byte header
(``DSM1``, CRC-32 of the payload, payload length). It holds the settings, the latest point, the
bucket positions (bucket -> segments), the window files with their buckets and max expiry
values, the owner lease, the query/batch ids already committed, the port publication plan of
its window and counters. Every field is a plain msgpack type so tools can read it.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property
from operator import itemgetter
from typing import Any, NamedTuple

import msgpack
import numpy as np

from dedupsink.engine.expiry_policy import is_alive, is_expired
from dedupsink.errors import StoreCorruptError
from dedupsink.store.records import (
    Fence,
    Logged,
    Owner,
    Publication,
    StoreSettings,
    StoreTotals,
    WindowRecord,
)

MANIFEST_MAGIC = b"DSM1"
WINDOW_MAGIC = b"DSWIN001"
# Format 2 types the protocol state (owner runs, fences, publication sizes); no other is read.
FORMAT_VERSION = 2
_HEADER = struct.Struct("<4sIQ")
SegmentBytes = bytes | memoryview  # a segment as read: bytes, or a view into a read buffer
# A window file's distinct stamps with their key counts, ascending: ((stamp, keys), ...).
StampCounts = tuple[tuple[float, int], ...]
# The most distinct stamps a window file records counts of (about 15 bytes each in its entry,
# so under 1 KB). A systemTime window's own file holds one stamp, a fold's file one a window it
# mixes, a categorical file one a category; files of own expiry values (assumeSameExpiry=false)
# exceed it at once. A file beyond it records none, and the commit reads its keys to count.
STAMP_COUNTS_CAP = 64
_STAMP_PREFIX = 1024


class Segment(NamedTuple):
    """One bucket's keys inside one window file.

    A named tuple: a manifest holds one per bucket per window file (825 after the scale
    benchmark's day of hash buckets), and every task and commit decodes them all. A tuple is
    built about four times faster than a frozen dataclass, and packs as the msgpack array it is
    stored as."""

    file: str
    offset: int
    length: int
    count: int  # type: ignore[assignment]  # the field hides tuple.count, which nothing uses
    crc: int

    @property
    def ident(self) -> tuple[str, int]:
        return segment_ident(self)


# A segment's identity, (file, offset): a file's segments never move. As a C-level getter it
# serves the loops over a whole index (``map(segment_ident, segments)``) without a call each.
segment_ident = itemgetter(0, 1)


@dataclass(frozen=True)
class WindowFile:
    """A window file with the version that added it, its buckets, max and min expiry values
    and (systemTime) window time.

    Frozen: a file stays listed by every version until it expires or is folded, and each
    version's manifest packs it again. It is packed once (``packed``); a changed file is a new
    one (``dataclasses.replace``)."""

    name: str
    version: int
    partition: int
    keys: int
    nbytes: int
    buckets: list[int]
    max_stamp: float | None = None
    local_categories: list[str] = field(default_factory=list)
    # The smallest final stamp (None: not known, as in files written before it was recorded):
    # a file whose smallest stamp is above the expiry point holds no forgotten key, so the
    # commit counts expired keys without reading it (``transaction.CountExpiredUnfolded``).
    min_stamp: float | None = None
    # The file's distinct final stamps with their key counts (``StampCounts``), when there are
    # at most ``STAMP_COUNTS_CAP`` (None: more, or not known, as in files written before they
    # were recorded): the commit counts the expired keys of a file the expiry point straddles
    # from them, without reading its keys.
    stamp_counts: StampCounts | None = None

    @cached_property
    def packed(self) -> bytes:
        """This file's manifest entry as msgpack: after a day of one-minute windows the index
        lists about 250 files, and packing their entries again was a third of each commit's
        encoding."""
        entry = {f.name: getattr(self, f.name) for f in fields(self)}
        for optional in ("min_stamp", "stamp_counts"):
            if entry[optional] is None:  # absent when unknown: older entries re-encode identically
                del entry[optional]
        entry = {_WIRE_NAMES.get(name, name): value for name, value in entry.items()}
        return msgpack.packb(entry, use_bin_type=True)

    @classmethod
    def from_wire(cls, entry: dict[str, Any]) -> WindowFile:
        values = {_FIELD_NAMES.get(name, name): value for name, value in entry.items()}
        if values.get("stamp_counts") is not None:
            values["stamp_counts"] = tuple((stamp, int(n)) for stamp, n in values["stamp_counts"])
        return cls(**values)

    def expired_keys(self, expiry_point: float) -> int | None:
        """How many of its keys are at or below the expiry point, from its stamp counts (None
        when it has none: only its keys' stamps tell)."""
        if self.stamp_counts is None:
            return None
        return sum(n for stamp, n in self.stamp_counts if is_expired(stamp, expiry_point))


def count_stamps(stamps: np.ndarray | None) -> StampCounts | None:
    """Stamps' distinct values with their counts (None beyond ``STAMP_COUNTS_CAP`` values)."""
    if stamps is None:
        return None
    # Own expiry values (event times) exceed the cap within their first rows: a short prefix
    # says so without sorting every stamp of the file (a hot path: each task's window file).
    if len(stamps) > _STAMP_PREFIX and len(np.unique(stamps[:_STAMP_PREFIX])) > STAMP_COUNTS_CAP:
        return None
    values, counts = np.unique(stamps, return_counts=True)
    if len(values) > STAMP_COUNTS_CAP:
        return None
    return tuple(zip(values.tolist(), counts.tolist(), strict=True))


def merge_stamp_counts(parts: Iterable[StampCounts | None]) -> StampCounts | None:
    """Several stamp counts as one (None if one of them is unknown, or beyond the cap)."""
    total: dict[float, int] = {}
    for part in parts:
        if part is None:
            return None
        for stamp, n in part:
            total[stamp] = total.get(stamp, 0) + n
    if len(total) > STAMP_COUNTS_CAP:
        return None
    return tuple(sorted(total.items()))


def resolve_stamp_counts(
    counts: StampCounts | None, final: Mapping[float, float]
) -> StampCounts | None:
    """Stamp counts whose provisional (negative) stamps become their final values (``final``:
    provisional stamp -> final one)."""
    if counts is None:
        return None
    return merge_stamp_counts([tuple((final[s] if s < 0 else s, n) for s, n in counts)])


def without_stamp_counts(
    counts: StampCounts | None, removed: StampCounts | None
) -> StampCounts | None:
    """What stamp counts leave once a part's (``removed``) keys left (None if that is unknown)."""
    if counts is None or removed is None:
        return None
    left = dict(counts)
    for stamp, n in removed:
        left[stamp] = left.get(stamp, 0) - n
        if left[stamp] < 0:
            return None  # not a part of them: a count read from them would be wrong
    return tuple(sorted((stamp, n) for stamp, n in left.items() if n))


# The manifest's format names a file's version "window", as it was first written.
_WIRE_NAMES = {"version": "window"}
_FIELD_NAMES = {wire: name for name, wire in _WIRE_NAMES.items()}


@dataclass
class PortState:
    """A port's running position: the next Spark log id, the files and rows published, and the
    files logged since the port's last compaction entry (which the next one repeats; None in a
    store from before they were recorded, until its next compaction)."""

    next_log: int = 0
    files: int = 0
    rows: int = 0
    recent: list[Logged] | None = field(default_factory=list)

    def to_wire(self) -> dict[str, Any]:
        recent = None if self.recent is None else [logged.to_wire() for logged in self.recent]
        return {"next_log": self.next_log, "files": self.files, "rows": self.rows, "recent": recent}

    @classmethod
    def from_wire(cls, value: dict[str, Any]) -> PortState:
        wire = value["recent"]
        recent = None if wire is None else [Logged.from_wire(item) for item in wire]
        return cls(int(value["next_log"]), int(value["files"]), int(value["rows"]), recent)


@dataclass
class Manifest:
    """One committed version of the store."""

    version: int
    store_id: str
    settings: StoreSettings
    committed_ms: int
    latest: float | None = None
    categories: list[str] = field(default_factory=list)
    files: dict[str, WindowFile] = field(default_factory=dict)
    buckets: dict[int, list[Segment]] = field(default_factory=dict)
    owner: Owner | None = None
    fenced: list[Fence] = field(default_factory=list)
    queries: dict[str, int] = field(default_factory=dict)
    tombstones: list[tuple[str, int]] = field(default_factory=list)
    ports: dict[str, PortState] = field(default_factory=dict)
    publication: Publication | None = None
    last_window: WindowRecord | None = None
    totals: StoreTotals = field(default_factory=StoreTotals)
    format: int = FORMAT_VERSION

    @property
    def remembered_keys(self) -> int:
        """The keys (or producers) that still make a re-send a duplicate: stamped above the
        expiry point."""
        return self.totals.remembered

    @property
    def expired_unfolded_keys(self) -> int:
        """Keys at or below the expiry point still in window files ("expired, awaiting fold"),
        waiting for a fold or their file's expiry to remove them: no re-send is a duplicate
        of them."""
        return self.totals.expired_unfolded

    def category_ordinals(self) -> dict[str, int]:
        return {name: index for index, name in enumerate(self.categories)}

    def to_bytes(self) -> bytes:
        # Built by hand: dataclasses.asdict deep-copies every nested value, which cost more
        # than packing once the index holds a day of segments.
        record = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "files"}
        record["settings"] = self.settings.to_wire()
        record["tombstones"] = [list(t) for t in self.tombstones]
        record["ports"] = {port: state.to_wire() for port, state in self.ports.items()}
        record["owner"] = None if self.owner is None else self.owner.to_wire()
        record["fenced"] = [fence.to_wire() for fence in self.fenced]
        record["publication"] = None if self.publication is None else self.publication.to_wire()
        record["last_window"] = None if self.last_window is None else self.last_window.to_wire()
        record["totals"] = self.totals.to_wire()
        record["format"] = FORMAT_VERSION
        payload = _packed_with_files(record, self.files)
        return _HEADER.pack(MANIFEST_MAGIC, zlib.crc32(payload), len(payload)) + payload

    @classmethod
    def from_bytes(cls, data: bytes, path: str) -> Manifest:
        if len(data) < _HEADER.size:
            raise StoreCorruptError(path, f"manifest is {len(data)} bytes, shorter than its header")
        magic, crc, length = _HEADER.unpack_from(data)
        payload = data[_HEADER.size :]
        if magic != MANIFEST_MAGIC:
            raise StoreCorruptError(path, "not a dedupsink manifest (bad magic)")
        if len(payload) != length:
            raise StoreCorruptError(path, f"manifest truncated: {len(payload)} of {length} bytes")
        if zlib.crc32(payload) != crc:
            raise StoreCorruptError(path, "manifest checksum mismatch")
        try:
            record = msgpack.unpackb(payload, raw=False, strict_map_key=False)
            return cls._from_record(record)
        except (ValueError, TypeError, KeyError, msgpack.UnpackException) as exc:
            raise StoreCorruptError(path, f"manifest cannot be decoded: {exc}") from exc

    @classmethod
    def _from_record(cls, record: dict[str, Any]) -> Manifest:
        if record["format"] != FORMAT_VERSION:
            age = "newer" if record["format"] > FORMAT_VERSION else "older"
            raise ValueError(
                f"format {record['format']} is {age} than this dedupsink reads ({FORMAT_VERSION})"
            )
        record["settings"] = StoreSettings.from_wire(record["settings"])
        record["files"] = {
            name: WindowFile.from_wire(info) for name, info in record["files"].items()
        }
        record["buckets"] = {
            int(bucket): [Segment._make(entry) for entry in segments]
            for bucket, segments in record["buckets"].items()
        }
        record["tombstones"] = [tuple(t) for t in record["tombstones"]]
        record["ports"] = {
            port: PortState.from_wire(state) for port, state in record["ports"].items()
        }
        record["owner"] = Owner.from_wire(record["owner"])
        record["fenced"] = [Fence.from_wire(fence) for fence in record["fenced"]]
        record["publication"] = Publication.from_wire(record["publication"])
        record["last_window"] = WindowRecord.from_wire(record["last_window"])
        record["totals"] = StoreTotals.from_wire(record["totals"])
        return cls(**record)


def _packed_with_files(record: dict[str, Any], files: dict[str, WindowFile]) -> bytes:
    """``record`` with a ``files`` field, as one msgpack map: msgpack is concatenative, so
    the files' entries are spliced in as each was packed once."""
    packer = msgpack.Packer(use_bin_type=True)
    parts = [packer.pack_map_header(len(record) + 1)]
    for key, value in record.items():
        parts += [packer.pack(key), packer.pack(value)]
    parts += [packer.pack("files"), packer.pack_map_header(len(files))]
    for name, window_file in files.items():
        parts += [packer.pack(name), window_file.packed]
    return b"".join(parts)


@dataclass(frozen=True)
class DecodedSegment:
    h1: np.ndarray
    h2: np.ndarray
    stamps: np.ndarray | None


class BucketGroups(NamedTuple):
    """Positions grouped by bucket: ``order[start:end]`` are those of ``bucket``, one triple of
    ``spans`` per bucket present, in bucket order."""

    order: np.ndarray
    spans: list[tuple[int, int, int]]  # (bucket, start, end)


def group_by_bucket(buckets: np.ndarray, within: np.ndarray | None = None) -> BucketGroups:
    """Group positions by bucket, keeping their order inside each bucket: position order, or
    the order of ``within`` (positions). A stable radix sort when the bucket numbers fit 16
    bits, ten times faster than sorting 64-bit ones (20,000 keys: 0.05 ms and 0.6 ms)."""
    keys = buckets if within is None else buckets[within]
    if len(keys) and keys.min() >= 0 and keys.max() <= np.iinfo(np.uint16).max:
        keys = keys.astype(np.uint16)
    order = np.argsort(keys, kind="stable")
    if within is not None:
        order = within[order]
    grouped = buckets[order]
    if len(grouped) == 0:
        return BucketGroups(order, [])
    edges = (np.flatnonzero(grouped[1:] != grouped[:-1]) + 1).tolist()
    starts, ends = [0, *edges], [*edges, len(grouped)]
    return BucketGroups(order, list(zip(grouped[starts].tolist(), starts, ends, strict=True)))


def encode_segments(
    buckets: np.ndarray,
    h1: np.ndarray,
    h2: np.ndarray,
    stamps: np.ndarray | None,
    file_name: str,
) -> tuple[bytes | memoryview, dict[int, Segment]]:
    """Lay out new keys bucket after bucket; returns the file bytes and each bucket's segment.

    The file is filled in place, lane by lane: no per-bucket copies joined twice, which
    made writing a large window's keys hold four copies of them at once."""
    if len(buckets) == 0:
        return WINDOW_MAGIC, {}
    groups = group_by_bucket(buckets)
    lanes = [h1, h2] if stamps is None else [h1, h2, stamps]
    width = 8 * len(lanes)
    head = len(WINDOW_MAGIC)
    out = np.empty(head + width * len(buckets), dtype=np.uint8)
    out[:head] = np.frombuffer(WINDOW_MAGIC, dtype=np.uint8)
    for lane_number, lane in enumerate(lanes):
        little = lane.dtype.newbyteorder("<")
        values = lane[groups.order].astype(little, copy=False)
        for _, start, end in groups.spans:
            at = head + width * start + 8 * (end - start) * lane_number
            out[at : at + 8 * (end - start)].view(little)[:] = values[start:end]
    view = out.data
    segments: dict[int, Segment] = {}
    for bucket, start, end in groups.spans:
        offset, length = head + width * start, width * (end - start)
        crc = zlib.crc32(view[offset : offset + length])
        segments[bucket] = Segment(file_name, offset, length, end - start, crc)
    return view, segments


def check_segment(
    raw: SegmentBytes, segment: Segment, stamp_dtype: np.dtype | None, path: str
) -> None:
    """Check a segment's bytes against the index: length, checksum and layout."""
    if len(raw) != segment.length:
        raise StoreCorruptError(
            path, f"segment at {segment.offset} is {len(raw)} bytes, index says {segment.length}"
        )
    if zlib.crc32(raw) != segment.crc:
        raise StoreCorruptError(path, f"segment at {segment.offset} fails its checksum")
    width = 2 + (stamp_dtype is not None)
    if segment.length != 8 * segment.count * width:
        raise StoreCorruptError(
            path, f"segment at {segment.offset} has a length that fits no layout"
        )


def decode_segment(
    raw: SegmentBytes, segment: Segment, stamp_dtype: np.dtype | None, path: str
) -> DecodedSegment:
    """Decode one segment, checking its length and checksum against the index."""
    check_segment(raw, segment, stamp_dtype, path)
    n = segment.count
    words = np.frombuffer(raw, dtype="<u8")
    stamps = None
    if stamp_dtype is not None:
        stamps = np.frombuffer(
            raw, dtype=np.dtype(stamp_dtype).newbyteorder("<"), offset=16 * n, count=n
        )
        stamps = stamps.astype(stamp_dtype)
    return DecodedSegment(words[:n].astype(np.uint64), words[n : 2 * n].astype(np.uint64), stamps)


def concat_segments(
    raws: Sequence[SegmentBytes],
    segments: list[Segment],
    stamp_dtype: np.dtype | None,
    paths: list[str],
    file_name: str,
    offset: int,
    forget_at_or_below: float | None = None,
    each_key: bool = False,
) -> tuple[list[memoryview], Segment | None, float | None, float | None]:
    """Several checked segments as one, without sorting: the ``h1`` lanes back to back, then
    the ``h2`` lanes, then the stamps. Segments whose every stamp is at or below
    ``forget_at_or_below`` are left out (their keys are forgotten); with ``each_key`` so are
    such keys of the other segments (a hash bucket's segments mix old and new keys; a time
    bucket's are dropped whole). Returns the new segment's byte chunks (views of ``raws``
    where no key was left out), its index entry at ``offset`` in ``file_name`` (None if
    nothing is left), and its largest and smallest stamps."""
    for raw, segment, path in zip(raws, segments, paths, strict=True):
        check_segment(raw, segment, stamp_dtype, path)
    width = 2 + (stamp_dtype is not None)
    little = None if stamp_dtype is None else np.dtype(stamp_dtype).newbyteorder("<")
    kept: list[list[memoryview]] = []
    count, top, low = 0, None, None
    for raw, segment in zip(raws, segments, strict=True):
        n = segment.count
        lanes = [memoryview(raw)[8 * n * lane : 8 * n * (lane + 1)] for lane in range(width)]
        if n and little is not None:
            stamps = np.frombuffer(lanes[2], dtype=little)
            if forget_at_or_below is not None:
                alive = is_alive(stamps, forget_at_or_below)
                if not alive.any():
                    continue
                if each_key and not alive.all():
                    lanes = [_kept_words(lane, alive) for lane in lanes]
                    stamps, n = stamps[alive], int(alive.sum())
            highest, lowest = stamps.max().item(), stamps.min().item()
            top = highest if top is None else max(top, highest)
            low = lowest if low is None else min(low, lowest)
        if n:
            kept.append(lanes)
            count += n
    if not kept:
        return [], None, None, None
    chunks = [lanes[lane] for lane in range(width) for lanes in kept]
    crc = 0
    for chunk in chunks:
        crc = zlib.crc32(chunk, crc)
    return chunks, Segment(file_name, offset, 8 * count * width, count, crc), top, low


def _kept_words(lane: memoryview, keep: np.ndarray) -> memoryview:
    """The 64-bit words of a lane where ``keep`` is set, as bytes."""
    return memoryview(np.frombuffer(lane, dtype="<u8")[keep]).cast("B")
