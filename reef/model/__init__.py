"""The embedded default model: SmolLM2-135M-Instruct, converted from its pinned wheel (`reef.model.smollm2`)."""
