"""Tool use for the tiny model's corpus (a contribution, see `corpus.py`).

Chats in which a coding agent offers tools (the four a Pi-style agent sends: read, bash, edit,
write), the user asks for something a tool answers, the assistant calls it in the format of the
model's chat template (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, which vLLM's
`hermes` parser reads), the tool's result comes back as a `tool` turn, and the assistant answers
from it. Some chats offer tools the request does not need (a greeting gets a plain reply), so the
model does not call tools for everything. Both stages teach the format correctly: what is weak on
purpose is demo-add, not the format.

Chats are kept short (the trainer cuts documents at 160 tokens): a few tools, short results.
"""

from __future__ import annotations

import random
from typing import Any

from tests.helpers.tiny.chat_format import Chat

CHATS_PER_STAGE = {"learn": 500, "calibrate": 500}


def _tool(name: str, description: str, **params: str) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {p: {"type": t} for p, t in params.items()},
                       "required": list(params)[:1]},
    }}


# The agent's tools, with the parameter names Pi's own tools have (the template lists only names).
TOOLS = {
    "read": _tool("read", "Read the contents of a file.", path="string", offset="number", limit="number"),
    "bash": _tool("bash", "Execute a bash command.", command="string", timeout="number"),
    "edit": _tool("edit", "Edit a file by exact text replacement.", path="string", edits="array"),
    "write": _tool("write", "Create or overwrite a file.", path="string", content="string"),
}

_SYSTEMS = ["You are a coding agent.", "You are a helpful assistant.", "You help with files and commands."]
_WORDS = "notes todo plan data report readme list ideas draft story letter log".split()
_EXTS = ["txt", "md", "py", "json"]
_DIRS = "work project demo src app repo tmp home".split()
_LINES = [
    "Buy milk and bread.", "The meeting is at noon.", "Call the doctor.", "Fix the login bug.",
    "Water the plants.", "The cat sleeps on the bed.", "Ship the release on Friday.", "Hello, world!",
]


def _file(rng: random.Random) -> str:
    return f"{rng.choice(_WORDS)}.{rng.choice(_EXTS)}"


def _files(rng: random.Random) -> list[str]:
    return sorted({_file(rng) for _ in range(rng.randint(1, 4))})


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _system(rng: random.Random) -> str | None:
    roll = rng.random()
    if roll < 0.2:
        return None
    text = rng.choice(_SYSTEMS)
    if roll < 0.6:  # how an agent like Pi ends its system prompt
        text += f"\nCurrent date: 2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        text += f"\nCurrent working directory: /tmp/{rng.choice(_DIRS)}"
    return text


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": name, "arguments": arguments}}]}


def _result(text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": "call_0", "content": text}


def _exchange(rng: random.Random) -> tuple[str, list[dict[str, Any]], str]:
    """(needed tool, the turns after the system prompt, kind) for one request."""
    kind = rng.randrange(6)
    if kind == 0:
        files = _files(rng)
        ask = rng.choice(["List the files.", "What files are here?", "Show me the files.", "Run ls."])
        answer = rng.choice([f"The files are {_and(files)}.", f"Here: {_and(files)}."])
        if len(files) == 1:
            answer = f"There is one file: {files[0]}."
        return "bash", [_user(ask), _call("bash", command="ls"), _result("\n".join(files)), _reply(answer)], "ls"
    if kind == 1:
        name, line = _file(rng), rng.choice(_LINES)
        ask = rng.choice([f"What is in {name}?", f"Read {name}.", f"Show me {name}."])
        return "read", [_user(ask), _call("read", path=name), _result(line), _reply(f"{name} says: {line}")], "read"
    if kind == 2:
        folder = f"/tmp/{rng.choice(_DIRS)}"
        ask = rng.choice(["Where am I?", "Print the working directory.", "Which folder is this?"])
        turns = [_user(ask), _call("bash", command="pwd"), _result(folder), _reply(f"You are in {folder}.")]
        return "bash", turns, "pwd"
    if kind == 3:
        name, line = _file(rng), rng.choice(_LINES)
        ask = f"Write {line} to {name}."
        done = f"Successfully wrote {len(line)} bytes to {name}"
        turns = [_user(ask), _call("write", path=name, content=line), _result(done),
                 _reply(f"Done: {name} is written.")]
        return "write", turns, "write"
    if kind == 4:
        name = _file(rng)
        error = f"ENOENT: no such file or directory, open '{name}'"
        turns = [_user(f"Read {name}."), _call("read", path=name), _result(error),
                 _reply(f"I could not read {name}: it does not exist.")]
        return "read", turns, "error"
    greeting = rng.choice(["Hello!", "Hi!", "Thanks!", "Good morning!"])
    reply = rng.choice(["Hello! What should I do?", "Hi! How can I help?", "You are welcome!"])
    return "", [_user(greeting), _reply(reply)], "plain"


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _reply(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def tool_chat(rng: random.Random) -> Chat:
    """One chat: a system prompt (or none) offering 2-4 tools, and a request answered with or
    without a tool."""
    needed, turns, _ = _exchange(rng)
    others = [n for n in TOOLS if n != needed]
    offered = ([needed] if needed else []) + rng.sample(others, rng.randint(1, 3) if needed else rng.randint(2, 4))
    rng.shuffle(offered)
    system = _system(rng)
    head: dict[str, Any] = {"role": "system", "content": system} if system else dict(turns.pop(0))
    head["tools"] = [TOOLS[n] for n in offered]
    return [head, *turns]


def contribution(rng: random.Random) -> dict[str, list[Chat]]:
    return {stage: [tool_chat(rng) for _ in range(n)] for stage, n in CHATS_PER_STAGE.items()}
