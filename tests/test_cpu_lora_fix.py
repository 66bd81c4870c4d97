"""The vLLM plugin that keeps base-model tokens off the last LoRA slot on CPU (vllm#48421); the
live check, with every slot filled, is in `test_candidate_vllm.py`."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
import torch
import vllm.lora.ops.torch_ops.lora_ops as ops
import vllm.lora.punica_wrapper.punica_cpu as punica_cpu
from hypothesis import given, settings
from hypothesis import strategies as st

from reef.engine import cpu_lora_fix as fix

pytestmark = pytest.mark.model_free


def test_plugin_is_registered_for_vllm() -> None:
    plugins = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert plugins.get("reef_cpu_lora_fix") == "reef.engine.cpu_lora_fix:register"


def test_no_lora_tokens_get_no_delta_and_the_rest_is_unchanged() -> None:
    torch.manual_seed(0)
    idx = torch.tensor([0, 3, 2, -1, 1])
    lora = [0, 1, 2, 4]
    x, a = torch.randn(5, 16), torch.randn(4, 1, 8, 16)
    got = torch.zeros(5, 8)
    fix.bgmv_shrink(x, a, got, idx, 0.5)
    want = 0.5 * torch.einsum("bi, boi -> bo", x, a[idx.clamp(min=0)].squeeze(1))
    assert torch.allclose(got[lora], want[lora]) and torch.count_nonzero(got[3]) == 0

    y, b = torch.randn(5, 8), torch.randn(4, 1, 16, 8)
    out = torch.ones(5, 16)
    fix.bgmv_expand(y, b, out, idx, add_inputs=True)
    assert torch.equal(out[3], torch.ones(16)) and not torch.equal(out[0], torch.ones(16))
    out = torch.ones(5, 20)
    fix.bgmv_expand_slice(y, b, out, idx, 2, 16, add_inputs=False)
    assert torch.equal(out[3, 2:18], torch.zeros(16)) and torch.equal(out[3, :2], torch.ones(2))


def test_register_mends_the_ops_vllm_cpu_uses() -> None:
    fix.register()
    fix.register()  # vLLM may load plugins more than once per process
    assert not fix.leaks_last_slot(ops.bgmv_shrink)
    assert not fix.leaks_last_slot(punica_cpu.bgmv_shrink)
    # The sgmv (prefill) ops delegate to the module's bgmv ones.
    out = torch.zeros(2, 1)
    ops.sgmv_shrink(torch.ones(2, 1), torch.ones(2, 1, 1, 1), out, torch.tensor([0, 2]), torch.tensor([2]),
                    torch.tensor([-1]), 1, 2, 2, 1.0)
    assert torch.count_nonzero(out) == 0


def _per_token(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """vLLM's per-token gather, with base tokens (index -1) masked: what the grouped ops must equal."""
    selected = weights[indices.clamp(min=0)]
    if selected.dim() == 4:
        selected = selected.squeeze(dim=1)
    selected = selected.masked_fill((indices < 0).view(-1, 1, 1), 0)
    return torch.einsum("bi, boi -> bo", inputs, selected)


@pytest.mark.parametrize("idx", [[-1, -1, -1], [2, 2, 2], [1, -1, 3], [0, 3, 0], [-1], [1]])
def test_grouped_ops_equal_the_per_token_gather(idx: list[int]) -> None:
    torch.manual_seed(1)
    ind = torch.tensor(idx)
    n = len(idx)
    x, a = torch.randn(n, 16), torch.randn(4, 1, 8, 16)
    got = torch.full((n, 8), 7.0)
    fix.bgmv_shrink(x, a, got, ind, 0.5)
    assert torch.allclose(got, 0.5 * _per_token(x, a, ind), atol=1e-5)

    y, b = torch.randn(n, 8), torch.randn(4, 1, 16, 8)
    for add in (True, False):
        out = torch.ones(n, 16)
        fix.bgmv_expand(y, b, out, ind, add_inputs=add)
        assert torch.allclose(out, (1.0 if add else 0.0) + _per_token(y, b, ind), atol=1e-5)
        out = torch.ones(n, 20)
        fix.bgmv_expand_slice(y, b, out, ind, 2, 16, add_inputs=add)
        assert torch.allclose(out[:, 2:18], (1.0 if add else 0.0) + _per_token(y, b, ind), atol=1e-5)
        assert torch.equal(out[:, :2], torch.ones(n, 2)) and torch.equal(out[:, 18:], torch.ones(n, 2))


@settings(max_examples=150, deadline=None)
@given(idx=st.lists(st.integers(-1, 3), min_size=1, max_size=10), scaling=st.floats(0.1, 2.0),
       pad=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_grouped_ops_equal_the_per_token_gather_for_any_layout(idx: list[int], scaling: float, pad: int,
                                                               seed: int) -> None:
    """Any mix of slots, contiguous or interleaved, base rows or none, outputs wider than the
    adapter (padding), a cached layout seen again: the same as the per-token gather."""
    torch.manual_seed(seed)
    ind, n = torch.tensor(idx), len(idx)
    x, a = torch.randn(n, 16), torch.randn(4, 1, 8, 16)
    for _ in range(2):  # the second call takes the layout from the cache
        got = torch.full((n, 8 + pad), float("nan"))
        fix.bgmv_shrink(x, a, got, ind, scaling)
        assert torch.allclose(got[:, :8], scaling * _per_token(x, a, ind), atol=1e-5)
        assert got[:, 8:].isnan().all(), "columns past the adapter's rank are not the op's"

    y, b = torch.randn(n, 8), torch.randn(4, 1, 16, 8)
    for add in (True, False):
        start = torch.randn(n, 16 + pad)
        out = start.clone()
        fix.bgmv_expand(y, b, out, ind, add_inputs=add)
        assert torch.allclose(out[:, :16], (start[:, :16] if add else 0.0) + _per_token(y, b, ind), atol=1e-5)
        assert torch.equal(out[:, 16:], start[:, 16:])
        out = start.clone()
        fix.bgmv_expand_slice(y, b[:, :, : 16 - pad], out, ind, pad, 16 - pad, add_inputs=add)
        want = (start[:, pad:16] if add else 0.0) + _per_token(y, b[:, :, : 16 - pad], ind)
        assert torch.allclose(out[:, pad:16], want, atol=1e-5)
        assert torch.equal(out[:, :pad], start[:, :pad]) and torch.equal(out[:, 16:], start[:, 16:])


def test_one_index_over_several_rows_broadcasts_the_first_row_as_vllm_does() -> None:
    """vLLM's expand with a single index and several output rows adds row 0's delta to every row."""
    torch.manual_seed(2)
    y, b = torch.randn(3, 8), torch.randn(4, 1, 16, 8)
    start = torch.randn(3, 16)
    out = start.clone()
    fix.bgmv_expand(y, b, out, torch.tensor([2]), add_inputs=True)
    assert torch.allclose(out, start + (y[:1] @ b[2, 0].T), atol=1e-5)
