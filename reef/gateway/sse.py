"""The gateway's SSE responses (chat completions and every dialect's streams), sent straight to the ASGI server.

Starlette's `StreamingResponse` runs each stream in an anyio task group (one task sending the body,
one waiting for the client to go away, cancel scopes around both): per 64-token stream that cost
about as much of the gateway's CPU as parsing, recording and re-serialising every chunk together.
Here the body is sent from the request's own task and one plain asyncio task waits for the
disconnect; the last event (the receipt) leaves with the end of the body, in one write.

Closing behaviour is Starlette's: a client that goes away cancels the send, the event iterator is
closed (so the exchange records what was generated, in the background), and nothing more is sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

_CONTENT_TYPE = (b"content-type", b"text/event-stream; charset=utf-8")


class Last(bytes):
    """The stream's final bytes: sent as the end of the body, in the same write."""

    __slots__ = ()


class EventStream(Response):
    """Status 200, `headers`, then each piece `events` yields, as it comes. A `Response` for FastAPI
    (returned as it is), whose headers are written here rather than by Starlette's `init_headers`."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], headers: Mapping[str, str]) -> None:
        self._events = events
        self.status_code = 200
        self.background = None
        self.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self.raw_headers.append(_CONTENT_TYPE)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        state = {"ended": False, "gone": False}

        async def watch() -> None:
            # The request's body has been read: the next message is the disconnect (or, once the
            # response is complete, uvicorn's own end of the exchange).
            while (await receive())["type"] != "http.disconnect":
                pass
            if not state["ended"]:
                state["gone"] = True
                task.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for piece in self._events:
                last = type(piece) is Last
                if last:
                    state["ended"] = True
                await send({"type": "http.response.body", "body": piece, "more_body": not last})
                if last:
                    return
            state["ended"] = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not state["gone"]:
                raise
            task.uncancel()  # the client went away: not an error, nobody is left to tell
        finally:
            state["ended"] = True
            watcher.cancel()
            await self._events.aclose()  # type: ignore[attr-defined]
