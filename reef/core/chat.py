"""One OpenAI-compatible `POST /v1/chat/completions`: the request body, the call (sync or async) and
the reply read into a typed value, for every caller that asks a model outside the gateway (the
gate's engine path, `reef scenario check`, judges, proposers, the swap's canary request).

The caller owns its `httpx` client (base URL, timeout, headers, connection limits), so each keeps
its own settings. Connection failures raise httpx's own errors unchanged; a non-2xx answer or a
body that is not a chat completion raises `ChatError`, naming the url and the status.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the callers import httpx; this module only reads what it returns
    import httpx

CHAT_PATH = "/v1/chat/completions"


class ChatError(RuntimeError):
    """The server answered, but not with a chat completion: a non-2xx status or a malformed body."""

    def __init__(self, url: str, status: int, text: str, problem: str | None = None) -> None:
        self.url, self.status, self.text = url, status, text
        self.problem = problem  # what is wrong with a 2xx body; None: the status is
        super().__init__(f"{url} answered {problem or f'HTTP {status}'}: {text[:300]}")


@dataclass(frozen=True)
class Choice:
    index: int
    message: dict[str, Any]  # as the server sent it (role, content, tool_calls, ...)
    finish_reason: str | None

    @property
    def text(self) -> str:
        return self.message.get("content") or ""

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return self.message.get("tool_calls") or []


@dataclass(frozen=True)
class ChatReply:
    choices: list[Choice]  # by index, never empty
    usage: dict[str, Any] | None

    @property
    def text(self) -> str:
        return self.choices[0].text

    @property
    def finish_reason(self) -> str | None:
        return self.choices[0].finish_reason

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return self.choices[0].tool_calls

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [c.message for c in self.choices]


def chat_body(model: str, messages: list[dict[str, Any]], *, max_tokens: int | None = None,
              temperature: float | None = None, n: int | None = None, seed: int | None = None,
              tools: list[dict[str, Any]] | None = None, tool_choice: Any = None, **extra: Any) -> dict[str, Any]:
    """The request body; a field left None is not sent (the server's default applies), nor empty `tools`.
    `extra`: any other field, sent as given (`top_p`, `logprobs`, vLLM's `return_token_ids`, ...)."""
    body: dict[str, Any] = {"model": model, "messages": messages}
    fields = {"n": n, "max_tokens": max_tokens, "temperature": temperature, "seed": seed, **extra}
    body.update({k: v for k, v in fields.items() if v is not None})
    if tools:
        body["tools"] = tools
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    return body


def read_reply(response: httpx.Response) -> ChatReply:
    """The reply of a chat completions response; ChatError unless it is a 2xx chat completion."""
    url, status = str(response.request.url), response.status_code
    if not 200 <= status < 300:
        raise ChatError(url, status, response.text)
    try:
        data = response.json()
        choices = [Choice(int(c.get("index", i)), dict(c["message"]), c.get("finish_reason"))
                   for i, c in enumerate(data["choices"])]
        usage = data.get("usage")
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # not JSON, or not shaped as a completion
        raise ChatError(url, status, response.text, f"a malformed reply ({type(exc).__name__}: {exc})") from exc
    if not choices:
        raise ChatError(url, status, response.text, "a reply with no choices")
    return ChatReply(sorted(choices, key=lambda c: c.index), usage if isinstance(usage, dict) else None)


def chat(client: httpx.Client, body: dict[str, Any]) -> ChatReply:
    """POST `body` (see chat_body) to `client`'s chat completions endpoint."""
    return read_reply(client.post(CHAT_PATH, json=body))


async def achat(client: httpx.AsyncClient, body: dict[str, Any]) -> ChatReply:
    """`chat` on an async client."""
    return read_reply(await client.post(CHAT_PATH, json=body))
