"""Durable experience: the store the gateway appends to, and `load()` for everyone who reads it."""

from reef.experience.load import Experience, load
from reef.experience.store import ExperienceStore, ScenarioStats

__all__ = ["Experience", "ExperienceStore", "ScenarioStats", "load"]
