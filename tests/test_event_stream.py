"""`reef.gateway.sse.EventStream`: the gateway's SSE response, without Starlette's task group."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from reef.gateway.sse import EventStream, Last

pytestmark = pytest.mark.model_free


class _Client:
    """An ASGI server's side of one request whose body was read: `receive` waits for a hang-up."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.gone = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)


def test_events_then_last_in_one_write() -> None:
    async def events() -> AsyncIterator[bytes]:
        yield b"data: 1\n\n"
        yield b"data: 2\n\n"
        yield Last(b"data: receipt\n\ndata: [DONE]\n\n")

    async def run() -> list[dict[str, Any]]:
        client = _Client()
        await EventStream(events(), {"x-reef-agent-record-id": "rec_1"})({}, client.receive, client.send)
        return client.sent

    sent = asyncio.run(run())
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert (b"x-reef-agent-record-id", b"rec_1") in sent[0]["headers"]
    assert (b"content-type", b"text/event-stream; charset=utf-8") in sent[0]["headers"]
    assert [(m["body"], m["more_body"]) for m in sent[1:]] == [
        (b"data: 1\n\n", True), (b"data: 2\n\n", True), (b"data: receipt\n\ndata: [DONE]\n\n", False)]


def test_an_iterator_without_last_ends_with_an_empty_body() -> None:
    async def events() -> AsyncIterator[bytes]:
        yield b"data: 1\n\n"

    async def run() -> list[dict[str, Any]]:
        client = _Client()
        await EventStream(events(), {})({}, client.receive, client.send)
        return client.sent

    assert [(m["body"], m["more_body"]) for m in asyncio.run(run())[1:]] == [(b"data: 1\n\n", True), (b"", False)]


def test_a_hang_up_closes_the_iterator_and_is_no_error() -> None:
    closed = []

    async def events() -> AsyncIterator[bytes]:
        try:
            yield b"data: 1\n\n"
            await asyncio.sleep(60)  # the engine still generating
            yield Last(b"data: never\n\n")
        finally:
            closed.append(True)

    async def run() -> list[dict[str, Any]]:
        client = _Client()
        asyncio.get_running_loop().call_later(0.05, client.gone.set)
        # As uvicorn runs an app: in a task of its own, which must end normally, not cancelled.
        task = asyncio.get_running_loop().create_task(EventStream(events(), {})({}, client.receive, client.send))
        await asyncio.wait_for(asyncio.shield(task), 5)
        assert not task.cancelled() and task.cancelling() == 0
        return client.sent

    sent = asyncio.run(run())
    assert closed == [True]
    assert [m.get("body") for m in sent[1:]] == [b"data: 1\n\n"]


def test_an_error_in_the_iterator_propagates() -> None:
    async def events() -> AsyncIterator[bytes]:
        yield b"data: 1\n\n"
        raise RuntimeError("the store failed")

    async def run() -> None:
        client = _Client()
        await EventStream(events(), {})({}, client.receive, client.send)

    with pytest.raises(RuntimeError, match="store failed"):
        asyncio.run(run())
