"""A stand-in engine and base model for gateways that never load weights: an OpenAI-compatible
upstream answering every chat with the same reply, and a model folder the publisher can import and
hash as r0."""

from __future__ import annotations

import hashlib
import http.server
import json
from pathlib import Path


def fake_model(folder: Path) -> Path:
    """A base model folder: the publisher imports and hashes it, and never loads it (no engine)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(hashlib.sha256(b"weights").digest() * 64)
    return folder


class StandInUpstream(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible stand-in: healthy, one model, the same greedy reply to everything."""

    protocol_version = "HTTP/1.1"

    def _send(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._send({"object": "list", "data": [{"id": "stand-in", "object": "model"}]})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send({"id": "c1", "object": "chat.completion", "created": 0, "model": "stand-in",
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": "ok"}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    def log_message(self, *args: object) -> None:
        pass
