"""The weather scenario's reward, strict: 1.0 when the reply is exactly one `get_weather` call whose
`city` argument names the task's city (case and surrounding spaces aside), 0.0 otherwise. A tool call
reaches a reward as the Hermes-style markup vLLM's parser read it from (`<tool_call>{json}</tool_call>`);
prose about the weather, or Python that calls the function, earns nothing, as an agent that runs
the call would see it."""

import json
import re

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def reward(task, reply):
    calls = _CALL.findall(reply or "")
    if len(calls) != 1:
        return 0.0
    try:
        call = json.loads(calls[0])
    except ValueError:
        return 0.0
    if not isinstance(call, dict) or call.get("name") != "get_weather":
        return 0.0
    arguments = call.get("arguments")
    if not isinstance(arguments, dict) or set(arguments) != {"city"}:
        return 0.0
    city = arguments["city"]
    return 1.0 if isinstance(city, str) and city.strip().lower() == task["city"].lower() else 0.0
