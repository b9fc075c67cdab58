"""The CLI's own error: a job config file or a command-line argument is wrong."""

from __future__ import annotations

from dedupsink.errors import DedupError

__all__ = ["ConfigError"]


class ConfigError(DedupError):
    """A config key or a command argument is wrong; the message names the key and where it is."""

    def __init__(self, key: str | None, message: str, where: str | None = None) -> None:
        self.key = key
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)
