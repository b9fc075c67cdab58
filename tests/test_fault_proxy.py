"""The fault proxy (tests/faultproxy.py) in front of moto's S3 server: each fault as a plain
HTTP client and s3fs see it, and what the server did meanwhile.

s3fs is built so that nothing retries behind the test's back: one attempt per request in
botocore, and in s3fs's own loop. What s3fs raises for each fault is asserted too, since the
store's retry logic has to tell them apart.
"""

from __future__ import annotations

import errno
import http.client
import logging
import os
import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    ReadTimeoutError,
)
from faultproxy import FaultProxy, proxied
from servers import Remote, S3Server

# moto answers an anonymous GET with a 403 (a private bucket) but checks no signature.
AUTH = {
    "Authorization": "AWS4-HMAC-SHA256 Credential=test-key/20260101/us-east-1/s3/aws4_request, "
    "SignedHeaders=host, Signature=0"
}
SIGNED = f"Authorization: {AUTH['Authorization']}"
BIG = os.urandom(1 << 20)


@pytest.fixture
def proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(s3_server.endpoint_url, seed=7) as proxy:
        yield proxy


@pytest.fixture
def place(s3_server: S3Server) -> Remote:
    """A fresh prefix, reached directly (without the proxy)."""
    return s3_server.remote("proxy")


class Clients:
    """A test's clients through proxies: plain HTTP connections and s3fs, closed after it."""

    def __init__(self) -> None:
        self._closers: list[Callable[[], None]] = []

    def http(self, proxy: FaultProxy, timeout: float = 2.0) -> http.client.HTTPConnection:
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=timeout)
        self._closers.append(conn.close)
        return conn

    def s3fs(self, place: Remote, proxy: FaultProxy) -> Any:
        """s3fs with one attempt per call (in botocore and in s3fs) and one-second timeouts."""
        options = {
            **proxied(place, proxy).storage_options,
            "config_kwargs": {
                "read_timeout": 1,
                "connect_timeout": 1,
                "retries": {"total_max_attempts": 1},
            },
            "skip_instance_cache": True,  # a later test's proxy may get this one's port
        }
        fs = Remote(place.url, options).fs()
        fs.retries = 1  # s3fs's own retry loop: a class attribute, not a constructor option
        self._closers.append(lambda: fs.close_session(fs.loop, fs._s3creator))
        return fs

    def close(self) -> None:
        for close in self._closers:
            close()


@pytest.fixture
def clients() -> Iterator[Clients]:
    opened = Clients()
    yield opened
    opened.close()


def send(
    conn: http.client.HTTPConnection, method: str, path: str, body: Any = None
) -> http.client.HTTPResponse:
    conn.request(method, path, body=body, headers=AUTH)
    return conn.getresponse()


def target(place: Remote, name: str) -> str:
    return f"/{place.url.removeprefix('s3://')}/{name}"


def stored(place: Remote, name: str) -> bytes | None:
    """The object as the server holds it, read directly; None when absent."""
    fs = place.fs()
    path = f"{place.url}/{name}"
    return fs.cat(path) if fs.exists(path) else None


def eventually(check: Callable[[], bool], within: float = 3.0) -> bool:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def receive(sock: socket.socket, until: bytes | None = None) -> bytes:
    """What comes on a raw connection until ``until`` does (or until it closes)."""
    data = b""
    while until is None or until not in data:
        piece = sock.recv(65536)
        if not piece:
            break
        data += piece
    return data


def test_no_faults_round_trip_on_one_connection(
    clients: Clients, proxy: FaultProxy, place: Remote
) -> None:
    conn = clients.http(proxy)
    objects = {"small": b"x", "medium": os.urandom(5000), "big": BIG}
    for name, data in objects.items():
        assert send(conn, "PUT", target(place, name), data).read() == b""
        sock = conn.sock
        response = send(conn, "GET", target(place, name))
        assert (response.status, response.read()) == (200, data)
        head = send(conn, "HEAD", target(place, name))  # a Content-Length and no body
        assert (head.status, head.read()) == (200, b"")
        assert conn.sock is sock  # moto closes after each reply: the proxy keeps the client's
    chunked = send(conn, "PUT", target(place, "chunked"), iter([b"ab", b"cd", b"ef"]))
    assert chunked.status == 200
    chunked.read()
    assert stored(place, "chunked") == b"abcdef"
    for name, data in objects.items():
        assert stored(place, name) == data

    fs = clients.s3fs(place, proxy)
    fs.pipe(f"{place.url}/through-s3fs", BIG)
    assert fs.cat(f"{place.url}/through-s3fs") == BIG
    assert stored(place, "through-s3fs") == BIG
    counts = proxy.counts()
    assert counts["requests"] >= 11
    assert sum(counts.values()) == counts["requests"]  # no fault


def test_expect_continue_passes_the_interim_reply(proxy: FaultProxy, place: Remote) -> None:
    """aiobotocore sends every PUT with a body this way."""
    head = (
        f"PUT {target(place, 'continued')} HTTP/1.1\r\nHost: x\r\n"
        f"{SIGNED}\r\n"
        "Content-Length: 5\r\nExpect: 100-continue\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=2) as sock:
        sock.sendall(head)
        assert receive(sock, b"\r\n\r\n").startswith(b"HTTP/1.1 100 Continue\r\n")
        sock.sendall(b"hello")
        assert b"HTTP/1.1 200 OK\r\n" in receive(sock, b"200 OK")
    assert stored(place, "continued") == b"hello"

    # Throttled before the body is sent: the client may or may not send it, so the proxy closes.
    proxy.set(slowdown=1.0)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=2) as sock:
        sock.sendall(head.replace(b"continued", b"throttled"))
        reply = receive(sock)
    assert reply.startswith(b"HTTP/1.1 503 Slow Down\r\n")
    assert b"\r\nConnection: close\r\n" in reply and reply.endswith(b"</Error>")
    assert stored(place, "throttled") is None


def test_latency_delays_each_request(clients: Clients, proxy: FaultProxy, place: Remote) -> None:
    place.fs().pipe(f"{place.url}/a", b"a")
    conn = clients.http(proxy)
    proxy.set(latency=0.4)
    started = time.monotonic()
    assert send(conn, "GET", target(place, "a")).read() == b"a"
    assert time.monotonic() - started >= 0.4
    proxy.clear()
    started = time.monotonic()
    assert send(conn, "GET", target(place, "a")).read() == b"a"
    assert time.monotonic() - started < 0.4


def test_hold_acts_but_never_answers(clients: Clients, proxy: FaultProxy, place: Remote) -> None:
    proxy.set(hold=1.0)
    conn = clients.http(proxy, timeout=0.5)
    with pytest.raises(TimeoutError):
        send(conn, "PUT", target(place, "held"), b"held")
    assert eventually(lambda: stored(place, "held") == b"held")

    fs = clients.s3fs(place, proxy)
    with pytest.raises(ReadTimeoutError):
        fs.pipe(f"{place.url}/held-s3fs", b"held")
    assert eventually(lambda: stored(place, "held-s3fs") == b"held")
    assert proxy.counts()["hold"] == 2

    # stop() releases the held connections: the client sees the close.
    waiting = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
    waiting.sendall(f"GET {target(place, 'held')} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert eventually(lambda: proxy.counts()["hold"] == 3)
    proxy.stop()
    assert waiting.recv(100) == b""
    waiting.close()


@pytest.mark.parametrize("kind", ["reset", "truncate"])
def test_cut_replies_after_the_server_acted(
    clients: Clients, proxy: FaultProxy, place: Remote, kind: str
) -> None:
    place.fs().pipe(f"{place.url}/big", BIG)
    faults: dict[str, Any] = {kind: 1.0}
    proxy.set(**faults)
    errors = (ConnectionError, http.client.HTTPException)  # IncompleteRead, BadStatusLine
    response = send(clients.http(proxy), "GET", target(place, "big"))
    assert (response.status, response.getheader("Content-Length")) == (200, str(len(BIG)))
    with pytest.raises(ConnectionResetError if kind == "reset" else http.client.IncompleteRead):
        response.read()
    with pytest.raises(errors):  # a reply without a body is cut in its status line
        send(clients.http(proxy), "PUT", target(place, f"{kind}-put"), b"put").read()
    assert stored(place, f"{kind}-put") == b"put"

    fs = clients.s3fs(place, proxy)
    # botocore calls a reset "Could not connect", though the server got the request and acted.
    expected = EndpointConnectionError if kind == "reset" else ConnectionClosedError
    with pytest.raises(expected):
        fs.pipe(f"{place.url}/{kind}-s3fs", b"s3fs")
    assert stored(place, f"{kind}-s3fs") == b"s3fs"
    with pytest.raises(expected):
        fs.cat(f"{place.url}/big")  # its HEAD fails first
    # aiohttp sends a PUT, GET or HEAD once more after a reset or an early close, whatever
    # botocore's and s3fs's retry settings: each s3fs call made two requests.
    assert proxy.counts()[kind] == 2 + 2 * 2


def test_a_lost_reply_to_a_create_comes_back_as_exists(
    clients: Clients, proxy: FaultProxy, place: Remote
) -> None:
    """aiohttp's own resend of a conditional create whose reply was lost finds the object the
    first attempt made: s3fs reports FileExistsError for a create that succeeded."""
    puts = 0

    def first_put(method: str, path: str) -> bool:
        nonlocal puts
        puts += method == "PUT"
        return method == "PUT" and puts == 1

    proxy.set(reset=1.0, match=first_put)
    with pytest.raises(FileExistsError):
        clients.s3fs(place, proxy).pipe_file(f"{place.url}/created", b"mine", mode="create")
    assert stored(place, "created") == b"mine"
    assert proxy.counts()["requests"] == 2 and proxy.counts()["reset"] == 1


def test_slowdown_answers_without_forwarding(
    clients: Clients, proxy: FaultProxy, place: Remote
) -> None:
    proxy.set(slowdown=1.0)
    conn = clients.http(proxy)
    response = send(conn, "PUT", target(place, "slow"), b"slow")
    assert (response.status, response.reason) == (503, "Slow Down")
    assert b"<Code>SlowDown</Code><Message>Please reduce your request rate.</Message>" in (
        response.read()
    )
    sock = conn.sock
    head = send(conn, "HEAD", target(place, "slow"))
    assert (head.status, head.read()) == (503, b"")
    proxy.clear()
    assert send(conn, "PUT", target(place, "fast"), b"fast").status == 200
    assert conn.sock is sock  # the throttling replies kept the connection alive
    assert stored(place, "slow") is None

    proxy.set(slowdown=1.0)
    fs = clients.s3fs(place, proxy)
    with pytest.raises(OSError) as raised:
        fs.pipe(f"{place.url}/slow-s3fs", b"slow")
    assert raised.value.errno == errno.EBUSY  # s3fs's translation of a 503
    assert isinstance(raised.value.__cause__, ClientError)
    assert raised.value.__cause__.response["Error"]["Code"] == "SlowDown"
    assert stored(place, "slow-s3fs") is None
    assert proxy.counts()["slowdown"] == 3


def test_azure_flavor_is_busy(clients: Clients, s3_server: S3Server, place: Remote) -> None:
    with FaultProxy(s3_server.endpoint_url, flavor="azure") as proxy:
        proxy.set(slowdown=1.0)
        response = send(clients.http(proxy), "GET", target(place, "any"))
        assert (response.status, response.reason) == (503, "The server is busy.")
        assert response.getheader("x-ms-error-code") == "ServerBusy"
        assert b"<Error><Code>ServerBusy</Code><Message>" in response.read()


def test_silent_store_accepts_but_never_answers(
    clients: Clients, proxy: FaultProxy, place: Remote
) -> None:
    place.fs().pipe(f"{place.url}/a", b"a")
    before = clients.http(proxy, timeout=0.5)
    assert send(before, "GET", target(place, "a")).read() == b"a"
    proxy.set(silent=True)
    with pytest.raises(TimeoutError):
        send(before, "GET", target(place, "a"))  # on a connection already open
    with pytest.raises(TimeoutError):
        send(clients.http(proxy, timeout=0.5), "GET", target(place, "a"))  # accepted, then nothing
    # Only a GET here: aiohttp waits for a PUT's "100 Continue" with no timeout at all.
    with pytest.raises(ReadTimeoutError):
        clients.s3fs(place, proxy).cat(f"{place.url}/a")
    proxy.clear()
    assert send(clients.http(proxy), "GET", target(place, "a")).read() == b"a"
    assert proxy.counts()["silent"] == 3


def test_rates_are_seeded_fractions(clients: Clients, s3_server: S3Server, place: Remote) -> None:
    place.fs().pipe(f"{place.url}/a", b"a")
    patterns = []
    for _ in range(2):
        with FaultProxy(s3_server.endpoint_url, seed=3) as proxy:
            proxy.set(slowdown=0.2)
            conn = clients.http(proxy)
            statuses = []
            for _ in range(200):
                response = send(conn, "HEAD", target(place, "a"))
                response.read()
                statuses.append(response.status)
            counts = proxy.counts()
        assert set(statuses) == {200, 503}
        assert counts["requests"] == 200
        assert counts["slowdown"] == statuses.count(503)
        assert 20 <= counts["slowdown"] <= 60
        patterns.append(statuses)
    assert patterns[0] == patterns[1]  # the same seed, the same faults


def test_match_restricts_faults(clients: Clients, proxy: FaultProxy, place: Remote) -> None:
    place.fs().pipe(f"{place.url}/a", b"a")
    proxy.set(latency=0.3, slowdown=1.0, match=lambda method, path: method == "PUT")
    conn = clients.http(proxy)
    started = time.monotonic()
    assert send(conn, "GET", target(place, "a")).read() == b"a"
    assert time.monotonic() - started < 0.3
    started = time.monotonic()
    response = send(conn, "PUT", target(place, "b"), b"b")
    assert response.status == 503
    response.read()
    assert time.monotonic() - started >= 0.3
    assert proxy.counts() == {
        "requests": 2,
        "hold": 0,
        "reset": 0,
        "truncate": 0,
        "slowdown": 1,
        "silent": 0,
    }
    proxy.reset_counts()
    assert proxy.counts()["requests"] == 0


def test_clients_that_go_away(
    clients: Clients, proxy: FaultProxy, place: Remote, caplog: pytest.LogCaptureFixture
) -> None:
    """Clients that leave mid-request, mid-reply or while held, or send nonsense, cost the
    proxy nothing: it goes on serving, and nothing is logged."""
    caplog.set_level(logging.WARNING)
    place.fs().pipe(f"{place.url}/big", BIG)
    get = f"GET {target(place, 'big')} HTTP/1.1\r\nHost: x\r\n{SIGNED}"
    partial_put = f"PUT {target(place, 'partial')} HTTP/1.1\r\nHost: x\r\nContent-Length: 100"
    cases: list[tuple[str, dict[str, Any]]] = [
        (f"{partial_put}\r\n\r\nonly ten b", {}),  # leaves mid-body
        (f"{get}\r\n\r\n", {}),  # leaves mid-reply
        (f"{get}\r\n\r\n", {"hold": 1.0}),
        (f"{get}\r\n\r\n", {"silent": True}),
        ("NONSENSE\r\n\r\n", {}),
    ]
    for request, faults in cases:
        proxy.set(**faults)
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=2) as sock:
            sock.sendall(request.encode())
            time.sleep(0.05)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        proxy.clear()
    assert eventually(lambda: not proxy._tasks)  # every connection's task ended
    assert stored(place, "partial") is None
    assert send(clients.http(proxy), "GET", target(place, "big")).read() == BIG
    time.sleep(0.1)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_proxied_points_s3_and_azure_options_at_the_proxy(proxy: FaultProxy) -> None:
    s3 = Remote("s3://b/p", {"endpoint_url": "http://127.0.0.1:1234", "key": "k"})
    assert proxied(s3, proxy).storage_options == {"endpoint_url": proxy.endpoint_url, "key": "k"}
    blob = "http://127.0.0.1:1234/devstoreaccount1"
    azure = Remote("abfs://c/p", {"connection_string": f"AccountName=a;BlobEndpoint={blob};"})
    rewritten = proxied(azure, proxy).storage_options["connection_string"]
    assert rewritten == f"AccountName=a;BlobEndpoint={proxy.endpoint_url}/devstoreaccount1;"
    assert proxy.endpoint_url == f"http://127.0.0.1:{proxy.port}"
