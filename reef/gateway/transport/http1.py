"""A small HTTP/1.1 client for the one server the gateway proxies to: a pool of keep-alive
connections, one request at a time on each, responses parsed in C by httptools (uvicorn's parser).

Why not aiohttp: its per-request Python (request and response objects, header multidicts, timer
handles, a task that writes the body) cost ~0.6 ms of CPU per chat call here, a quarter of the
gateway's whole cost per JSON request. Here a request is one write, and a response is a status, a
few framing headers and the body: nothing else is read. Plain `http` and `https` (asyncio's TLS).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools

_HIGH_WATER = 1 << 20  # a stream's unread bytes above which the socket stops being read


class ConnectionDropped(ConnectionError):
    """The connection closed, or sent something that is not HTTP, before the response was complete."""


class ConnectFailed(ConnectionError):
    """No connection could be opened: the request never left, so another server may take it."""


class Connection(asyncio.Protocol):
    """One keep-alive connection; the parser's callbacks fill in the current response."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._loop = asyncio.get_running_loop()
        self.closed = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.complete = False
        self.keep_alive = False
        self.received = False  # any byte of this response
        self._framed = False  # content-length or chunked: else the body ends when the connection does
        self._body: list[bytes] = []
        self._buffered = 0
        self._error: BaseException | None = None
        self._headers_in: asyncio.Future[None] = self._loop.create_future()
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionDropped(f"malformed HTTP response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.status and not self._framed and not self.complete:
            self.on_message_complete()  # a body delimited by the end of the connection
        else:
            self._fail(ConnectionDropped("the server closed the connection"))

    # --- httptools callbacks -------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        if not self._headers_in.done():
            self._headers_in.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self._parser.should_keep_alive()
        if self._timer is not None:
            self._timer.cancel()
        self._wake()

    # --- used by the pool ----------------------------------------------------------------------

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self.complete or self._error is not None:
            return
        self._error = exc
        if not self._headers_in.done():
            self._headers_in.set_exception(exc)
            self._headers_in.exception()  # retrieved: a caller that stopped waiting logs nothing
        self._wake()
        self.abort()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def send(self, data: bytes, timeout_s: float) -> None:
        self._reset()
        self._timer = self._loop.call_later(timeout_s, self._fail, TimeoutError("the response took too long"))
        assert self.transport is not None
        self.transport.write(data)

    async def headers(self) -> None:
        await self._headers_in

    async def read(self) -> bytes:
        """The whole body."""
        while not self.complete:
            await self._wait()
        return b"".join(self._body)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives: everything received since the last step, joined."""
        body = self._body
        while True:
            if body:
                data = body[0] if len(body) == 1 else b"".join(body)
                body.clear()
                if self._buffered > _HIGH_WATER and self.transport is not None and not self.closed:
                    self.transport.resume_reading()
                self._buffered = 0
                yield data
            elif self.complete:
                return
            else:
                # `_wait`, inline: once per event of a stream.
                if self._error is not None:
                    raise self._error
                waiter = self._waiter = self._loop.create_future()
                try:
                    await waiter
                finally:
                    self._waiter = None
                if self._error is not None and not body:
                    raise self._error

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
        if self._error is not None and not self._body:
            raise self._error

    def done(self) -> None:
        """The response was read or given up: either way no timer may fire on a later request."""
        if self._timer is not None:
            self._timer.cancel()


class ConnectionPool:
    def __init__(self, base_url: str, headers: dict[str, str], timeout_s: float, connect_timeout_s: float = 10.0,
                 keepalive_s: float = 3.0):
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self._host = url.hostname
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if url.scheme == "https" else None
        self._prefix = url.path.rstrip("/")
        fixed = {"Host": url.netloc.rpartition("@")[2], **headers}
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in fixed.items()).encode("latin-1")
        self.timeout_s, self._connect_timeout_s, self._keepalive_s = timeout_s, connect_timeout_s, keepalive_s
        self._idle: list[Connection] = []

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            transport, conn = await asyncio.wait_for(
                loop.create_connection(Connection, self._host, self._port, ssl=self._ssl,
                                       server_hostname=self._host if self._ssl else None),
                self._connect_timeout_s)
        except (OSError, TimeoutError) as exc:
            raise ConnectFailed(f"cannot connect to {self._host}:{self._port}: {exc or type(exc).__name__}") from exc
        conn.transport = transport  # uvloop may return before calling connection_made
        return conn

    def _pooled(self) -> Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            # Shorter than uvicorn's 5 s keep-alive (vLLM's server): a connection the server is
            # closing for idleness would fail the request sent on it.
            if not conn.closed and now - conn.idle_since < self._keepalive_s:
                return conn
            conn.abort()
        return None

    async def request(self, method: str, path: str, body: bytes | None = None,
                      timeout_s: float | None = None) -> Connection:
        """Send a request; returns the connection once the response's headers are in. The caller
        reads the body from it, then must hand it back with `release` (also on failure)."""
        head = b"%s %s HTTP/1.1\r\n%s" % (method.encode(), (self._prefix + path).encode(), self._fixed)
        if body is not None:
            head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        data = head + b"\r\n" + (body or b"")
        timeout_s = timeout_s or self.timeout_s
        conn = self._pooled()
        if conn is not None:
            try:
                return await self._exchange(conn, data, timeout_s)
            except ConnectionDropped:
                # Closed by the server as we reused it, before answering anything: the request was
                # never read, so sending it again cannot run it twice.
                if conn.received:
                    raise
        return await self._exchange(await self._connect(), data, timeout_s)

    async def _exchange(self, conn: Connection, data: bytes, timeout_s: float) -> Connection:
        conn.send(data, timeout_s)
        try:
            await conn.headers()
        except BaseException:
            self.release(conn)
            raise
        return conn

    def release(self, conn: Connection) -> None:
        conn.done()
        if conn.complete and conn.keep_alive and not conn.closed:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.abort()

    def close(self) -> None:
        for conn in self._idle:
            conn.abort()
        self._idle.clear()
