"""The interface every storage family implements, and what the families share: choosing the
family of a URL, checking storage options, calls bounded by ``Attempts``, independent calls
made ``together``, reads, listings and whole-file writes through fsspec.

A family overrides only what its filesystem does differently (the conditional create and the
publication above all). Each operation's contract and how each family meets it:
docs/RELIABILITY.md, "What the store needs from a filesystem". Every path is a name, never a
pattern (fsspec's ``rm``, ``copy`` and ``mv`` would expand globs).
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import io
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any, ClassVar, TypeVar

import fsspec

from dedupsink.errors import DedupOptionError, StoreError, StoreUnavailableError
from dedupsink.masking import MASK, mask_values, storage_secrets
from dedupsink.options import STORAGE_OPTION_PREFIX, StorageBounds
from dedupsink.store.retry import Attempts
from dedupsink.store.storage.paths import basename, join, parent

T = TypeVar("T")
U = TypeVar("U")
SUPPORTED = (
    "a local path, file://, memory://, hdfs://, viewfs://, s3://, s3a://, gs://, abfs:// or az://"
)
# What fsspec reads as a glob pattern in a path given to rm, copy or mv.
_GLOB_CHARS = re.compile(r"[*?[]")
_TOGETHER = 8  # the most requests ``Storage.together`` has in flight


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
                names.update(named_parameters(init))
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
        self.gather(calls)

    def gather(self, calls: Iterable[Callable[[], T]]) -> list[T]:
        """``together``, returning each call's result in the calls' order."""
        pending = list(calls)
        if not self.remote or len(pending) < 2:
            return [call() for call in pending]
        with ThreadPoolExecutor(min(len(pending), _TOGETHER)) as pool:
            futures = [pool.submit(call) for call in pending]
        return [future.result() for future in futures]

    def both(self, first: Callable[[], T], second: Callable[[], U]) -> tuple[T, U]:
        """``gather`` of two calls of different types."""
        one, other = self.gather([first, second])
        return one, other  # type: ignore[return-value]

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


def named_parameters(function: Any) -> list[str]:
    """The parameters of ``function`` that can be given by name (not ``self``, ``*args``)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    parameters = inspect.signature(function).parameters.values()
    return [p.name for p in parameters if p.kind in kinds and p.name != "self"]


def _protocols(fs_class: type) -> tuple[str, ...]:
    protocol = getattr(fs_class, "protocol", ())
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)
