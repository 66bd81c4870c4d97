"""The base of every config section: an unknown key is an error naming that key, never silently ignored."""

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
