"""The HTTP client to the OpenAI-compatible server Reef records in front of (usually vLLM)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson

from reef.gateway.errors import ReefError


class UpstreamError(Exception):
    """The upstream answered with an error status; its body goes back to the client as it is."""

    def __init__(self, status: int, body: bytes):
        super().__init__(f"upstream answered {status}")
        self.status, self.body = status, body


class Upstream:
    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 600.0):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            # The gateway multiplexes every client onto one pool: never let the pool be the limit.
            limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256),
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            resp = await self._client.post("/v1/chat/completions", content=orjson.dumps(body),
                                           headers={"content-type": "application/json"})
        except httpx.HTTPError as exc:
            raise ReefError(503, f"the model server is unavailable: {exc!r}", code="engine_unavailable") from exc
        if resp.status_code >= 400:
            raise UpstreamError(resp.status_code, resp.content)
        return orjson.loads(resp.content)

    async def stream_chat(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        """Opens the stream before yielding, so an upstream error becomes a proper status code."""
        request = self._client.build_request(
            "POST", "/v1/chat/completions", content=orjson.dumps(body),
            headers={"content-type": "application/json"},
        )
        try:
            resp = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise ReefError(503, f"the model server is unavailable: {exc!r}", code="engine_unavailable") from exc
        if resp.status_code >= 400:
            content = await resp.aread()
            await resp.aclose()
            raise UpstreamError(resp.status_code, content)
        return _lines(resp)

    async def get(self, path: str) -> httpx.Response:
        try:
            return await self._client.get(path)
        except httpx.HTTPError as exc:
            raise ReefError(503, f"the model server is unavailable: {exc!r}", code="engine_unavailable") from exc

    async def healthy(self) -> bool:
        try:
            return (await self._client.get("/health", timeout=2.0)).status_code == 200
        except httpx.HTTPError:
            return False


async def _lines(resp: httpx.Response) -> AsyncIterator[bytes]:
    try:
        async for line in resp.aiter_lines():
            if line:
                yield line.encode()
    finally:
        await resp.aclose()
