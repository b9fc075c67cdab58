"""Azure Blob Storage and ADLS Gen2 through adlfs: the SDK's retries off, one request a
deleted blob, a server-side copy awaited until it is done."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Iterable
from typing import Any

import fsspec

from dedupsink.options import StorageBounds
from dedupsink.store.storage.base import Storage
from dedupsink.store.storage.object_store import ObjectStorage

# Where UseDevelopmentStorage=true sends the Azure SDK: Azurite's documented Blob endpoint.
_EMULATOR_ENDPOINT = "http://127.0.0.1:10000/devstoreaccount1"


class AzureStorage(ObjectStorage):
    """Azure Blob Storage and ADLS Gen2 through adlfs."""

    family = "azure"
    service = "Azure Blob"
    protocols = ("abfs", "az", "abfss")
    example_options = ("account_name", "account_key", "connection_string")
    endpoint_options = ("connection_string", "account_host")

    @classmethod
    def fs_options(cls, options: dict[str, Any], bounds: StorageBounds) -> dict[str, Any]:
        given = super().fs_options(options, bounds)
        given.setdefault("connection_timeout", max(1, round(bounds.connect_timeout)))
        given.setdefault("read_timeout", max(1, round(bounds.read_timeout)))
        return given

    def tune_client(self) -> None:
        # Azure's SDK retries ten times, its pauses starting at 15 s, and adlfs takes no option
        # for it: its policy object, shared by every client made from the service's, is told
        # to leave retries to ``Attempts``.
        config = getattr(getattr(self.fs, "service_client", None), "_config", None)
        policy = getattr(config, "retry_policy", None)
        for name in ("total_retries", "connect_retries", "read_retries", "status_retries"):
            if hasattr(policy, name):
                setattr(policy, name, 0)

    def endpoint(self) -> str | None:
        # What adlfs connects to, read from the filesystem: its connection string came from the
        # option, fsspec's configuration or AZURE_STORAGE_CONNECTION_STRING alike.
        connection = getattr(self.fs, "connection_string", None)
        if connection:
            return blob_endpoint(connection)
        host = getattr(self.fs, "account_host", None)
        return f"https://{host}" if host else None

    def client_errors(self) -> tuple[type[BaseException], ...]:
        from azure.core.exceptions import AzureError

        return (OSError, AzureError)

    def delete(self, paths: Iterable[str]) -> None:
        # One request a blob, each retried on its own: adlfs's bulk rm first asks each blob
        # whether it exists, so one throttled request out of dozens would redo them all.
        Storage.delete(self, paths)

    def publish(self, source: str, target: str, size: int | None = None) -> None:
        super().publish(source, target, size)
        # adlfs starts a server-side copy and returns; Azure may report it "pending", and the
        # commit deletes the staged source next, which would fail a copy still running.
        self._call(f"HEAD {target} (copy status)", self._await_copy, target)

    def _await_copy(self, target: str) -> None:
        fsspec.asyn.sync(self.fs.loop, self._copy_done, target, timeout=self.bounds.attempt)

    async def _copy_done(self, target: str) -> None:
        container, blob, _ = self.fs.split_path(target)
        client = self.fs.service_client.get_container_client(container).get_blob_client(blob)
        pause = 0.05
        while True:
            copy = (await client.get_blob_properties()).copy
            if copy.status in (None, "success"):
                return
            if copy.status != "pending":
                raise OSError(
                    errno.EIO,
                    f"copy into {self.full_url(target)} {copy.status}: {copy.status_description}",
                )
            await asyncio.sleep(pause)
            pause = min(2 * pause, 2.0)


def blob_endpoint(connection_string: str) -> str | None:
    """The Blob service endpoint a connection string names (``BlobEndpoint=...``, or the
    emulator's for ``UseDevelopmentStorage=true``); None for Azure's own, derived from the
    account, or a string that does not parse (the client says what is wrong with it)."""
    from azure.core.utils import parse_connection_string

    try:
        parts = parse_connection_string(connection_string)  # keys lower-cased
    except ValueError:
        return None
    if parts.get("blobendpoint"):
        return str(parts["blobendpoint"])
    if str(parts.get("usedevelopmentstorage", "")).lower() == "true":
        return _EMULATOR_ENDPOINT
    return None
