"""Storage: what the store and the ports need from a filesystem, one class per family.

Every filesystem difference the commit protocol depends on lives here, behind one narrow
interface (as Delta Lake's LogStore or pyiceberg's FileIO). Each operation's contract and how
each family meets it: docs/RELIABILITY.md, "What the store needs from a filesystem". Every path
is a name, never a pattern (fsspec's ``rm``, ``copy`` and ``mv`` would expand globs).
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import errno
import inspect
import io
import os
import re
import socket
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any, ClassVar, TypeVar
from urllib.parse import urlsplit

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from dedupsink.errors import DedupOptionError, StoreError, StoreUnavailableError
from dedupsink.masking import MASK, mask_values, storage_secrets
from dedupsink.options import STORAGE_OPTION_PREFIX, StorageBounds
from dedupsink.store.retry import Attempts

__all__ = [
    "Entry",
    "Storage",
    "StorageBounds",
    "basename",
    "join",
    "parent",
    "resolve_path",
]

T = TypeVar("T")
SUPPORTED = (
    "a local path, file://, memory://, hdfs://, viewfs://, s3://, s3a://, gs://, abfs:// or az://"
)
# s3fs copies objects up to this size with one CopyObject request; larger ones need a
# multipart copy, which fs.cp_file does.
_S3_SINGLE_COPY_LIMIT = 5 * 2**30
_S3_DELETE_BATCH = 1000
# How long the check of a query's start waits for a TCP connection to an endpoint set in the
# options: a refused one fails at once, a silent host after this.
_CONNECT_SECONDS = 2.0
# What fsspec reads as a glob pattern in a path given to rm, copy or mv.
_GLOB_CHARS = re.compile(r"[*?[]")
_S3_CONFLICT_PAUSES = (0.05, 0.1, 0.2, 0.4, 0.8)  # seconds before each retry of a 409
_TOGETHER = 8  # the most requests ``Storage.together`` has in flight


def join(*parts: str) -> str:
    """Join path or URL segments with '/', whatever the filesystem."""
    head, *rest = parts
    return "/".join([head.rstrip("/"), *(part.strip("/") for part in rest)])


def parent(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[0]


def basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Entry:
    """A listed file: its name (no folder), size, and a tag that changes when it is rewritten
    (ETag, generation, or modification time and inode on a local disk)."""

    name: str
    size: int
    tag: str


class Storage(ABC):
    """One filesystem root, reached through fsspec; pickles as its URL and storage options.

    ``root`` is the path of ``url`` inside the filesystem; every method takes such paths
    (``storage.path(...)`` builds them)."""

    family: ClassVar[str] = ""
    protocols: ClassVar[tuple[str, ...]] = ()
    remote: ClassVar[bool] = True  # every call is a network request
    # Whether fs.rm expands '[', '*' and '?' in a path as a glob (fsspec's own rm does; the
    # local and HDFS filesystems' do not).
    rm_reads_patterns: ClassVar[bool] = True
    _registry: ClassVar[list[type[Storage]]] = []

    def __init__(
        self,
        url: str,
        fs: fsspec.AbstractFileSystem,
        root: str,
        options: dict[str, Any],
        bounds: StorageBounds | None = None,
    ):
        self.url = url
        self.fs = fs
        self.root = root.rstrip("/") or "/"
        self.options = options
        self.bounds = bounds or StorageBounds()
        self.attempts = Attempts(self.bounds, mask_values(url, storage_secrets(options)))
        self.tune_client()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        Storage._registry.append(cls)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Storage.for_url, (self.url, self.options, "path", self.bounds))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # -- choosing a family -------------------------------------------------------------------

    @staticmethod
    def for_url(
        url: str,
        options: dict[str, Any] | None = None,
        option: str = "path",
        bounds: StorageBounds | None = None,
    ) -> Storage:
        """The storage of ``url``; ``option`` names the option it came from in errors.

        The family is chosen from the filesystem class fsspec registers for the URL's protocol,
        before any instance (or connection) is made, so an unsupported one is refused at once.
        """
        options = dict(options or {})
        protocol, _ = fsspec.core.split_protocol(url)
        try:
            fs_class = fsspec.get_filesystem_class(protocol or "file")
        except ValueError as exc:
            raise DedupOptionError(option, url, f"{SUPPORTED}: {exc}") from exc
        except ImportError as exc:
            raise DedupOptionError(
                option, url, f"a URL whose fsspec package is installed ({exc})"
            ) from exc
        family = next((f for f in Storage._registry if f.handles(fs_class)), None)
        if family is None:
            raise DedupOptionError(
                option,
                url,
                f"{SUPPORTED}: the {protocol}:// filesystem ({fs_class.__name__}) offers no atomic "
                "conditional create, which every commit of the store needs",
            )
        family.check_option_names(fs_class, options)
        bounds = bounds or StorageBounds()
        try:
            fs, root = fsspec.core.url_to_fs(url, **family.fs_options(options, bounds))
        except (TypeError, ValueError) as exc:
            raise DedupOptionError(option, url, f"a URL fsspec can open: {exc}") from exc
        return family(url, fs, root, options, bounds)

    @classmethod
    def handles(cls, fs_class: type) -> bool:
        return any(p in _protocols(fs_class) for p in cls.protocols)

    @classmethod
    def option_names(cls, fs_class: type) -> frozenset[str] | None:
        """The storage options the filesystem takes: the named parameters of the ``__init__``
        of its class and of the classes it builds on, of fsspec's listings cache, and the names
        fsspec itself reads (``skip_instance_cache``); None where it takes any name. Every
        filesystem of fsspec ignores a name it does not know, so a misspelt one is refused
        here rather than silently ignored."""
        from fsspec.dircache import DirCache

        names = {"skip_instance_cache", *getattr(fs_class, "_strip_tokenize_options", ())}
        for owner in (*fs_class.__mro__, *DirCache.__mro__):
            init = owner.__dict__.get("__init__")
            if init is not None and owner is not object:
                names.update(_named_parameters(init))
        return frozenset(names | set(cls.more_option_names))

    # Names a filesystem reads from its **kwargs, not from its signature.
    more_option_names: ClassVar[tuple[str, ...]] = ()
    # What an unknown name with no close match is shown as examples of.
    example_options: ClassVar[tuple[str, ...]] = ("auto_mkdir",)

    @classmethod
    def takes_option(cls, name: str, known: frozenset[str]) -> bool:
        return name in known

    @classmethod
    def check_option_names(cls, fs_class: type, options: dict[str, Any]) -> None:
        """Refuse a storage option the filesystem does not know, with the closest known name."""
        known = cls.option_names(fs_class)
        if known is None:
            return
        for name in sorted(n for n in options if not cls.takes_option(n, known)):
            close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
            shown = MASK if storage_secrets({name: options[name]}) else options[name]
            hint = (
                f"did you mean {STORAGE_OPTION_PREFIX}{close[0]}?"
                if close
                else "e.g. " + ", ".join(STORAGE_OPTION_PREFIX + n for n in cls.example_options)
            )
            raise DedupOptionError(
                STORAGE_OPTION_PREFIX + name,
                shown,
                f"a storage option {fs_class.__name__} takes: {hint}",
            )

    @classmethod
    def fs_options(cls, options: dict[str, Any], bounds: StorageBounds) -> dict[str, Any]:
        """Storage options for fsspec: the user's, with listings never cached (a listing another
        process has since changed must not be reused); remote families add the client's
        timeouts and leave retries to ``Attempts``, unless the user set them."""
        return {**options, "use_listings_cache": False}

    def tune_client(self) -> None:
        """Bound what the client's options cannot (a family's hook, run once per instance)."""
        return

    def together(self, calls: Iterable[Callable[[], object]]) -> None:
        """Make independent calls: at once on a remote family (each a round trip, the client's
        loop sends them side by side), one after the other on a local one. The first failure
        is raised once every call has ended."""
        pending = list(calls)
        if not self.remote or len(pending) < 2:
            for call in pending:
                call()
            return
        with ThreadPoolExecutor(min(len(pending), _TOGETHER)) as pool:
            futures = [pool.submit(call) for call in pending]
        for future in futures:
            future.result()

    def _call(self, operation: str, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``call`` (a method of the filesystem, or a function of this class's) within the
        bounds: retried on transient faults, given up with ``StoreUnavailableError`` once the
        budget is spent. Remote families only: a local disk's failures are answers."""
        if not self.remote:
            return call(*args, **kwargs)
        return self.attempts.run(operation, call, *args, **kwargs)

    # -- paths ---------------------------------------------------------------------------------

    def path(self, *parts: str) -> str:
        return join(self.root, *parts) if parts else self.root

    def full_url(self, path: str) -> str:
        """A path of this filesystem as a URL with its protocol."""
        return str(self.fs.unstrip_protocol(path))

    def protocol_names(self) -> set[str]:
        """The URL schemes that name this filesystem (``s3`` and ``s3a`` for s3fs)."""
        return set(_protocols(type(self.fs)))

    # -- reading (never cached) ------------------------------------------------------------------

    def read(self, path: str) -> bytes:
        return bytes(self._call(f"GET {path}", self.fs.cat_file, path))

    def open_read(self, path: str) -> IO[bytes]:
        """``path`` for reading as a file: a remote one read whole, within the bounds (a
        stream's reads would each be a request no retry covers)."""
        if not self.remote:
            return self.fs.open(path, "rb")  # type: ignore[no-any-return]
        return io.BytesIO(self.read(path))

    def read_range(self, path: str, start: int, end: int) -> bytes:
        """The bytes of ``path`` from ``start`` to ``end``: fewer at the end of a short file,
        none from its end on (object stores answer such a range with an error, 416, which
        would hide a truncated file's name; the caller's length check names it)."""
        try:
            return bytes(self._call(f"GET {path}", self.fs.cat_file, path, start=start, end=end))
        except (FileNotFoundError, StoreUnavailableError):
            raise
        except Exception:  # each client raises its own type for a 416: asking the size is exact
            if start < self.size(path):
                raise
            return b""

    def read_into(self, path: str, offset: int, view: memoryview) -> int:
        """Fill ``view`` from ``path`` at ``offset``; returns the bytes read (fewer at the end of
        a short file)."""
        data = self.read_range(path, offset, offset + len(view))
        view[: len(data)] = data
        return len(data)

    def entries(self, folder: str) -> dict[str, Entry]:
        """The files directly in ``folder`` by name; empty when the folder does not exist."""
        try:
            infos = self._call(f"LIST {folder}", self.fs.ls, folder, detail=True)
        except FileNotFoundError:
            return {}
        entries = {}
        for info in infos:
            if info.get("type") == "directory":
                continue
            entry = self._entry(info)
            entries[entry.name] = entry
        return entries

    def _entry(self, info: dict[str, Any]) -> Entry:
        tag = info.get("ETag") or info.get("etag") or info.get("generation") or ""
        return Entry(basename(info["name"]), int(info.get("size") or 0), str(tag))

    def find(self, folder: str) -> list[str]:
        """Every file under ``folder``, at any depth (one listing where the filesystem can)."""
        try:
            found = self._call(f"LIST {folder}", self.fs.find, folder, detail=True)
        except FileNotFoundError:
            return []
        return sorted(name for name, info in found.items() if info.get("type") != "directory")

    def folders(self, folder: str) -> list[str]:
        """The names of the folders directly in ``folder``."""
        try:
            infos = self._call(f"LIST {folder}", self.fs.ls, folder, detail=True)
        except FileNotFoundError:
            return []
        return sorted(basename(i["name"]) for i in infos if i.get("type") == "directory")

    def exists(self, path: str) -> bool:
        return bool(self._call(f"HEAD {path}", self.fs.exists, path))

    def size(self, path: str) -> int:
        return int(self._call(f"HEAD {path}", self.fs.info, path).get("size") or 0)

    # -- writing ---------------------------------------------------------------------------------

    def ensure_folder(self, folder: str) -> None:
        """Create ``folder`` where folders exist (object stores have none: nothing to do)."""
        self._call(f"MKDIR {folder}", self.fs.makedirs, folder, exist_ok=True)

    def write(self, path: str, data: bytes | Iterable[bytes | memoryview]) -> None:
        """Write a whole file (replacing any), from bytes or from chunks in order."""
        self.ensure_folder(parent(path))
        if isinstance(data, bytes | bytearray):
            self._call(f"PUT {path}", self.fs.pipe_file, path, bytes(data))
            return
        chunks: list[bytes | memoryview] = [data] if isinstance(data, memoryview) else list(data)
        if self.remote:
            # One request with a deadline: a file object's upload has none (aiohttp waits for
            # an interim "100 Continue" with no timeout), and buffers a copy of the bytes anyway.
            joined = b"".join(chunks)
            self._call(f"PUT {path}", self.fs.pipe_file, path, joined)
            return
        # The chunks, not their bytes joined: a large fold is written without a second copy.
        self._write_chunks(path, chunks)

    def _write_chunks(self, path: str, chunks: list[bytes | memoryview]) -> None:
        with self.fs.open(path, "wb") as handle:
            for chunk in chunks:
                handle.write(chunk)

    def open_write(self, path: str) -> IO[bytes]:
        """``path`` for writing as a file (replacing any). A remote file is written whole when
        closed, within the bounds: a stream's parts would each be a request no retry covers."""
        self.ensure_folder(parent(path))
        if not self.remote:
            return self.fs.open(path, "wb")  # type: ignore[no-any-return]
        return _WrittenOnClose(self, path)

    @abstractmethod
    def create(self, path: str, data: bytes) -> None:
        """Conditional create: ``data`` appears whole at ``path``, or ``FileExistsError``."""

    @abstractmethod
    def publish(self, source: str, target: str, size: int | None = None) -> None:
        """Make ``source`` readable as ``target`` (``size``: its bytes, when known)."""

    def _published_already(self, source: str, target: str, exc: Exception) -> None:
        """A publication found its source gone: fine if an earlier one made the target."""
        if not self.exists(target):
            raise StoreError(
                f"cannot publish {self.full_url(target)}: its staged file "
                f"{self.full_url(source)} is gone"
            ) from exc

    def delete(self, paths: Iterable[str]) -> None:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                self._call(f"DELETE {path}", self.fs.rm_file, path)

    def _reads_as_pattern(self, path: str) -> bool:
        """Whether ``fs.rm`` would expand ``path`` as a glob instead of taking it as a name."""
        return self.rm_reads_patterns and _GLOB_CHARS.search(path) is not None

    def delete_folder(self, folder: str) -> None:
        if self._reads_as_pattern(folder):
            # rm would delete what the folder's name matches as a pattern: its files by name.
            # A flat object store's folder goes with them; memory:// and a hierarchical
            # namespace (ADLS Gen2) keep it, empty.
            self.delete(self.find(folder))
            return
        with contextlib.suppress(FileNotFoundError):
            self._call(f"DELETE {folder}", self.fs.rm, folder, recursive=True)

    def discard_folder(self, folder: str, files: list[str]) -> None:
        """Remove ``folder``, whose files are known to be ``files``."""
        self.delete_folder(folder)

    def check_reachable(self, option: str) -> None:
        """Fail with an option error if the root cannot be reached (no such bucket, wrong
        credentials, no endpoint): called once when a query starts, before any output.
        A local or in-memory root has nothing to reach: its folders are made on first write."""
        return


class LocalStorage(Storage):
    """The local disk (and filesystems built on fsspec's LocalFileSystem)."""

    family = "local"
    remote = False
    rm_reads_patterns = False

    @classmethod
    def handles(cls, fs_class: type) -> bool:
        return issubclass(fs_class, LocalFileSystem)

    def entries(self, folder: str) -> dict[str, Entry]:
        # One stat a file: fsspec's detailed listing builds a dozen fields for each, several
        # times the stat's cost, and the store lists its log in every task and every commit.
        found: dict[str, Entry] = {}
        try:
            listing = os.scandir(self.fs._strip_protocol(folder))
        except (FileNotFoundError, NotADirectoryError):
            return found
        with listing:
            for item in listing:
                try:
                    if item.is_dir():
                        continue
                    stat = item.stat()
                except FileNotFoundError:  # deleted since it was listed
                    continue
                found[item.name] = Entry(item.name, stat.st_size, f"{stat.st_mtime}:{stat.st_ino}")
        return found

    # Positioned reads on a file descriptor: a window's lookups and folds read dozens of
    # segments, and fsspec's file object costs more per read than the read itself.

    def read_into(self, path: str, offset: int, view: memoryview) -> int:
        with self._descriptor(path) as descriptor:
            filled = 0
            while filled < len(view):
                got = os.preadv(descriptor, [view[filled:]], offset + filled)
                if not got:
                    break
                filled += got
            return filled

    def read_range(self, path: str, start: int, end: int) -> bytes:
        with self._descriptor(path) as descriptor:
            data = os.pread(descriptor, max(end - start, 0), start)
            while len(data) < end - start:  # a short read: the rest, until the file's end
                more = os.pread(descriptor, end - start - len(data), start + len(data))
                if not more:
                    break
                data += more
            return data

    @contextlib.contextmanager
    def _descriptor(self, path: str) -> Iterator[int]:
        descriptor = os.open(self.fs._strip_protocol(path), os.O_RDONLY)
        try:
            yield descriptor
        finally:
            os.close(descriptor)

    def create(self, path: str, data: bytes) -> None:
        # A file written in place could be read half-written, or left torn by a crash; written
        # aside and synced, then hard-linked, it appears whole. link() refuses an existing name
        # (rename would silently replace it).
        aside = join(parent(path), f".{basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
        self.ensure_folder(parent(path))
        with self.fs.open(aside, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            self.fs.link(aside, path)
        except OSError as exc:
            if exc.errno in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV):
                raise StoreError(
                    f"the filesystem at {self.full_url(path)} does not support hard links, "
                    "which the store's conditional commit needs on a local disk"
                ) from exc
            raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(aside)

    def publish(self, source: str, target: str, size: int | None = None) -> None:
        self.ensure_folder(parent(target))
        try:
            self.fs.mv(source, target)
        except FileNotFoundError as exc:
            self._published_already(source, target, exc)


_MEMORY_LOCK = threading.Lock()


class MemoryStorage(Storage):
    """fsspec's in-process memory filesystem (tests and tools; Spark's workers cannot see it)."""

    family = "memory"
    remote = False
    example_options = ("skip_instance_cache",)

    @classmethod
    def handles(cls, fs_class: type) -> bool:
        return issubclass(fs_class, MemoryFileSystem)

    def create(self, path: str, data: bytes) -> None:
        with _MEMORY_LOCK:
            if self.fs.exists(path):
                raise FileExistsError(path)
            self.fs.pipe_file(path, data)

    def publish(self, source: str, target: str, size: int | None = None) -> None:
        with _MEMORY_LOCK:
            if not self.fs.exists(source):
                self._published_already(source, target, FileNotFoundError(source))
                return
            # fs.mv reads '[', '*', '?' in a name as a pattern: copy and remove this file.
            self.fs.cp_file(source, target)
            self.fs.rm_file(source)


class HdfsStorage(Storage):
    """HDFS through hdfs-native: renames are atomic and refuse an existing target."""

    family = "hdfs"
    rm_reads_patterns = False
    protocols = ("hdfs", "viewfs")
    example_options = ("host", "port", "dfs.client.use.datanode.hostname")

    @classmethod
    def takes_option(cls, name: str, known: frozenset[str]) -> bool:
        # hdfs-native hands every other option to the client as a Hadoop setting, whose names
        # all have dots (dfs.ha.namenodes.ns); a name without one is a misspelling.
        return name in known or "." in name

    @classmethod
    def fs_options(cls, options: dict[str, Any], bounds: StorageBounds) -> dict[str, Any]:
        # hdfs-native lists without fsspec's listings cache and passes every option to the
        # client as a Hadoop setting, a string: use_listings_cache=False there, or any boolean,
        # fails the filesystem's construction ("'bool' object is not an instance of 'str'").
        return {
            name: ("true" if value else "false") if isinstance(value, bool) else value
            for name, value in options.items()
        }

    def create(self, path: str, data: bytes) -> None:
        aside = join(parent(path), f".{basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
        self._call(f"PUT {aside}", self.fs.pipe_file, aside, data)
        try:
            # hdfs-native renames without overwrite by default; a rename whose reply was lost
            # finds its own file on the retry (FileExistsError), told apart by its bytes.
            self._call(f"RENAME {path}", self.fs.mv, aside, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(aside)
            raise

    def publish(self, source: str, target: str, size: int | None = None) -> None:
        self.ensure_folder(parent(target))  # a rename does not make the target's folder
        try:
            self._call(f"RENAME {target}", self.fs.mv, source, target)
        except FileNotFoundError as exc:
            self._published_already(source, target, exc)
        except FileExistsError:
            self.delete([source])  # an earlier publication made the target


class ObjectStorage(Storage):
    """Object stores: no folders, no rename; a conditional PUT and a server-side copy."""

    service = "object store"  # in errors: "a reachable S3 endpoint"

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
            secrets = storage_secrets(self.options)
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
            accepted = f"a location these credentials may use: access denied{at} ({_first(exc)})"
        else:
            accepted = self.client_problem(exc) or ""
            if not accepted and isinstance(exc, self.client_errors()):
                accepted = f"a reachable location{at} ({type(exc).__name__}: {_first(exc)})"
        if not accepted:
            return None
        secrets = storage_secrets(self.options)
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
            why = "connection refused" if isinstance(exc, ConnectionRefusedError) else _first(exc)
            return f"{self.nothing_answers(endpoint)} ({why})"

    def silent_text(self) -> str:
        """What is accepted when the endpoint takes connections but never replies."""
        endpoint = self.endpoint() or self.service
        named = " (fs.endpoint_url)" if "endpoint_url" in self.options else ""
        return (
            f"an endpoint that answers: the {self.service} endpoint {endpoint}{named} accepted the "
            f"connection but sent no reply within {self.bounds.start:g} s (storageConnectTimeout)"
        )

    def nothing_answers(self, endpoint: str) -> str:
        """What is accepted when no server answers at ``endpoint``."""
        named = " (fs.endpoint_url)" if "endpoint_url" in self.options else ""
        return f"a reachable {self.service} endpoint: nothing answers at {endpoint}{named}"

    def client_problem(self, exc: BaseException) -> str | None:
        """What is accepted, for a failure particular to the client (credentials, endpoint)."""
        return None

    def client_errors(self) -> tuple[type[BaseException], ...]:
        """What the filesystem's client raises when it cannot reach or use the service."""
        return (OSError,)


class S3Storage(ObjectStorage):
    """Amazon S3 and compatible servers through s3fs."""

    family = "s3"
    service = "S3"
    protocols = ("s3", "s3a")
    example_options = ("endpoint_url", "key", "secret")

    def client_errors(self) -> tuple[type[BaseException], ...]:
        from botocore.exceptions import BotoCoreError, ClientError

        return (OSError, BotoCoreError, ClientError)

    @classmethod
    def option_names(cls, fs_class: type) -> frozenset[str] | None:
        # s3fs hands every name its own __init__ does not take (but fsspec's listings cache
        # options) to aiobotocore's session, which refuses an unknown one only at the first
        # request, as a TypeError naming neither the option nor the right name.
        from aiobotocore.session import AioSession
        from fsspec.dircache import DirCache

        names = {"skip_instance_cache"}
        for owner in (fs_class, DirCache, AioSession):
            init = next(c.__dict__["__init__"] for c in owner.__mro__ if "__init__" in c.__dict__)
            names.update(_named_parameters(init))
        return frozenset(names)

    @classmethod
    def fs_options(cls, options: dict[str, Any], bounds: StorageBounds) -> dict[str, Any]:
        # botocore's timeouts bound each attempt; s3fs's five retries and botocore's own would
        # multiply into minutes for one silent request, so ``Attempts`` alone retries (s3fs's
        # are switched off by ``tune_client``).
        given = super().fs_options(options, bounds)
        config = given.get("config_kwargs")
        if config is None or isinstance(config, dict):
            given["config_kwargs"] = {
                "connect_timeout": bounds.connect_timeout,
                "read_timeout": bounds.read_timeout,
                "retries": {"total_max_attempts": 1},
                **(config or {}),
            }
        return given

    def tune_client(self) -> None:
        self.fs.retries = 1  # a class attribute of s3fs's, no option: its own retries off

    def endpoint(self) -> str | None:
        client = getattr(self.fs, "client_kwargs", None) or {}
        return (
            getattr(self.fs, "endpoint_url", None)
            or client.get("endpoint_url")
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
        )

    def client_problem(self, exc: BaseException) -> str | None:
        from botocore.exceptions import (
            EndpointConnectionError,
            NoCredentialsError,
            PartialCredentialsError,
        )

        cause = _in_chain(
            exc, (NoCredentialsError, PartialCredentialsError, EndpointConnectionError)
        )
        at = f" at {self.endpoint()}" if self.endpoint() else ""
        if isinstance(cause, EndpointConnectionError):
            return self.nothing_answers(self.endpoint() or "AWS")
        if isinstance(cause, PartialCredentialsError):
            given = [f"fs.{n}" for n in _S3_CREDENTIALS.values() if n in self.options]
            missing = _S3_CREDENTIALS.get(str(cause.kwargs.get("cred_var")), "key")
            if given:
                what = f"{' and '.join(given)} set without fs.{missing}"
            else:
                what = f"partial credentials from {cause.kwargs.get('provider')}: {_first(cause)}"
            return f"S3 credentials{at}: {what}; set both fs.key and fs.secret, or neither"
        if isinstance(cause, NoCredentialsError):
            return (
                f"S3 credentials{at}: none found; set fs.key and fs.secret (or "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), or fs.anon=true for a public bucket"
            )
        return None

    def read(self, path: str) -> bytes:
        # A ranged GET: a plain cat_file first asks the object's size with a HEAD. S3 answers
        # a range of an empty object with 416 (InvalidRange): that one is read whole.
        try:
            return bytes(self._call(f"GET {path}", self.fs.cat_file, path, start=0))
        except OSError as exc:
            if "InvalidRange" not in repr(exc.__cause__) and "not satisfiable" not in str(exc):
                raise
            return bytes(self._call(f"GET {path}", self.fs.cat_file, path))

    def create(self, path: str, data: bytes) -> None:
        # S3 answers a conditional PUT that meets another write of the key in flight with 409
        # ConditionalRequestConflict, meaning "retry": the retry creates the object, or finds
        # it (412: FileExistsError, and the caller tells its own bytes from another's).
        for pause in (*_S3_CONFLICT_PAUSES, None):
            try:
                super().create(path, data)
                return
            except OSError as exc:
                if pause is None or not _is_conditional_conflict(exc):
                    raise
                time.sleep(pause)

    def publish(self, source: str, target: str, size: int | None = None) -> None:
        if size is None or size >= _S3_SINGLE_COPY_LIMIT:
            super().publish(source, target, size)
            return
        bucket, key, _ = self.fs.split_path(target)
        source_bucket, source_key, _ = self.fs.split_path(source)
        try:
            # One CopyObject; fs.copy would first HEAD the source and list both folders.
            self._call(
                f"COPY {target}",
                self.fs.call_s3,
                "copy_object",
                Bucket=bucket,
                Key=key,
                CopySource={"Bucket": source_bucket, "Key": source_key},
            )
        except FileNotFoundError as exc:
            self._published_already(source, target, exc)

    def exists(self, path: str) -> bool:
        # One HEAD: fs.exists also lists the parent when the object is missing.
        bucket, key, _ = self.fs.split_path(path)
        try:
            self._call(f"HEAD {path}", self.fs.call_s3, "head_object", Bucket=bucket, Key=key)
        except FileNotFoundError:
            return False
        return True

    def delete(self, paths: Iterable[str]) -> None:
        # DeleteObjects, a thousand keys a request; fs.rm(list) would read '[' in a key as a
        # glob pattern. S3 reports a key it could not delete inside a successful reply, which
        # s3fs ignores: a denied delete would leave garbage with no error at all.
        by_bucket: dict[str, list[str]] = {}
        for path in paths:
            bucket, key, _ = self.fs.split_path(path)
            by_bucket.setdefault(bucket, []).append(key)
        for bucket, keys in by_bucket.items():
            for start in range(0, len(keys), _S3_DELETE_BATCH):
                self._delete_objects(bucket, keys[start : start + _S3_DELETE_BATCH])
        self.fs.invalidate_cache()

    def _delete_objects(self, bucket: str, keys: list[str]) -> None:
        objects = [{"Key": key} for key in keys]
        reply = self._call(
            f"DELETE {len(keys)} objects",
            self.fs.call_s3,
            "delete_objects",
            Bucket=bucket,
            Delete={"Objects": objects, "Quiet": True},
        )
        failed = [e for e in reply.get("Errors") or [] if e.get("Code") != "NoSuchKey"]
        if failed:
            first = failed[0]
            raise OSError(
                errno.EIO,
                f"S3 refused to delete {len(failed)} of {len(keys)} objects, the first "
                f"s3://{bucket}/{first.get('Key')}: {first.get('Code')} {first.get('Message')}",
            )


# botocore's name of a credential, as the s3fs parameter (the sink's fs.<name>) that sets it.
_S3_CREDENTIALS = {
    "aws_access_key_id": "key",
    "aws_secret_access_key": "secret",
    "aws_session_token": "token",
}
_CONFLICT = "ConditionalRequestConflict"


def _is_conditional_conflict(exc: BaseException) -> bool:
    """Whether s3fs's error is S3's 409 ConditionalRequestConflict (s3fs raises it as a plain
    OSError, the client's error as its cause)."""
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict) and response.get("Error", {}).get("Code") == _CONFLICT:
            return True
        seen = seen.__cause__ or seen.__context__
    return _CONFLICT in str(exc)


class GcsStorage(ObjectStorage):
    """Google Cloud Storage through gcsfs."""

    family = "gcs"
    service = "GCS"
    protocols = ("gs", "gcs")
    more_option_names = ("memmove_max_workers",)
    example_options = ("project", "token", "endpoint_url")

    @classmethod
    def fs_options(cls, options: dict[str, Any], bounds: StorageBounds) -> dict[str, Any]:
        # gcsfs retries inside each call (up to six times, pausing up to 32 s): the attempt's
        # deadline cuts that short. Each request connects and reads within the bounds (not a
        # total, which would cut a large file's transfer).
        from aiohttp import ClientTimeout

        given = super().fs_options(options, bounds)
        given.setdefault(
            "requests_timeout",
            ClientTimeout(sock_connect=bounds.connect_timeout, sock_read=bounds.read_timeout),
        )
        return given

    def client_errors(self) -> tuple[type[BaseException], ...]:
        from aiohttp import ClientError
        from gcsfs.retry import HttpError

        return (OSError, ClientError, HttpError)


class AzureStorage(ObjectStorage):
    """Azure Blob Storage and ADLS Gen2 through adlfs."""

    family = "azure"
    service = "Azure Blob"
    protocols = ("abfs", "az", "abfss")
    example_options = ("account_name", "account_key", "connection_string")

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


class _WrittenOnClose(io.BytesIO):
    """A remote file written as one request when closed, within the storage's bounds (and
    not at all when its ``with`` block fails)."""

    def __init__(self, storage: Storage, path: str) -> None:
        super().__init__()
        self._storage = storage
        self._path = path

    def __exit__(self, kind: Any, *rest: Any) -> None:
        if kind is not None:
            super().close()
            return
        self.close()

    def close(self) -> None:
        if not self.closed:
            data = self.getvalue()
            super().close()  # closed even if the write fails: the caller's error is the write's
            self._storage._call(f"PUT {self._path}", self._storage.fs.pipe_file, self._path, data)


def _named_parameters(function: Any) -> list[str]:
    """The parameters of ``function`` that can be given by name (not ``self``, ``*args``)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    parameters = inspect.signature(function).parameters.values()
    return [p.name for p in parameters if p.kind in kinds and p.name != "self"]


def _in_chain(exc: BaseException, types: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first of ``exc`` and its causes that is one of ``types`` (s3fs wraps the client's)."""
    seen: BaseException | None = exc
    for _ in range(16):
        if seen is None or isinstance(seen, types):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _first(exc: BaseException) -> str:
    """An exception's message on one line."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _protocols(fs_class: type) -> tuple[str, ...]:
    protocol = getattr(fs_class, "protocol", ())
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


_URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def resolve_path(value: str) -> str:
    """A URL with a scheme stays as it is; a plain path becomes absolute (from the cwd)."""
    if _URL_SCHEME.match(value):
        return value
    return os.path.abspath(os.path.expanduser(value))
