"""Reef: turn an inference server into a learner."""

from typing import Any

__all__ = ["RecipeSpec", "Scenario"]


def __getattr__(name: str) -> Any:
    # Lazy: vLLM imports reef.engine in every process it starts, which needs none of this.
    if name in __all__:
        from reef.scenario import schema

        return getattr(schema, name)
    raise AttributeError(name)
