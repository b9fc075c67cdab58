"""Spark's file-sink log of each port, so that Spark's readers see whole windows only.

``spark.read.parquet`` reads a folder holding ``_spark_metadata/`` through that log alone:
entry ``n`` lists the files of the port's ``n``-th window, and every tenth is a compaction
repeating all files before it. Each entry is a conditional create whose bytes follow from the
window's publication record alone, so a redone publication writes the same entry once; a
compaction is built from the previous one (checked: damage is refused, not copied forward).
"""

from __future__ import annotations

import json
import zlib
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from dedupsink.errors import StoreCorruptError
from dedupsink.runtime import RUNTIME
from dedupsink.store.records import LogEntry, Publication

if TYPE_CHECKING:
    from dedupsink.ports.output import Output

SPARK_LOG_DIR = "_spark_metadata"
COMPACT_INTERVAL = 10
_BLOCK_SIZE = 128 * 1024 * 1024
_URI_PATH_SAFE = "/:@&=+$,;!*'()"  # what a URI path may hold unescaped, besides [A-Za-z0-9_.~-]
# Per port log directory, the last compaction entry this process wrote or parsed whole, with
# the CRC-32 of its bytes. The next compaction repeats every line of that one, and parsing them
# again cost most of the entry's time, growing with every file the port ever logs (bench/
# RESULTS.md, "Figures formerly in code comments"): bytes that are still those are split, not
# parsed. Bytes that differ are parsed, so damage is still refused, naming the line.
_checked_compactions: dict[str, tuple[str, int]] = RUNTIME.cache(
    "ports.sparklog_checked_compactions", dict
)


def is_compaction(log_id: int) -> bool:
    return (log_id + 1) % COMPACT_INTERVAL == 0


def entry_name(log_id: int) -> str:
    return f"{log_id}.compact" if is_compaction(log_id) else str(log_id)


def log_url(url: str) -> str:
    """A file URL as Spark's sink log must hold it: a URI whose path is percent-encoded.

    Spark reads each entry with ``new Path(new URI(path))``, so a space, ``%`` or ``#`` in the
    output path must be escaped as Hadoop's ``Path.toUri`` does, or the port cannot be read.
    """
    scheme, separator, rest = url.partition("://")
    if not separator:
        return quote(url, safe=_URI_PATH_SAFE)
    authority, slash, path = rest.partition("/")
    return f"{scheme}://{authority}{slash}{quote(path, safe=_URI_PATH_SAFE)}"


def status_line(url: str, size: int, modified_ms: int) -> str:
    status = {
        "path": log_url(url),
        "size": size,
        "isDir": False,
        "modificationTime": modified_ms,
        "blockReplication": 1,
        "blockSize": _BLOCK_SIZE,
        "action": "add",
    }
    return json.dumps(status, separators=(",", ":"))


class PortLog:
    """The sink log of one port of an output."""

    def __init__(self, output: Output, port: str) -> None:
        self.output = output
        self.port = port

    def entry_path(self, log_id: int) -> str:
        return self.output.path(f"{self.port}/{SPARK_LOG_DIR}/{entry_name(log_id)}")

    def exists(self, log_id: int) -> bool:
        return self.output.storage.exists(self.entry_path(log_id))

    def ids(self) -> list[int]:
        """The entry ids present, oldest first."""
        names = self.output.storage.entries(self.output.path(f"{self.port}/{SPARK_LOG_DIR}"))
        return sorted(int(n.split(".")[0]) for n in names if n.split(".")[0].isdigit())

    # -- writing -----------------------------------------------------------------------------

    def write(self, entry: LogEntry, publication: Publication) -> None:
        """Write ``entry`` once (a present entry is left as it is)."""
        path = self.entry_path(entry.log_id)
        data = ("v1\n" + "\n".join(self.lines(entry, publication))).encode()
        try:
            self.output.storage.create(path, data)
        except FileExistsError:
            return
        if is_compaction(entry.log_id):
            _remember_checked(path, zlib.crc32(data))

    def lines(self, entry: LogEntry, publication: Publication) -> list[str]:
        own = [
            self._line(target, publication.size_of(target), publication.modified_ms)
            for target in entry.files
        ]
        if not is_compaction(entry.log_id):
            return own
        return self._logged_before(entry) + own

    def _line(self, target: str, size: int | None, modified_ms: int) -> str:
        path = self.output.path(target)
        if size is None:  # a plan from before sizes were recorded
            size = self.output.storage.size(path)
        return status_line(self.output.file_url(target), size, modified_ms)

    def _logged_before(self, entry: LogEntry) -> list[str]:
        """Every file logged before a compaction entry: the previous compaction's lines, then
        the files logged since (recorded by the store, or read from their entries)."""
        previous = entry.log_id - COMPACT_INTERVAL
        lines = self._compaction_lines(previous) if previous >= 0 else []
        if entry.earlier is None:
            for log_id in range(max(previous + 1, 0), entry.log_id):
                lines.extend(line for line, _ in self.read(log_id))
        else:
            lines.extend(self._line(f.target, f.size, f.modified_ms) for f in entry.earlier)
        if entry.logged_before is not None and len(lines) != entry.logged_before:
            raise StoreCorruptError(
                self.entry_path(previous),
                f"Spark's sink log of port {self.port} lists {len(lines)} files before entry "
                f"{entry.log_id}, but {entry.logged_before} were published",
            )
        return lines

    # -- reading -----------------------------------------------------------------------------

    def read(self, log_id: int) -> list[tuple[str, dict[str, Any]]]:
        """The lines of one entry with their file statuses, checked for damage."""
        path = self.entry_path(log_id)
        return parse_entry(_decoded(self._bytes(path), path), path)

    def _compaction_lines(self, log_id: int) -> list[str]:
        """The lines of a compaction entry, checked for damage: parsed, unless its bytes are
        those this process last wrote or parsed for the port (``_checked_compactions``)."""
        path = self.entry_path(log_id)
        data = self._bytes(path)
        crc = zlib.crc32(data)
        if _checked_compactions.get(_log_dir(path)) == (path, crc):
            return _status_lines(data.decode())
        lines = [line for line, _ in parse_entry(_decoded(data, path), path)]
        _remember_checked(path, crc)
        return lines

    def _bytes(self, path: str) -> bytes:
        try:
            return self.output.storage.read(path)
        except FileNotFoundError as exc:
            raise StoreCorruptError(path, "Spark's sink log entry is missing") from exc

    def matches(self, entry: LogEntry, publication: Publication) -> bool:
        """Whether the entry on disk is intact and lists exactly what ``entry`` plans."""
        try:
            present = [line for line, _ in self.read(entry.log_id)]
            expected = self.lines(entry, publication)
        except StoreCorruptError:
            return False
        return present == expected

    def rewrite(self, entry: LogEntry, publication: Publication) -> None:
        """Replace entry ``log_id`` (damaged or missing) with the one its plan gives."""
        self.output.storage.delete([self.entry_path(entry.log_id)])
        self.write(entry, publication)


def _decoded(data: bytes, path: str) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise StoreCorruptError(path, f"Spark's sink log entry is not text: {exc}") from exc


def _log_dir(path: str) -> str:
    return path.rpartition("/")[0]


def _remember_checked(path: str, crc: int) -> None:
    _checked_compactions[_log_dir(path)] = (path, crc)


def _status_lines(text: str) -> list[str]:
    """An entry's file-status lines: those after its ``v1`` header that are not blank."""
    return [line for line in text.split("\n")[1:] if line.strip()]


def parse_entry(text: str, path: str) -> list[tuple[str, dict[str, Any]]]:
    if text.partition("\n")[0] != "v1":
        raise StoreCorruptError(path, "Spark's sink log entry does not start with 'v1'")
    lines = _status_lines(text)
    # One parse of all lines (a compaction holds every file the port ever logged); the
    # line-by-line parse below runs only to name a damaged line.
    try:
        statuses = json.loads("[" + ",".join(lines) + "]")
    except ValueError:
        statuses = None
    if (
        isinstance(statuses, list)
        and len(statuses) == len(lines)
        and all(_is_file_status(status) for status in statuses)
    ):
        return list(zip(lines, statuses, strict=True))
    for number, line in enumerate(text.split("\n")[1:], 2):
        if line.strip() and not _is_file_status(_loads_or_none(line)):
            raise StoreCorruptError(path, f"line {number} is not a file status: {line[:200]!r}")
    raise StoreCorruptError(path, "Spark's sink log entry does not parse line by line")


def _loads_or_none(line: str) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return None


def _is_file_status(status: Any) -> bool:
    return (
        isinstance(status, dict)
        and isinstance(status.get("path"), str)
        and isinstance(status.get("size"), int)
        and status.get("action") == "add"
    )
