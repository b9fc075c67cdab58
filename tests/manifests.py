"""Manifests as an earlier release of dedupsink wrote them, for the tests of reading old stores."""

from __future__ import annotations

import zlib

import msgpack

from dedupsink.store.format import _HEADER, MANIFEST_MAGIC, Manifest


def recorded_without(manifest: Manifest, setting: str) -> bytes:
    """``manifest``'s bytes as written before the store recorded ``setting``."""
    record = msgpack.unpackb(manifest.to_bytes()[_HEADER.size :], raw=False)
    del record["settings"][setting]
    payload = msgpack.packb(record, use_bin_type=True)
    return _HEADER.pack(MANIFEST_MAGIC, zlib.crc32(payload), len(payload)) + payload
