"""Network faults on the wire: a fault-injecting HTTP/1.1 proxy in front of a store's server.

``tests/servers.py`` fails chosen requests inside moto's server, and ``tests/faultfs.py`` inside
one process's filesystem. ``FaultProxy`` sits between any client (s3fs, adlfs, delta-rs,
pyiceberg, Spark's executors in other processes) and an HTTP server (moto's S3 API, Azurite) on
127.0.0.1, and spoils exchanges the way a network or a busy store does: added latency, replies
held forever, replies cut by a TCP reset or ended early, throttling replies (S3's ``SlowDown``,
Azure's ``ServerBusy``), or a store that stops answering. Faults are drawn per request by a
seeded random generator, and can be switched at any time from any thread::

    with FaultProxy(s3_server.endpoint_url, seed=1) as proxy:
        fs = proxied(s3_server.remote(), proxy).fs()
        proxy.set(reset=0.1, slowdown=0.1)
        ...
        assert proxy.counts()["reset"] > 0

It understands just enough HTTP/1.1 to find each message's end on a keep-alive connection
(Content-Length, chunked, interim ``100 Continue``, bodiless replies), and forwards the bytes
verbatim otherwise. Each client connection has one upstream connection at a time, opened when
a request is forwarded and again after the server closed it (moto closes after every reply):
``Connection`` is a hop-by-hop header, so the client keeps its connection all the same.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import re
import socket
import struct
import threading
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from typing import Any
from urllib.parse import urlsplit

from servers import Remote

FAULTS = ("hold", "reset", "truncate", "slowdown")  # drawn in this order, one at most
KINDS = (*FAULTS, "silent")
_LIMIT = 1 << 20  # the longest message head read
_PIECE = 1 << 16
_INTERIM = (100, 102, 103)  # informational replies: the final one follows on the connection
_CONNECTION = re.compile(rb"(?im)^connection:[^\r\n]*\r\n")
# Errors of a peer that went away or spoke nonsense: the connection is dropped, nothing more.
_GONE = (OSError, EOFError, asyncio.LimitOverrunError, ValueError, IndexError)

# The throttling replies: status, headers and body, as S3 and Azure Blob Storage send them.
_BUSY = {
    "s3": (
        "503 Slow Down",
        "x-amz-request-id: {id}",
        '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code><Message>Please'
        " reduce your request rate.</Message><RequestId>{id}</RequestId><HostId>{host}</HostId>"
        "</Error>",
    ),
    "azure": (
        "503 The server is busy.",
        "x-ms-error-code: ServerBusy\r\nx-ms-request-id: {id}",
        '<?xml version="1.0" encoding="utf-8"?><Error><Code>ServerBusy</Code><Message>The server'
        " is busy.\nRequestId:{id}\nTime:{time}</Message></Error>",
    ),
}

Sink = Callable[[bytes], Awaitable[None]]
Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@dataclasses.dataclass(frozen=True)
class _Faults:
    latency: float = 0.0
    hold: float = 0.0
    reset: float = 0.0
    truncate: float = 0.0
    slowdown: float = 0.0
    silent: bool = False
    match: Callable[[str, str], bool] | None = None


@dataclasses.dataclass(frozen=True)
class _Head:
    """A message's head as received: its bytes, its first line's words and its headers."""

    raw: bytes
    words: list[str]
    headers: dict[str, str]  # lower-case names; a repeated header's values joined by ","

    def has(self, name: str, token: str) -> bool:
        return token in (t.strip().lower() for t in self.headers.get(name, "").split(","))


async def _read_head(reader: asyncio.StreamReader) -> _Head | None:
    """The next message's head, or None when the peer closed between messages."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as error:
        if error.partial.strip():
            raise
        return None
    lines = raw.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if colon:
            key, value = name.strip().lower(), value.strip()
            headers[key] = f"{headers[key]},{value}" if key in headers else value
    return _Head(raw, lines[0].split(" ", 2), headers)


def _framing(head: _Head, *, reply: bool, bodiless: bool = False) -> int | str:
    """How a body ends: after a length (0: no body), at a last chunk, or at the close."""
    if bodiless:
        return 0
    if head.has("transfer-encoding", "chunked"):
        return "chunked"
    if "content-length" in head.headers:
        return int(head.headers["content-length"])
    return "close" if reply else 0  # a request without either has no body


async def _copy(reader: asyncio.StreamReader, size: int, sink: Sink) -> None:
    while size > 0:
        piece = await reader.read(min(size, _PIECE))
        if not piece:
            raise asyncio.IncompleteReadError(b"", size)
        size -= len(piece)
        await sink(piece)


async def _relay(reader: asyncio.StreamReader, framing: int | str, sink: Sink) -> None:
    """Pass one body to ``sink``, framing and all, reading no further than its end."""
    if framing == "close":
        while piece := await reader.read(_PIECE):
            await sink(piece)
        return
    if isinstance(framing, int):
        await _copy(reader, framing, sink)
        return
    while True:  # chunked: size lines and chunks, then trailers up to an empty line
        line = await reader.readuntil(b"\r\n")
        await sink(line)
        size = int(line.split(b";", 1)[0], 16)
        if size == 0:
            while line != b"\r\n":
                line = await reader.readuntil(b"\r\n")
                await sink(line)
            return
        await _copy(reader, size + 2, sink)


def _into(writer: asyncio.StreamWriter) -> Sink:
    async def write(data: bytes) -> None:
        writer.write(data)
        await writer.drain()

    return write


async def _discard(data: bytes) -> None:
    pass


async def _pump(reader: asyncio.StreamReader, framing: int | str, upstream: Streams) -> bool:
    """Forward a request's body; if the client fails mid-way, drop the upstream connection so
    that the exchange waiting for its reply ends too."""
    try:
        await _relay(reader, framing, _into(upstream[1]))
        return True
    except _GONE:
        upstream[1].transport.abort()
        return False


async def _park(reader: asyncio.StreamReader) -> None:
    """Keep a connection open and silent. What the client still sends is discarded: reading is
    how its close is noticed, which frees the connection before the proxy stops."""
    while await reader.read(_PIECE):
        pass


async def _cut(writer: asyncio.StreamWriter, head: bytes, body: bytes, *, reset: bool) -> None:
    """Send the head and half the body, then reset the connection or close it. Of a reply
    without a body, half the status line only: a whole head would be a whole reply, and some
    parsers (http.client's) take a head cut between two header lines as complete."""
    sent = head + body[: len(body) // 2] if body else head[: head.index(b"\r\n") // 2]
    writer.transport.set_write_buffer_limits(0)  # drain() returns once the kernel has it all
    writer.write(sent)
    await writer.drain()
    if reset:  # SO_LINGER 0: close() sends a RST, not a FIN
        writer.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
        )
        writer.transport.abort()
    else:
        writer.close()


@dataclasses.dataclass
class _Link:
    """A client connection and its upstream connection, opened on the first forwarded request."""

    client: Streams
    upstream: Streams | None = None

    def drop_upstream(self) -> None:
        if self.upstream is not None:
            self.upstream[1].close()
            self.upstream = None

    def close(self, *, at_once: bool = False) -> None:
        """Close both connections: after what is queued is sent, or at once (on stop())."""
        for writer in [self.client[1]] + ([self.upstream[1]] if self.upstream else []):
            if at_once:
                writer.transport.abort()
            else:
                writer.close()


class FaultProxy:
    """An asyncio proxy on 127.0.0.1 (its own event loop in a daemon thread) in front of an HTTP
    server, injecting faults into the exchanges it forwards."""

    def __init__(self, upstream_url: str, *, seed: int = 0, flavor: str = "s3") -> None:
        if flavor not in _BUSY:
            raise ValueError(f"flavor must be 's3' or 'azure', not {flavor!r}")
        address = urlsplit(upstream_url)
        self._upstream = (address.hostname or "127.0.0.1", address.port or 80)
        self.flavor = flavor
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._faults = _Faults()
        self._counts: Counter[str] = Counter()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._port = 0

    # -- control, from any thread ------------------------------------------------------------

    def start(self) -> FaultProxy:
        loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        self._loop = loop
        opening = asyncio.start_server(self._accept, "127.0.0.1", 0, limit=_LIMIT)
        self._server = asyncio.run_coroutine_threadsafe(opening, loop).result(10)
        self._port = int(self._server.sockets[0].getsockname()[1])
        return self

    def stop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        loop.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def set(
        self,
        *,
        latency: float = 0.0,
        hold: float = 0.0,
        reset: float = 0.0,
        truncate: float = 0.0,
        slowdown: float = 0.0,
        silent: bool = False,
        match: Callable[[str, str], bool] | None = None,
    ) -> None:
        """Replace the faults. Each request that ``match(method, target)`` accepts (all when
        None) waits ``latency`` seconds and draws one fault at most: the rates are fractions of
        all requests, checked in the order hold, reset, truncate, slowdown. ``silent`` makes
        every new request go unanswered, unforwarded."""
        if not all(0.0 <= rate <= 1.0 for rate in (hold, reset, truncate, slowdown)):
            raise ValueError("fault rates are fractions between 0 and 1")
        faults = _Faults(latency, hold, reset, truncate, slowdown, silent, match)
        with self._lock:
            self._faults = faults

    def clear(self) -> None:
        self.set()

    def counts(self) -> dict[str, int]:
        """Requests seen and faults injected, by kind, since the start or reset_counts()."""
        with self._lock:
            return {kind: self._counts[kind] for kind in ("requests", *KINDS)}

    def reset_counts(self) -> None:
        with self._lock:
            self._counts.clear()

    def _draw(self, method: str, target: str) -> tuple[float, str | None]:
        """Count a request; its latency and its fault, if any."""
        with self._lock:
            self._counts["requests"] += 1
            faults = self._faults
        if faults.match is not None and not faults.match(method, target):  # not under the lock
            return 0.0, None
        with self._lock:
            fault = "silent" if faults.silent else None
            draw, edge = self._random.random(), 0.0
            for kind in FAULTS:
                edge += getattr(faults, kind)
                if fault is None and draw < edge:
                    fault = kind
            if fault is not None:
                self._counts[fault] += 1
            return faults.latency, fault

    # -- the event loop's side -----------------------------------------------------------------

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Our own task rather than start_server's: it is cancelled on stop() and waited for.
        task = asyncio.get_running_loop().create_task(self._serve(_Link((reader, writer))))
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            loop = task.get_loop()
            loop.call_exception_handler({"message": "fault proxy failed", "exception": error})

    async def _shutdown(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, link: _Link) -> None:
        # Closing awaits nothing (asyncio.wait_for() of Python 3.11 can swallow a cancellation,
        # and the connection would then live on); stop()'s cancellation aborts at once.
        stopping = False
        try:
            while await self._exchange(link):
                pass
        except _GONE:
            pass  # a peer went away: drop the connection, as a server would
        except asyncio.CancelledError:
            stopping = True
            raise
        finally:
            link.close(at_once=stopping)

    async def _exchange(self, link: _Link) -> bool:
        """One request and its reply; whether the connection carries on."""
        head = await _read_head(link.client[0])
        if head is None:
            return False
        latency, fault = self._draw(head.words[0], head.words[1])
        if fault == "silent":
            await _park(link.client[0])
            return False
        if latency > 0:
            await asyncio.sleep(latency)
        if fault == "slowdown":
            return await self._slow_down(link.client, head)
        return await self._forward(link, head, fault)

    async def _forward(self, link: _Link, head: _Head, fault: str | None) -> bool:
        if link.upstream is not None and link.upstream[0].at_eof():
            link.drop_upstream()  # closed by the server while idle
        if link.upstream is None:
            link.upstream = await asyncio.open_connection(*self._upstream, limit=_LIMIT)
        upstream = link.upstream
        upstream[1].write(head.raw)
        # The body goes on alongside the replies: the client may wait for a "100 Continue".
        pump = asyncio.create_task(_pump(link.client[0], _framing(head, reply=False), upstream))
        try:
            reply, interim = await _read_head(upstream[0]), set()
            while reply is not None and int(reply.words[1]) in _INTERIM:
                # Passed on even when held (the body must follow), but once: werkzeug sends two
                # "100 Continue"s, and aiohttp drops its read timeout on an interim reply that
                # comes after the body (a held reply would then hang it for ever).
                if reply.words[1] not in interim:
                    interim.add(reply.words[1])
                    await _into(link.client[1])(reply.raw)
                reply = await _read_head(upstream[0])
            if reply is None:
                return False  # the server hung up on the request: so does the proxy
            bodiless = head.words[0] == "HEAD" or int(reply.words[1]) in (204, 304)
            framing = _framing(reply, reply=True, bodiless=bodiless)
            if fault == "hold":
                await _relay(upstream[0], framing, _discard)  # the server acted in full
                pump.cancel()
                await asyncio.wait([pump])
                await _park(link.client[0])
                return False
            if fault in ("reset", "truncate"):
                body = bytearray()

                async def keep(data: bytes) -> None:
                    body.extend(data)

                await _relay(upstream[0], framing, keep)
                await _cut(link.client[1], reply.raw, bytes(body), reset=fault == "reset")
                return False
            # Connection is a hop-by-hop header: a server closing after each reply (moto does)
            # gets a new connection for the next request, the client keeps its own.
            carry_on = framing != "close" and not head.has("connection", "close")
            await _into(link.client[1])(_CONNECTION.sub(b"", reply.raw) if carry_on else reply.raw)
            await _relay(upstream[0], framing, _into(link.client[1]))
            if reply.has("connection", "close"):
                link.drop_upstream()
            # A reply that came before the whole request body leaves the connection unusable.
            return carry_on and pump.done() and pump.result()
        finally:
            pump.cancel()
            await asyncio.wait([pump])

    async def _slow_down(self, client: Streams, head: _Head) -> bool:
        """Answer a throttling reply without forwarding. A client that waits for a "100
        Continue" sends no body after it (or might yet): that connection is closed."""
        waits = head.has("expect", "100-continue")
        if not waits:
            await _relay(client[0], _framing(head, reply=False), _discard)
        keep = not waits and not head.has("connection", "close")
        await _into(client[1])(self._busy(bodiless=head.words[0] == "HEAD", keep=keep))
        return keep

    def _busy(self, *, bodiless: bool, keep: bool) -> bytes:
        status, headers, body = _BUSY[self.flavor]
        ids = {"id": uuid.uuid4().hex.upper()[:16], "host": uuid.uuid4().hex}
        data = body.format(**ids, time=formatdate(usegmt=True)).encode()
        head = (
            f"HTTP/1.1 {status}\r\n{headers.format(**ids)}\r\nContent-Type: application/xml\r\n"
            f"Content-Length: {len(data)}\r\nDate: {formatdate(usegmt=True)}\r\n"
            f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n"
        )
        return head.encode() + (b"" if bodiless else data)


def proxied(remote: Remote, proxy: FaultProxy) -> Remote:
    """``remote`` reached through ``proxy``: its S3 ``endpoint_url``, or the ``BlobEndpoint`` of
    its Azure connection string, pointed at the proxy."""
    options: dict[str, Any] = dict(remote.storage_options)
    if "endpoint_url" in options:
        options["endpoint_url"] = proxy.endpoint_url
    if "connection_string" in options:
        options["connection_string"] = re.sub(
            r"BlobEndpoint=https?://[^/;]+",
            lambda _: f"BlobEndpoint={proxy.endpoint_url}",
            options["connection_string"],
        )
    return Remote(remote.url, options)
