"""The embedded default model: a tiny Qwen2 built from scratch on CPU (`reef.model.tiny`)."""
