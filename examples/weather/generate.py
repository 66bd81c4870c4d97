"""Write eval.jsonl and tasks.jsonl: 32 held-out weather questions (about 16 cities no task names)
and 96 training questions (about 48 other cities), each offering one function, `get_weather(city)`.

    python examples/weather/generate.py

Each row is a task as Reef reads it: `messages` (what a user sends), `tools` (the function, OpenAI
format, rendered into the prompt by the chat template), `city` (what the reward checks) and
`reference`, the call wanted, for an application that corrects rejected replies (this scenario's
own serve.yaml learns from rewards only).
"""

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
CITIES = ("Oslo Lima Rome Kyiv Cairo Paris Berlin Madrid Lisbon Dublin Vienna Prague Warsaw Athens Sofia Riga "
          "Tallinn Vilnius Helsinki Stockholm Copenhagen Amsterdam Brussels Zurich Geneva Milan Naples Seville "
          "Porto Krakow Budapest Bucharest Belgrade Zagreb Tokyo Osaka Seoul Beijing Shanghai Delhi Mumbai "
          "Bangkok Hanoi Manila Jakarta Sydney Melbourne Auckland Toronto Montreal Chicago Boston Denver Seattle "
          "Houston Miami Havana Bogota Quito Santiago Montevideo Nairobi Lagos Accra").split()
QUESTIONS = ("What is the weather in {c}?", "How is the weather in {c} today?", "Is it raining in {c}?",
             "Tell me the current weather in {c}.", "What's the weather like in {c} right now?",
             "Do I need an umbrella in {c} today?")
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city name"}},
                   "required": ["city"]}}}]


def rows(cities: list[str], per_city: int, seed: int, prefix: str) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for city in cities:
        for question in rng.sample(QUESTIONS, per_city):
            call = json.dumps({"name": "get_weather", "arguments": {"city": city}})
            ask = [{"role": "user", "content": question.format(c=city)}]
            out.append({"task_id": f"{prefix}-{len(out)}", "messages": ask, "tools": TOOLS, "city": city,
                        "reference": f"<tool_call>\n{call}\n</tool_call>"})
    rng.shuffle(out)
    return out


def main() -> None:
    cities = list(CITIES)
    random.Random(0).shuffle(cities)  # fixed: the held-out cities never move
    held_out, train = cities[:16], cities[16:64]
    files = {"eval": rows(held_out, 2, seed=2, prefix="eval"), "tasks": rows(train, 2, seed=1, prefix="task")}
    for name, got in files.items():
        (HERE / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in got))
        print(f"{name}.jsonl: {len(got)} rows")


if __name__ == "__main__":
    main()
