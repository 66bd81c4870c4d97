"""The vLLM plugin that keeps base-model tokens off the last LoRA slot on CPU (vllm#48421); the
live check, with every slot filled, is in `test_candidate_vllm.py`."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
import torch
import vllm.lora.ops.torch_ops.lora_ops as ops
import vllm.lora.punica_wrapper.punica_cpu as punica_cpu

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
