"""vLLM plugin: a request with a `seed` no longer kills the engine on the CPU platform.

A seeded request gets its own torch.Generator. When a step's sampled token is thrown away (a
prompt still being prefilled in chunks), vLLM rewinds that generator by its Philox offset
(`gen.set_offset(gen.get_offset() - 4)`); CPU generators have no offset, so the worker raises
"CPU Generator does not use offset" and the whole engine dies (EngineDeadError), taking every
in-flight request with it. Any client sending `seed` under concurrent load triggers it; the gate
samples every eval task with a seed.

The CPU generator's state is saved before sampling and put back instead of the rewind, which is
what the rewind means: the discarded sample consumed no randomness. Registered as a
``vllm.general_plugins`` entry point (vLLM runs it in each of its processes); only CPU
generators without offsets are patched around, so a GPU is left alone.
"""

from __future__ import annotations

from typing import Any

import torch

_STATES = "_reef_discarded_generator_states"


def cpu_generators_lack_offsets() -> bool:
    try:
        torch.Generator().get_offset()
    except RuntimeError:
        return True
    return False


def patch(runner_cls: Any) -> None:
    sample_tokens, bookkeeping = runner_cls.sample_tokens, runner_cls._bookkeeping_sync

    def patched_sample_tokens(self: Any, *args: Any, **kwargs: Any) -> Any:
        import numpy as np

        n = self.input_batch.num_reqs
        saved = {}
        for i in np.nonzero(self.discard_request_mask.np[:n])[0]:
            gen = self.input_batch.generators.get(int(i))
            if gen is not None:
                saved[int(i)] = gen.get_state()
        setattr(self, _STATES, saved)
        return sample_tokens(self, *args, **kwargs)

    def patched_bookkeeping(self: Any, *args: Any, **kwargs: Any) -> Any:
        saved: dict[int, torch.Tensor] = getattr(self, _STATES, None) or {}
        setattr(self, _STATES, {})
        generators = self.input_batch.generators
        held = {i: generators.pop(i) for i in saved if i in generators}  # hidden from the offset rewind
        try:
            return bookkeeping(self, *args, **kwargs)
        finally:
            for i, gen in held.items():
                gen.set_state(saved[i])
                generators[i] = gen

    patched_sample_tokens.__reef_patched__ = True  # type: ignore[attr-defined]
    runner_cls.sample_tokens = patched_sample_tokens
    runner_cls._bookkeeping_sync = patched_bookkeeping


def register() -> None:
    """The plugin entry point; vLLM may call it more than once per process."""
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return
        from vllm.logger import init_logger
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    except ImportError:  # another vLLM layout: nothing known to mend
        return
    if getattr(CPUModelRunner.sample_tokens, "__reef_patched__", False) or not cpu_generators_lack_offsets():
        return
    if not hasattr(CPUModelRunner, "_bookkeeping_sync"):
        return
    patch(CPUModelRunner)
    init_logger("vllm.plugins.reef_cpu_seed_fix").info(
        "reef: seeded requests no longer kill the engine when a prefill is chunked on CPU")
