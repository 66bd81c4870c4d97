"""Size limits checked before any route runs: request headers (431) and bodies (413).

A pure ASGI middleware: a body declaring a Content-Length over the limit is refused before it is
read; a chunked body is read here, and refused as soon as it passes the limit.
"""

from __future__ import annotations

from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reef.gateway.wire import messages
from reef.gateway.wire.errors import ReefError, error_response


def _error(scope: Scope, status: int, message: str, code: str) -> Response:
    # Anthropic's SDKs read their own error shape only: Claude Code's calls get it here too.
    if scope["path"].startswith(messages.PATH_PREFIX):
        return JSONResponse(messages.error_body(status, message), status_code=status)
    return error_response(status, message, code=code)


class SizeLimits:
    def __init__(self, app: ASGIApp, max_body_bytes: int, max_header_bytes: int):
        self.app, self.max_body, self.max_headers = app, max_body_bytes, max_header_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header_bytes = 0
        declared: int | None = None
        for name, value in scope["headers"]:
            header_bytes += len(name) + len(value) + 4  # ": " and CRLF, as on the wire
            if name == b"content-length":
                declared = int(value) if value.isdigit() else None
        if header_bytes > self.max_headers:
            await _error(scope, 431, f"request headers are {header_bytes} bytes, over limits.max_header_bytes "
                         f"({self.max_headers})", code="headers_too_large")(scope, receive, send)
            return
        if declared is not None and declared > self.max_body:
            await self._refuse(scope, receive, send, declared)
            return

        if declared is not None:  # the server reads no more than a declared length
            await self.app(scope, receive, send)
            return
        # A chunked body: read it here, up to the limit, then hand it on whole.
        chunks: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            received += len(chunks[-1])
            if received > self.max_body:
                await self._refuse(scope, receive, send, received)
                return
            if not message.get("more_body", False):
                break
        replay: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replayed() -> Message:
            return replay.pop() if replay else await receive()

        await self.app(scope, replayed, send)

    def _too_large(self, size: int) -> ReefError:
        return ReefError(413, f"request body is over limits.max_body_bytes ({self.max_body} bytes; got {size})",
                         code="body_too_large")

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, size: int) -> None:
        err = self._too_large(size)
        await _error(scope, err.status, err.message, err.code or "")(scope, receive, send)
