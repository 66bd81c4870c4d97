"""The HTTP client to the OpenAI-compatible server Reef records in front of (usually vLLM).

aiohttp rather than httpx: on the streaming hot path (one SSE event per token) httpx's per-chunk
overhead cost a large share of a core on our 2-core machines.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
from yarl import URL

from reef.gateway.errors import ReefError

_JSON = {"content-type": "application/json"}


class UpstreamError(Exception):
    """The upstream answered with an error status; its body goes back to the client as it is."""

    def __init__(self, status: int, body: bytes):
        super().__init__(f"upstream answered {status}")
        self.status, self.body = status, body


def _unavailable(exc: Exception) -> ReefError:
    # A plain reason, not the aiohttp repr: clients show this message to people.
    reason = "it timed out" if isinstance(exc, TimeoutError) else "it refused or dropped the connection"
    return ReefError(503, f"the model server is unavailable ({reason}); retry shortly", code="engine_unavailable",
                     headers={"Retry-After": "5"})


class Upstream:
    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 600.0):
        self.base_url = base_url.rstrip("/")
        self._chat_url = URL(f"{self.base_url}/v1/chat/completions")  # parsed once, not per request
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=10.0)
        self._session: aiohttp.ClientSession | None = None
        # Whether the server returns token ids (vLLM's `return_token_ids`); see probe_token_ids.
        self.token_ids = True

    def _http(self) -> aiohttp.ClientSession:
        # Created lazily: an aiohttp session belongs to the event loop that first uses it.
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers=self._headers, timeout=self._timeout,
                # The gateway multiplexes every client onto one pool: never let the pool be the limit.
                # Shorter than uvicorn's 5 s keep-alive (vLLM's server): reusing a connection the
                # server is closing for idleness fails the request.
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=3),
                # Per-request work nobody needs: an API server's cookies, and a compressed body the
                # gateway would only have to inflate again (the default Accept-Encoding asks for one).
                cookie_jar=aiohttp.DummyCookieJar(), skip_auto_headers=("User-Agent", "Accept-Encoding"),
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _post(self, body: dict[str, Any]) -> aiohttp.ClientResponse:
        """POST a chat request; returns once response headers are in."""
        data = orjson.dumps(body)
        url = self._chat_url
        try:
            try:
                return await self._http().post(url, data=data, headers=_JSON)
            except aiohttp.ServerDisconnectedError:
                # A pooled connection closed by the server as we reused it: the request was never
                # read, so sending it again cannot run it twice.
                return await self._http().post(url, data=data, headers=_JSON)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _unavailable(exc) from exc

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        resp = await self._post(body)
        try:
            content = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _unavailable(exc) from exc
        finally:
            resp.release()
        if resp.status >= 400:
            raise UpstreamError(resp.status, content)
        return orjson.loads(content)

    async def stream_chat(self, body: dict[str, Any]) -> AsyncIterator[list[bytes]]:
        """Opens the stream before returning, so an upstream error becomes a proper status code.

        Yields the complete lines of each network read together: under load one read often holds
        several events, and relaying them as one write saves a trip through the ASGI stack each.
        """
        resp = await self._post(body)
        if resp.status >= 400:
            content = await resp.read()
            resp.release()
            raise UpstreamError(resp.status, content)
        return _lines(resp)

    async def get(self, path: str) -> tuple[int, bytes]:
        try:
            async with self._http().get(f"{self.base_url}{path}") as resp:
                return resp.status, await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _unavailable(exc) from exc

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
            async with self._http().get(f"{self.base_url}/health", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False


def split_lines(pending: bytes, data: bytes) -> tuple[list[bytes], bytes]:
    """Complete non-empty lines in `pending + data`, and the incomplete rest.

    Splits on b"\\n" only: generated text may hold U+2028 or U+0085, which str.splitlines-based
    readers (httpx's aiter_lines) wrongly treat as line ends inside a JSON event.
    """
    *lines, rest = (pending + data).split(b"\n")
    return [line for line in lines if line.strip()], rest


async def _lines(resp: aiohttp.ClientResponse) -> AsyncIterator[list[bytes]]:
    pending = b""
    try:
        async for data in resp.content.iter_any():
            lines, pending = split_lines(pending, data)
            if lines:
                yield lines
        if pending.strip():
            yield [pending]
    finally:
        resp.release()
