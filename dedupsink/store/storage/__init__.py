"""Storage: what the store and the ports need from a filesystem, one class per family.

Every filesystem difference the commit protocol depends on lives here, behind one narrow
interface (as Delta Lake's LogStore or pyiceberg's FileIO), one module per family: ``base``
(the interface and what every family shares), ``local``, ``memory``, ``hdfs``, and the object
stores' ``object_store`` with ``s3``, ``gcs`` and ``azure`` on it; ``paths`` joins and splits
names. Each operation's contract and how each family meets it: docs/RELIABILITY.md, "What
the store needs from a filesystem". ``Storage.for_url`` chooses among the families imported
here, each registered as its class is defined.
"""

from __future__ import annotations

from dedupsink.options import StorageBounds
from dedupsink.store.storage.azure import AzureStorage
from dedupsink.store.storage.base import Entry, Storage
from dedupsink.store.storage.gcs import GcsStorage
from dedupsink.store.storage.hdfs import HdfsStorage
from dedupsink.store.storage.local import LocalStorage
from dedupsink.store.storage.memory import MemoryStorage
from dedupsink.store.storage.object_store import ObjectStorage
from dedupsink.store.storage.paths import basename, join, parent, resolve_path
from dedupsink.store.storage.s3 import S3Storage

__all__ = [
    "AzureStorage",
    "Entry",
    "GcsStorage",
    "HdfsStorage",
    "LocalStorage",
    "MemoryStorage",
    "ObjectStorage",
    "S3Storage",
    "Storage",
    "StorageBounds",
    "basename",
    "join",
    "parent",
    "resolve_path",
]
