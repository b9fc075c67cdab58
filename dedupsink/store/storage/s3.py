"""Amazon S3 and compatible servers through s3fs: one CopyObject, one HEAD, DeleteObjects in
batches whose refusals are errors, a retried 409 on a conditional PUT, and the client's own
failures (credentials, endpoint) said in one line."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterable
from typing import Any

from dedupsink.options import StorageBounds
from dedupsink.store.storage.base import named_parameters
from dedupsink.store.storage.object_store import ObjectStorage, one_line

# s3fs copies objects up to this size with one CopyObject request; larger ones need a
# multipart copy, which fs.cp_file does.
_S3_SINGLE_COPY_LIMIT = 5 * 2**30
_S3_DELETE_BATCH = 1000
_S3_CONFLICT_PAUSES = (0.05, 0.1, 0.2, 0.4, 0.8)  # seconds before each retry of a 409


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
            names.update(named_parameters(init))
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
                what = f"partial credentials from {cause.kwargs.get('provider')}: {one_line(cause)}"
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


def _in_chain(exc: BaseException, types: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first of ``exc`` and its causes that is one of ``types`` (s3fs wraps the client's)."""
    seen: BaseException | None = exc
    for _ in range(16):
        if seen is None or isinstance(seen, types):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
