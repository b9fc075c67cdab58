"""Domain exceptions of dedupsink: every error the product raises on purpose is one of these."""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DedupError",
    "DedupOptionError",
    "PortTableError",
    "PySparkVersionError",
    "StoreConflictError",
    "StoreCorruptError",
    "StoreError",
    "StoreOwnershipError",
    "StoreSettingsError",
    "StoreUnavailableError",
]


class DedupError(Exception):
    """Base class of all dedupsink errors."""


class DedupOptionError(DedupError, ValueError):
    """An option has a bad value; the message names the option, the value and what is accepted.
    A value of None is an option not given, which the message calls missing."""

    def __init__(self, option: str, value: object, accepted: str) -> None:
        self.option = option
        self.value = value
        self.accepted = accepted
        given = " is missing" if value is None else f"={value!r} is invalid"
        super().__init__(f"option {option}{given}: expected {accepted}")


class StoreError(DedupError):
    """The bucket store cannot be read or written."""


class StoreCorruptError(StoreError):
    """A store or port file fails its checksum or cannot be decoded; the message names the file."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        super().__init__(
            f"corrupt file {path}: {problem}. The store refuses to read it as 'no keys'; "
            "see 'Recovery' in docs/RELIABILITY.md"
        )


class StoreUnavailableError(StoreError, TimeoutError):
    """The store did not answer an operation within its budget (``storageTimeout``), retries
    included; the message names the store, the operation and the time waited. Nothing is half
    done: the batch re-runs, or the query restarts, from the last committed window."""


class StoreSettingsError(DedupOptionError):
    """The options disagree with the settings an existing store was created with."""


class StoreOwnershipError(StoreError):
    """Another live query owns the store."""


class StoreConflictError(StoreError):
    """The store changed under a commit (a concurrent writer); the batch must be re-run."""


class PortTableError(DedupError):
    """A port table (Delta Lake or Iceberg) cannot be reached, created, matched or committed."""


class ConfigError(DedupError):
    """A job config key, a command argument or a question asked of a store is wrong; the message
    names the key and where it is."""

    def __init__(self, key: str | None, message: str, where: str | None = None) -> None:
        self.key = key
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class PySparkVersionError(DedupError, ImportError):
    """The installed PySpark is older than the sink needs; the message names the version found
    and the version needed. Raised on importing the data source, and so by ``format("dedup")``.
    """

    def __init__(self, found: str, needed: str, because: str) -> None:
        self.found = found
        self.needed = needed
        super().__init__(
            f"dedupsink needs PySpark {needed} or newer ({because}); found PySpark {found}"
        )
