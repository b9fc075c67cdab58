"""What the object stores (S3, GCS, Azure Blob) share: no folders and no rename, a conditional
PUT and a server-side copy; batched deletes; the check of a query's start that the bucket can
be reached, with one line saying why not."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterable
from typing import Any, ClassVar
from urllib.parse import urlsplit

import fsspec

from dedupsink.errors import DedupOptionError, StoreUnavailableError
from dedupsink.masking import mask_values, storage_secrets
from dedupsink.options import STORAGE_OPTION_PREFIX
from dedupsink.store.storage.base import Storage

# How long the check of a query's start waits for a TCP connection to an endpoint set in the
# options: a refused one fails at once, a silent host after this.
_CONNECT_SECONDS = 2.0


class ObjectStorage(Storage):
    """Object stores: no folders, no rename; a conditional PUT and a server-side copy."""

    service = "object store"  # in errors: "a reachable S3 endpoint"
    # The storage options that say where the client connects, named in errors when set.
    endpoint_options: ClassVar[tuple[str, ...]] = ("endpoint_url",)

    def folders(self, folder: str) -> list[str]:
        return []  # a "folder" is a name prefix: nothing is left once its files are deleted

    def ensure_folder(self, folder: str) -> None:
        return  # an object's name makes its "folder"; creating one costs a request for nothing

    def create(self, path: str, data: bytes) -> None:
        # A create whose reply was lost finds its own object on the retry (FileExistsError):
        # its callers tell their own bytes from another writer's.
        self._call(f"PUT {path} (create)", self.fs.pipe_file, path, data, mode="create")

    def publish(self, source: str, target: str, size: int | None = None) -> None:
        try:
            # fs.copy would read '[', '*', '?' as a pattern
            self._call(f"COPY {target}", self.fs.cp_file, source, target)
        except FileNotFoundError as exc:
            self._published_already(source, target, exc)

    def delete(self, paths: Iterable[str]) -> None:
        # fs.rm(list) expands each path as a glob pattern: a name holding '[', '*' or '?' (from
        # the root the user chose) would delete the names it matches. Those go one by one.
        batch: list[str] = []
        literal: list[str] = []
        for path in paths:
            (literal if self._reads_as_pattern(path) else batch).append(path)
        if batch:
            with contextlib.suppress(FileNotFoundError):
                self._call(f"DELETE {len(batch)} objects", self.fs.rm, batch)
        super().delete(literal)

    def discard_folder(self, folder: str, files: list[str]) -> None:
        # A folder is only a name prefix here: deleting the known files removes it, without
        # the listing a recursive delete would need.
        self.delete(files)

    def check_reachable(self, option: str) -> None:
        silent = self.silent_endpoint()
        if silent is not None:
            # Before any request: the client retries a refused connection for seconds, and
            # asks for credentials before it connects at all.
            secrets = self.secrets()
            raise DedupOptionError(option, mask_values(self.url, secrets), silent)
        bucket = self.root.split("/", 1)[0]
        try:
            # A store that accepts connections and never answers fails the start in seconds.
            self.attempts.run(f"HEAD {bucket}", self.fs.info, bucket, budget=self.bounds.start)
        except Exception as exc:
            refusal = self.refusal(exc, option)
            if refusal is None:
                raise
            raise refusal from exc

    def refusal(self, exc: BaseException, option: str) -> DedupOptionError | None:
        """The option error for a failure of the client to use the root at all (no bucket, no
        access, no credentials, no endpoint), in one line with the endpoint shown and secrets
        masked; None for any other failure. ``check_reachable`` and the CLI share it."""
        bucket = self.root.split("/", 1)[0]
        at = f" at {self.endpoint()}" if self.endpoint() else ""
        if isinstance(exc, StoreUnavailableError):
            accepted = self.silent_text()
        elif isinstance(exc, FileNotFoundError):
            accepted = f"a URL in an existing bucket or container: {bucket!r} does not exist{at}"
        elif isinstance(exc, PermissionError):
            accepted = f"a location these credentials may use: access denied{at} ({one_line(exc)})"
        else:
            accepted = self.client_problem(exc) or ""
            if not accepted and isinstance(exc, self.client_errors()):
                accepted = f"a reachable location{at} ({type(exc).__name__}: {one_line(exc)})"
        if not accepted:
            return None
        secrets = self.secrets()
        return DedupOptionError(
            option, mask_values(self.url, secrets), mask_values(accepted, secrets)
        )

    def endpoint(self) -> str | None:
        """Where the client sends its requests, when set (shown in errors)."""
        return None

    def silent_endpoint(self) -> str | None:
        """What is accepted, when nothing listens at the endpoint set (one TCP connection, at
        most ``_CONNECT_SECONDS``); None when it answers or none is set."""
        endpoint = self.endpoint()
        if not endpoint or not endpoint.startswith(("http://", "https://")):
            return None
        where = urlsplit(endpoint)
        port = where.port or (443 if where.scheme == "https" else 80)
        try:
            with socket.create_connection((where.hostname or "", port), _CONNECT_SECONDS):
                return None
        except OSError as exc:
            why = "connection refused" if isinstance(exc, ConnectionRefusedError) else one_line(exc)
            return f"{self.nothing_answers(endpoint)} ({why})"

    def silent_text(self) -> str:
        """What is accepted when the endpoint takes connections but never replies."""
        endpoint = self.endpoint() or self.service
        return (
            f"an endpoint that answers: the {self.service} endpoint {endpoint}{self._named()} "
            "accepted the "
            f"connection but sent no reply within {self.bounds.start:g} s (storageConnectTimeout)"
        )

    def nothing_answers(self, endpoint: str) -> str:
        """What is accepted when no server answers at ``endpoint``."""
        return f"a reachable {self.service} endpoint: nothing answers at {endpoint}{self._named()}"

    def configured_options(self) -> dict[str, Any]:
        """The storage options the filesystem took from fsspec's own configuration
        (``fsspec.config.conf``: its config files and ``FSSPEC_<PROTOCOL>_<NAME>`` variables),
        which fsspec adds to the user's when it makes the filesystem: the checks of a query's
        start read them as the filesystem does."""
        configured = fsspec.config.apply_config(type(self.fs), {})
        return {name: value for name, value in configured.items() if name not in self.options}

    def secrets(self) -> list[object]:
        """The values errors must not show: of the user's options and of fsspec's configuration."""
        return storage_secrets({**self.configured_options(), **self.options})

    def _named(self) -> str:
        """Where the endpoint was set, in parentheses ("" when not by an option)."""
        configured = self.configured_options()
        for name in self.endpoint_options:
            if name in self.options:
                return f" ({STORAGE_OPTION_PREFIX}{name})"
            if name in configured:
                return f" ({name} in fsspec's configuration)"
        return ""

    def client_problem(self, exc: BaseException) -> str | None:
        """What is accepted, for a failure particular to the client (credentials, endpoint)."""
        return None

    def client_errors(self) -> tuple[type[BaseException], ...]:
        """What the filesystem's client raises when it cannot reach or use the service."""
        return (OSError,)


def one_line(exc: BaseException) -> str:
    """An exception's message on one line."""
    return " ".join(str(exc).split()) or type(exc).__name__
