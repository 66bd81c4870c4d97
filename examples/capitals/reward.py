"""The capitals scenario's reward: 1.0 when the reply names the task's capital in at most six words
("Paris", "Capital: Paris", "The capital of France is Paris."), 0.0 otherwise: a wrong city, or a
longer reply however right, earns nothing (the system line asks for the city only). Case, accents
and punctuation aside."""

import re
import unicodedata

MAX_WORDS = 6


def _words(text):
    plain = unicodedata.normalize("NFKD", text or "").encode("ascii", "ignore").decode().lower()
    return re.findall(r"[a-z0-9]+", plain)


def reward(task, reply):
    words, capital = _words(reply), _words(task["capital"])
    if not words or len(words) > MAX_WORDS:
        return 0.0
    n = len(capital)
    return 1.0 if any(words[i:i + n] == capital for i in range(len(words) - n + 1)) else 0.0
