"""Asking a model: one completion type and `Sampler` protocol (completion), the transformers backend
in process (transformers), the vLLM engine path over HTTP that the gate, recipes and `reef scenario
check` sample through (engine), the one episode loop for tool-using scenarios (episodes), the one
model loader (load), and recipes' self-generated experience (rollout). The engine path drives its
episodes itself: each advances on its own request as soon as its reply is back, with a seed per
episode and turn, which a turn-by-turn loop would not keep. Scoring what was sampled is the
evaluator's (reef.gate.scoring)."""
