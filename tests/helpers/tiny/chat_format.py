"""How the embedded tiny model writes a chat: its chat template, and the same rendering in Python
for the trainer (text pieces with what is trained on), which must agree token for token."""

from __future__ import annotations

import json
from typing import Any

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
# A chat of the corpus is a list of OpenAI-style messages; one that offers tools carries them (the
# request's top-level `tools`) under "tools" on its first message.
Chat = list[dict[str, Any]]

# ChatML as Qwen writes it, minus the default system prompt: a request without a system message
# must render exactly the messages it sent, so recorded prompt token ids match what was served.
# Tools follow Hermes/Qwen (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` in the reply,
# which vLLM's `hermes` tool parser reads), but the offered tools are listed as signatures only,
# `name(param, ...)`, inside the system turn: a ~1M-parameter model cannot read JSON schemas, and an
# agent's ~3 KB of schemas would not leave room for a conversation. Tool results are `tool` turns.
# Non-string content (content parts, or an assistant turn that only has tool calls) renders as
# empty; vLLM joins text parts into a string before rendering.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(first=0) %}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0]['role'] == 'system' and messages[0]['content'] is string %}"
    "{{- messages[0]['content'] + '\\n' }}{%- set ns.first = 1 %}"
    "{%- endif %}"
    "{{- '<tools>' }}"
    "{%- for tool in tools %}"
    "{%- set fn = tool['function'] if tool['function'] is defined else tool %}"
    "{%- set params = fn['parameters'] if fn['parameters'] is mapping else {} %}"
    "{%- set props = params['properties'] if params['properties'] is mapping else {} %}"
    "{{- '\\n' + fn['name'] + '(' + (props | list | join(', ')) + ')' }}"
    "{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages[ns.first:] %}"
    "{%- set content = message['content'] if message['content'] is string else '' %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content }}"
    "{%- if message['role'] == 'assistant' and message['tool_calls'] %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set fn = call['function'] if call['function'] is defined else call %}"
    "{{- '<tool_call>{\"name\": ' + (fn['name'] | tojson) + ', \"arguments\": ' }}"
    "{{- fn['arguments'] if fn['arguments'] is string else (fn['arguments'] | tojson) }}"
    "{{- '}</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def split_tools(chat: Chat) -> tuple[Chat, list[dict[str, Any]]]:
    """(messages, offered tools) of a corpus chat."""
    if not chat or "tools" not in chat[0]:
        return chat, []
    first = {k: v for k, v in chat[0].items() if k != "tools"}
    return [first, *chat[1:]], list(chat[0]["tools"])


def tool_signature(tool: dict[str, Any]) -> str:
    """`name(param, ...)`: how CHAT_TEMPLATE lists an offered tool."""
    fn = tool.get("function", tool)
    params: dict[str, Any] = fn["parameters"] if isinstance(fn.get("parameters"), dict) else {}
    props: dict[str, Any] = params["properties"] if isinstance(params.get("properties"), dict) else {}
    return f"{fn['name']}({', '.join(props)})"


def tool_call_text(call: dict[str, Any]) -> str:
    """One call as the model writes it: the JSON text vLLM's hermes parser reads back (json.dumps
    spacing, like the template's `tojson` and the parser's own re-serialisation)."""
    fn = call.get("function", call)
    args = fn["arguments"] if isinstance(fn["arguments"], str) else json.dumps(fn["arguments"], ensure_ascii=False)
    return f'<tool_call>{{"name": {json.dumps(fn["name"], ensure_ascii=False)}, "arguments": {args}}}</tool_call>'


def chat_segments(chat: Chat) -> list[tuple[str, bool]]:
    """CHAT_TEMPLATE's rendering of a corpus chat as (text, trained) pieces: only assistant replies
    (with their tool calls and `<|im_end|>`, so the model learns to stop) are targets. Pieces end
    where the tokenizer splits anyway (special tokens, newlines), so encoding them one by one gives
    the ids of the whole rendering; `check_tokenizer_roundtrip` proves it for the corpus."""
    messages, tools = split_tools(chat)
    segments: list[tuple[str, bool]] = []
    if tools:
        system = ""
        if messages and messages[0]["role"] == "system" and isinstance(messages[0].get("content"), str):
            system = messages[0]["content"] + "\n"
            messages = messages[1:]
        listing = "".join("\n" + tool_signature(t) for t in tools)
        block = f"{system}<tools>{listing}\n</tools>{IM_END}"
        segments += [(f"{IM_START}system\n", False), (block, False), ("\n", False)]
    for message in messages:
        content: str = message["content"] if isinstance(message.get("content"), str) else ""
        body = content
        if message["role"] == "assistant":
            body += "".join(tool_call_text(c) for c in message.get("tool_calls") or ())
        segments += [
            (f"{IM_START}{message['role']}\n", False),
            (f"{body}{IM_END}", message["role"] == "assistant"),
            ("\n", False),
        ]
    return segments
