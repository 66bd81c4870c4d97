"""Write eval.jsonl and tasks.jsonl: 48 held-out questions (about 24 countries no task names) and
118 training questions (about the 59 other countries), each asking for a country's capital.

    python examples/capitals/generate.py

Each row is a task as Reef reads it: `messages` (a system line asking for the city's name only,
then the user's question), `country`, `capital` (what the reward checks) and `reference`, the reply wanted,
for an application that corrects rejected replies (this scenario's own serve.yaml learns from
rewards only).
"""

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
CAPITALS = {
    "France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Spain": "Madrid", "Germany": "Berlin", "Egypt": "Cairo",
    "Canada": "Ottawa", "Russia": "Moscow", "China": "Beijing", "Greece": "Athens", "Peru": "Lima",
    "Kenya": "Nairobi", "Norway": "Oslo", "Poland": "Warsaw", "Austria": "Vienna", "Ireland": "Dublin",
    "Portugal": "Lisbon", "Sweden": "Stockholm", "Thailand": "Bangkok", "Cuba": "Havana", "Chile": "Santiago",
    "Finland": "Helsinki", "Hungary": "Budapest", "Denmark": "Copenhagen", "England": "London",
    "the United Kingdom": "London", "the United States": "Washington", "Mexico": "Mexico City",
    "Argentina": "Buenos Aires", "Colombia": "Bogota", "Venezuela": "Caracas", "Ecuador": "Quito",
    "Uruguay": "Montevideo", "Paraguay": "Asuncion", "Bolivia": "La Paz", "Brazil": "Brasilia",
    "Australia": "Canberra", "New Zealand": "Wellington", "India": "New Delhi", "Pakistan": "Islamabad",
    "Bangladesh": "Dhaka", "Nepal": "Kathmandu", "Afghanistan": "Kabul", "Iran": "Tehran", "Iraq": "Baghdad",
    "Syria": "Damascus", "Lebanon": "Beirut", "Jordan": "Amman", "Israel": "Jerusalem", "Turkey": "Ankara",
    "Saudi Arabia": "Riyadh", "Qatar": "Doha", "Indonesia": "Jakarta", "the Philippines": "Manila",
    "Vietnam": "Hanoi", "South Korea": "Seoul", "North Korea": "Pyongyang", "Malaysia": "Kuala Lumpur",
"Mongolia": "Ulaanbaatar", "Ukraine": "Kyiv", "Belgium": "Brussels",
    "the Netherlands": "Amsterdam", "Switzerland": "Bern", "the Czech Republic": "Prague", "Romania": "Bucharest",
    "Bulgaria": "Sofia", "Serbia": "Belgrade", "Croatia": "Zagreb", "Slovakia": "Bratislava",
    "Latvia": "Riga", "Lithuania": "Vilnius", "Estonia": "Tallinn", "Iceland": "Reykjavik",
    "Scotland": "Edinburgh", "Wales": "Cardiff", "Morocco": "Rabat", "Algeria": "Algiers", "Tunisia": "Tunis",
    "Libya": "Tripoli", "Nigeria": "Abuja", "Ghana": "Accra", "Ethiopia": "Addis Ababa", "Senegal": "Dakar",
}
SYSTEM = "Reply with the name of the city only, nothing else."
QUESTIONS = ("What is the capital of {c}?", "Which city is the capital of {c}?", "Name the capital of {c}.",
             "What city is {c}'s capital?", "Capital of {c}?")


def rows(countries: list[str], per_country: int, seed: int, prefix: str) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for country in countries:
        for question in rng.sample(QUESTIONS, per_country):
            ask = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question.format(c=country)}]
            capital = CAPITALS[country]
            out.append({"task_id": f"{prefix}-{len(out)}", "messages": ask, "country": country, "capital": capital,
                        "reference": capital})
    rng.shuffle(out)
    return out


def main() -> None:
    countries = list(CAPITALS)
    random.Random(0).shuffle(countries)  # fixed: the held-out countries never move
    held_out, train = countries[:24], countries[24:]
    files = {"eval": rows(held_out, 2, seed=2, prefix="eval"), "tasks": rows(train, 2, seed=1, prefix="task")}
    for name, got in files.items():
        (HERE / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in got))
        print(f"{name}.jsonl: {len(got)} rows")


if __name__ == "__main__":
    main()
