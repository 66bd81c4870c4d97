"""The gateway's upstream HTTP/1.1 pool against a raw asyncio server that answers as real servers do:
keep-alive, chunked bodies, bodies ended by closing, idle connections closed under it, stalls and garbage."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from reef.gateway.transport.http1 import ConnectionDropped, ConnectionPool

pytestmark = [pytest.mark.model_free, pytest.mark.any_model]

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    return head + await reader.readexactly(length)


async def _serve(handler: Handler) -> tuple[asyncio.AbstractServer, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/prefix"


def _ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def test_keep_alive_reuse_and_a_connection_closed_while_idle() -> None:
    seen: list[bytes] = []
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        for _ in range(2):  # two requests per connection, then the server closes it (as idle timeouts do)
            seen.append(await _read_request(reader))
            writer.write(_ok(b'{"n": %d}' % len(seen)))
            await writer.drain()
        writer.close()

    async def main() -> None:
        server, url = await _serve(handler)
        pool = ConnectionPool(url, {"Authorization": "Bearer k"}, timeout_s=5)
        bodies = []
        for _ in range(4):
            conn = await pool.request("POST", "/v1/chat/completions", b'{"a": 1}')
            bodies.append((conn.status, await conn.read()))
            pool.release(conn)
            await asyncio.sleep(0.05)  # lets the server's close arrive, as it does between real requests
        pool.close()
        server.close()
        assert bodies == [(200, b'{"n": %d}' % i) for i in range(1, 5)]

    asyncio.run(main())
    assert connections == 2
    assert seen[0].startswith(b"POST /prefix/v1/chat/completions HTTP/1.1\r\n")
    assert b"Authorization: Bearer k\r\n" in seen[0] and b"Content-Length: 8\r\n" in seen[0]
    assert seen[0].endswith(b'\r\n\r\n{"a": 1}')


def test_a_request_on_a_connection_the_server_just_closed_is_sent_again() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(_ok(b"first"))
        await writer.drain()
        await _read_request(reader)
        writer.close()  # as a server closing an idle connection does while the next request is on its way

    async def main() -> list[bytes]:
        server, url = await _serve(handler)
        pool = ConnectionPool(url, {}, timeout_s=5)
        out = []
        for _ in range(2):
            conn = await pool.request("GET", "/")
            out.append(await conn.read())
            pool.release(conn)
        server.close()
        return out

    assert asyncio.run(main()) == [b"first", b"first"]


def test_chunked_stream_and_a_body_ended_by_closing() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while b"/chunked" in await _read_request(reader):  # kept alive after a chunked answer
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for part in (b"data: 1\n\n", b"data: 2\n\n"):
                writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                await writer.drain()
                await asyncio.sleep(0.01)
            writer.write(b"0\r\n\r\n")
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nuntil the end")
        writer.close()

    async def main() -> tuple[list[bytes], bytes]:
        server, url = await _serve(handler)
        pool = ConnectionPool(url, {}, timeout_s=5)
        conn = await pool.request("GET", "/chunked")
        parts = [c async for c in conn.chunks()]
        pool.release(conn)
        conn = await pool.request("GET", "/close")
        rest = await conn.read()
        pool.release(conn)
        pool.close()
        server.close()
        return parts, rest

    parts, rest = asyncio.run(main())
    assert b"".join(parts) == b"data: 1\n\ndata: 2\n\n"
    assert rest == b"until the end"


def test_failures_are_errors_never_hangs() -> None:
    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(5)

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"SMTP ready\r\n\r\n")

    async def main() -> None:
        server, url = await _serve(stall)
        with pytest.raises(TimeoutError):
            await ConnectionPool(url, {}, timeout_s=0.2).request("GET", "/")
        server.close()
        server, url = await _serve(garbage)
        with pytest.raises(ConnectionDropped):
            await ConnectionPool(url, {}, timeout_s=5).request("GET", "/")
        server.close()
        server, url = await _serve(stall)
        server.close()
        await server.wait_closed()
        with pytest.raises(OSError):  # refused
            await ConnectionPool(url, {}, timeout_s=5).request("GET", "/")

    asyncio.run(main())
