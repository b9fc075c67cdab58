"""Google Cloud Storage through gcsfs: each request bounded per connect and read."""

from __future__ import annotations

from typing import Any

from dedupsink.options import StorageBounds
from dedupsink.store.storage.object_store import ObjectStorage


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
