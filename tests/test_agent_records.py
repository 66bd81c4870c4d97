"""How the real-agent tests (tests/test_agent_clis.py) read a run's records: a parsed tool call must
have been run by the agent (its result in the next turn), no call means the agent ran nothing; a run
that only looks like tool use fails. SmolLM2 makes no call there, so the call branch is pinned here."""

from __future__ import annotations

import pytest

from tests.helpers.agents import tool_calls

pytestmark = pytest.mark.model_free


def _turn(at: str, calls: list[dict], messages: list[dict]) -> dict:
    return {"scenario": "x", "gen_ai.response.model": "m", "created_at": at, "prompt_token_ids": [1, 2],
            "tools": [{"name": "bash"}], "messages": messages, "choices": [{"tool_calls": calls}]}


USER = {"role": "user", "content": "List the files."}
CALL = {"id": "c1", "name": "bash", "arguments": '{"command": "ls"}'}


def test_a_call_run_by_the_agent_and_a_text_answer() -> None:
    turns = [_turn("2", [], [USER, {"role": "tool", "content": "notes.txt"}]), _turn("1", [CALL], [USER])]
    assert tool_calls(turns, executed=True).startswith("tool calls made and executed: ['bash'] in 2 turn(s)")
    assert tool_calls([_turn("1", [], [USER])], executed=False).startswith("no tool call")
    assert tool_calls([_turn("1", [CALL], [USER])], executed=True)  # the turn cap ended the run after the call


@pytest.mark.parametrize("case", ["ran-without-a-call", "call-not-run", "result-missing", "tool-not-offered"])
def test_what_only_looks_like_tool_use_fails(case: str) -> None:
    turns = {
        "ran-without-a-call": ([_turn("1", [], [USER])], True),
        "call-not-run": ([_turn("1", [CALL], [USER])], False),
        "result-missing": ([_turn("1", [CALL], [USER]), _turn("2", [], [USER])], True),
        "tool-not-offered": ([_turn("1", [{**CALL, "name": "ls"}], [USER])], True),
    }[case]
    with pytest.raises(AssertionError):
        tool_calls(*turns)
