"""A stand-in engine replica, run as its own process so a test can `kill -9` it:
`python -m tests.helpers.replica_stand_in PORT NAME`. Every answer says which replica wrote it
("served by NAME"); a stream is slow enough (`STREAM_CHUNKS` events, `STEP_S` apart) to be cut mid-way."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from aiohttp import web

from reef.serve_process import wait_healthy
from tests.helpers import REPO

STEP_S = 0.05
STREAM_CHUNKS = 40


def _app(name: str) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        text = f"served by {name}"
        base = {"id": f"chatcmpl-{name}", "created": 1, "model": body["model"]}
        usage = {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
        if not body.get("stream"):
            await asyncio.sleep(STEP_S)  # in flight long enough for a kill to land on some calls
            return web.json_response({**base, "object": "chat.completion", "usage": usage, "choices": [{
                "index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(STREAM_CHUNKS):
            last = i == STREAM_CHUNKS - 1
            choice = {"index": 0, "delta": {"content": text if i == 0 else "."},
                      "finish_reason": "stop" if last else None}
            chunk = {**base, "object": "chat.completion.chunk", "choices": [choice]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await asyncio.sleep(STEP_S)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "stand-in", "object": "model",
                                                              "owned_by": "stand-in"}]})

    async def health(_: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    return app


def start(port: int, name: str, timeout_s: float = 30.0) -> subprocess.Popen[bytes]:
    """The stand-in as a child process, once its `/health` answers."""
    process = subprocess.Popen([sys.executable, "-m", "tests.helpers.replica_stand_in", str(port), name], cwd=REPO)
    if wait_healthy(f"http://127.0.0.1:{port}/health", process, timeout_s, interval_s=0.05):
        return process
    assert process.poll() is None, f"stand-in {name} exited with {process.returncode}"
    process.kill()
    raise RuntimeError(f"stand-in {name} did not start on port {port}")

if __name__ == "__main__":
    web.run_app(_app(sys.argv[2]), host="127.0.0.1", port=int(sys.argv[1]), print=None)
