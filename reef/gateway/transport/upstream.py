"""The client of the OpenAI-compatible server Reef records in front of (usually vLLM).

Over `reef.gateway.transport.http1`'s keep-alive pool: on the JSON hot path aiohttp's per-request work cost
a quarter of the gateway's CPU, and on the streaming one (an SSE event per token) httpx's per-chunk
overhead a large share of a core.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from reef.gateway.transport.http1 import ConnectFailed, Connection, ConnectionPool
from reef.gateway.wire.errors import ReefError

_CHAT = "/v1/chat/completions"


class UpstreamError(Exception):
    """The upstream answered with an error status; its body goes back to the client as it is."""

    def __init__(self, status: int, body: bytes):
        super().__init__(f"upstream answered {status}")
        self.status, self.body = status, body


class EngineUnavailable(ReefError):
    """503: the server could not be reached, dropped the connection or timed out. `sent`: the request
    may have reached it (else another replica can take it); `timed_out`: it ran out its time."""

    def __init__(self, exc: BaseException) -> None:
        self.sent = not isinstance(exc, ConnectFailed)
        self.timed_out = self.sent and isinstance(exc, TimeoutError)
        # A plain reason, not an exception repr: clients show this message to people.
        reason = "it timed out" if self.timed_out else "it refused or dropped the connection"
        super().__init__(503, f"the model server is unavailable ({reason}); retry shortly", code="engine_unavailable",
                         headers={"Retry-After": "5"})


def _unavailable(exc: BaseException) -> ReefError:
    return EngineUnavailable(exc)


_FAILED = (OSError, TimeoutError)  # refused, reset, dropped (ConnectionDropped), TLS errors; timed out


class Upstream:
    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 600.0):
        self.base_url = base_url.rstrip("/")
        self._pool = ConnectionPool(self.base_url, {"Authorization": f"Bearer {api_key}"} if api_key else {},
                                    timeout_s)
        # Whether the server returns token ids (vLLM's `return_token_ids`); see probe_token_ids.
        self.token_ids = True

    async def aclose(self) -> None:
        self._pool.close()

    async def _open(self, method: str, path: str, body: bytes | None = None,
                    timeout_s: float | None = None) -> Connection:
        """Send a request; the connection, once the response's headers are in."""
        try:
            return await self._pool.request(method, path, body, timeout_s)
        except _FAILED as exc:
            raise _unavailable(exc) from exc

    async def _read(self, conn: Connection) -> bytes:
        try:
            return await conn.read()
        except _FAILED as exc:
            raise _unavailable(exc) from exc
        finally:
            self._pool.release(conn)

    async def _request(self, method: str, path: str, body: bytes | None = None,
                       timeout_s: float | None = None) -> tuple[int, bytes]:
        conn = await self._open(method, path, body, timeout_s)
        return conn.status, await self._read(conn)

    async def chat(self, body: dict[str, Any]) -> bytes:
        """The response body, unparsed (`reef.gateway.wire.completion` reads it)."""
        status, content = await self._request("POST", _CHAT, orjson.dumps(body))
        if status >= 400:
            raise UpstreamError(status, content)
        return content

    async def stream_chat(self, body: dict[str, Any]) -> AsyncIterator[list[bytes]]:
        """Opens the stream before returning, so an upstream error becomes a proper status code.

        Yields the complete lines of each network read together: under load one read often holds
        several events, and relaying them as one write saves a trip through the ASGI stack each.
        """
        conn = await self._open("POST", _CHAT, orjson.dumps(body))
        if conn.status >= 400:
            raise UpstreamError(conn.status, await self._read(conn))
        return self._lines(conn)

    async def get(self, path: str) -> tuple[int, bytes]:
        return await self._request("GET", path)

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        """Any other call (vLLM's `/tokenize`, for Anthropic's count_tokens): status and body as they are."""
        return await self._request("POST", path, orjson.dumps(body))

    async def probe_token_ids(self, setting: str) -> bool:
        """Decide once, at start, whether to ask for token ids: `on`/`off` as configured; `auto` asks
        `GET /v1/models`, which costs no generation: vLLM's model cards say `owned_by: vllm`."""
        if setting != "auto":
            self.token_ids = setting == "on"
            return self.token_ids
        try:
            status, content = await self.get("/v1/models")
            cards = orjson.loads(content).get("data") or [] if status == 200 else []
        except (ReefError, orjson.JSONDecodeError, AttributeError):
            cards = []
        self.token_ids = any(isinstance(c, dict) and c.get("owned_by") == "vllm" for c in cards)
        return self.token_ids

    async def healthy(self) -> bool:
        try:
            status, _ = await self._request("GET", "/health", timeout_s=2.0)
        except ReefError:
            return False
        return status == 200

    async def _lines(self, conn: Connection) -> AsyncIterator[list[bytes]]:
        pending = b""
        try:
            async for data in conn.chunks():
                lines, pending = split_lines(pending, data)
                if lines:
                    yield lines
            if pending.strip():
                yield [pending]
        finally:
            self._pool.release(conn)  # a stream given up half-way closes its connection


def split_lines(pending: bytes, data: bytes) -> tuple[list[bytes], bytes]:
    """Complete non-empty lines in `pending + data`, and the incomplete rest.

    Splits on b"\\n" only: generated text may hold U+2028 or U+0085, which str.splitlines-based
    readers (httpx's aiter_lines) wrongly treat as line ends inside a JSON event.
    """
    *lines, rest = (pending + data if pending else data).split(b"\n")
    return [line for line in lines if line and not line.isspace()], rest
