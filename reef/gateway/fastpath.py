"""`POST /v1/chat/completions` (and the other dialects' model calls) served straight from ASGI, ahead of FastAPI.

It is the gateway's hot path, and FastAPI's routing, middleware stack and dependency handling cost
about as much CPU per request as everything Reef itself does for it. The route stays declared in
FastAPI, which documents it in `/reef/openapi.json` and answers other methods on its path (405
with `Allow`); this dispatcher sends the chat calls past it to the same handler, with the same size
limits and the same error bodies. Every other request goes to FastAPI.
"""

from __future__ import annotations

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from reef.experience.wal import WalError
from reef.gateway.dialects import Dialect, serve_dialect
from reef.gateway.limits import SizeLimits
from reef.gateway.routes import messages, responses
from reef.gateway.routes.chat import serve_chat
from reef.gateway.state import GatewayState
from reef.gateway.wire.errors import ReefError, reef_error_response, store_error_response, unexpected_error_response

CHAT_PATH = "/v1/chat/completions"
# The dialects' model calls, each answering its own errors in its own shape.
DIALECTS: dict[str, Dialect] = {responses.PATH: responses.DIALECT, messages.PATH: messages.DIALECT}


class ChatRequest(Request):
    """Starlette's request with what the chat handler reads made cheap: its headers as one dict built
    once (Starlette's `Headers.get` scans and decodes the raw list on every call, and a chat call
    makes several), and its body read straight from `receive`, without an async generator."""

    _lookup: dict[str, str]

    @property
    def headers(self) -> dict[str, str]:  # type: ignore[override]
        try:
            return self._lookup
        except AttributeError:
            # Reversed, so that of a repeated header the first wins, as with Starlette's `get`.
            self._lookup = {k.decode("latin-1"): v.decode("latin-1") for k, v in reversed(self.scope["headers"])}
            return self._lookup

    async def body(self) -> bytes:
        if not hasattr(self, "_body"):
            chunks = []
            while True:
                message = await self._receive()
                if message["type"] == "http.disconnect":
                    raise ClientDisconnect()
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
            self._body = b"".join(chunks)
        return self._body


class ChatFastPath:
    def __init__(self, app: ASGIApp, state: GatewayState) -> None:
        self.app, self.state = app, state
        limits = state.config.limits
        self._chat = SizeLimits(self._serve, max_body_bytes=limits.max_body_bytes,
                                max_header_bytes=limits.max_header_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and (
                scope["path"] == CHAT_PATH or scope["path"] in DIALECTS):
            await self._chat(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        response: Response
        dialect = DIALECTS.get(scope["path"])
        if dialect is not None:
            await (await serve_dialect(self.state, ChatRequest(scope, receive), dialect))(scope, receive, send)
            return
        try:
            response = await serve_chat(self.state, ChatRequest(scope, receive))
        except ReefError as exc:
            response = reef_error_response(exc)
        except WalError as exc:
            response = store_error_response(exc)
        except ClientDisconnect:  # gone before its body arrived: nobody to answer
            return
        except Exception:
            response = unexpected_error_response("POST", CHAT_PATH)
        await response(scope, receive, send)
