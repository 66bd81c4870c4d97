"""Tool definitions the tool-calling tests offer the model, as a coding agent would."""

from __future__ import annotations

BASH = {"type": "function", "function": {
    "name": "bash", "description": "Execute a bash command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
                   "required": ["command"]}}}
READ = {"type": "function", "function": {
    "name": "read", "description": "Read the contents of a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
