"""The LLM's linear layers on oneDNN-packed weights (`decoder.llm_linear` 'onednn')."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from heisd_ros.core.config import DecoderConfig
from heisd_ros.core.errors import ConfigError
from heisd_ros.models.loader import tiny_vla
from heisd_ros.models.packed_linear import (
    PackedLinear,
    onednn_linear_available,
    pack_decoder_layers,
)
from heisd_ros.models.spec import ModelSpec

needs_onednn = pytest.mark.skipif(not onednn_linear_available(), reason="this torch build has no oneDNN linear")


@needs_onednn
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 96), (2, 96), (13, 96), (48, 96), (1, 5, 96), (1, 13, 96)])
def test_packed_linear_matches_torch_linear(bias, shape):
    torch.manual_seed(0)
    linear = nn.Linear(96, 200, bias=bias).eval()
    packed = PackedLinear(linear)
    x = torch.randn(*shape)
    with torch.inference_mode():
        got, want = packed(x), linear(x)
    assert got.shape == want.shape == (*shape[:-1], 200)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_training_and_in_place_writes_use_the_current_weights():
    torch.manual_seed(0)
    linear = nn.Linear(32, 16)
    packed = PackedLinear(linear)
    x = torch.randn(4, 32, requires_grad=True)
    packed(x).sum().backward()  # autograd runs the dense path
    assert linear.weight.grad is not None and x.grad is not None
    with torch.no_grad():
        linear.weight.mul_(-2.0)  # a fine-tune's optimiser step writes in place
    with torch.inference_mode():
        torch.testing.assert_close(packed(x.detach()), nn.functional.linear(x.detach(), linear.weight, linear.bias),
                                   rtol=1e-5, atol=1e-5)
    assert set(packed.state_dict()) == {"weight", "bias"}  # the packed copy is not module state


@needs_onednn
def test_only_the_decoder_layers_of_a_float32_cpu_model_are_packed():
    vla = tiny_vla(seed=0)
    keys = set(vla.state_dict())
    layers = vla.language_model.config.num_hidden_layers
    assert pack_decoder_layers(vla.language_model, "cpu", "float32") == 7 * layers  # q k v o gate up down
    assert set(vla.state_dict()) == keys
    assert type(vla.language_model.lm_head) is nn.Linear
    assert pack_decoder_layers(tiny_vla(seed=0).language_model, "cpu", "bfloat16") == 0
    assert pack_decoder_layers(tiny_vla(seed=0).language_model, "cuda:0", "float32") == 0


@needs_onednn
def test_a_model_too_large_for_a_second_copy_keeps_torchs_kernel(monkeypatch):
    from heisd_ros.models import packed_linear

    monkeypatch.setattr(packed_linear, "MAX_PACKED_BYTES", 1000)
    lm = tiny_vla(seed=0).language_model
    assert pack_decoder_layers(lm, "cpu", "float32") == 0
    assert not any(isinstance(m, PackedLinear) for m in lm.modules())


def test_the_decoder_config_chooses_the_kernel_the_model_is_loaded_with():
    assert ModelSpec.of_decoder("m", DecoderConfig()).llm_linear == "auto"
    assert ModelSpec.of_decoder("m", DecoderConfig(llm_linear="onednn")).llm_linear == "onednn"
    assert ModelSpec.of_decoder("m", DecoderConfig(llm_linear="torch")).llm_linear == "torch"
    assert ModelSpec("m").llm_linear == "torch"  # tools that embed or train keep torch's kernel
    with pytest.raises(ConfigError, match="llm_linear"):
        DecoderConfig(llm_linear="mkl")
    with pytest.raises(ConfigError, match="llm_linear"):
        ModelSpec("m", llm_linear="mkl")


@needs_onednn
@pytest.mark.parametrize("margin, packs", [(0.0, False), (1e9, True)])
def test_auto_packs_only_where_onednn_is_measured_faster(monkeypatch, margin, packs):
    """'auto' times both kernels on one decoder layer's weights and packs only when oneDNN beats
    torch's time by the margin: a margin no timing can meet keeps torch's kernel, one every timing
    meets packs; the decision and its timings are kept for the run's log."""
    from heisd_ros.core import onednn

    monkeypatch.setattr(onednn, "_decisions", {})
    monkeypatch.setattr(onednn, "AUTO_MARGIN", margin)
    lm = tiny_vla(seed=0).language_model
    n = pack_decoder_layers(lm, "cpu", "float32", "auto")
    packed = [m for m in lm.modules() if isinstance(m, PackedLinear)]
    assert (n > 0) == packs and bool(packed) == packs
    assert all(m.min_rows == min(onednn.AUTO_ROWS) for m in packed)
    (made,) = onednn.decisions()
    assert made["min_rows"] == (min(onednn.AUTO_ROWS) if packs else None)
    assert all(t > 0 for pair in made["us_torch_onednn"].values() for t in pair)
    pack_decoder_layers(tiny_vla(seed=0).language_model, "cpu", "float32", "auto")
    assert len(onednn.decisions()) == 1  # measured once per process and set of shapes


@needs_onednn
def test_auto_packs_from_the_fewest_rows_that_gain_with_every_larger_count(monkeypatch):
    """Timings where oneDNN wins from 8 rows on (not at 2) give 8; a loss at the largest count
    keeps torch's kernel whatever the smaller counts say (the clock is scripted: torch's loop takes
    2 units a repetition, oneDNN's 1 where it wins and 3 where it loses)."""
    from heisd_ros.core import onednn

    weights = [torch.randn(16, 8)]
    for wins, want in (({2: False, 8: True, 32: True}, 8), ({2: True, 8: True, 32: False}, None)):
        monkeypatch.setattr(onednn, "_decisions", {})
        durations = []
        for rows in onednn.AUTO_ROWS:
            durations += [2.0, 1.0 if wins[rows] else 3.0] * (15 + 2)
        ticks = iter(np_cumsum_with_starts(durations))
        monkeypatch.setattr(onednn.time, "perf_counter", ticks.__next__)
        assert onednn.packed_min_rows(weights) == want


def np_cumsum_with_starts(durations: list[float]) -> list[float]:
    """perf_counter readings t0, t1, t2 per repetition for consecutive (torch, oneDNN) durations."""
    out, now = [], 0.0
    for i in range(0, len(durations), 2):
        out += [now, now + durations[i], now + durations[i] + durations[i + 1]]
        now += durations[i] + durations[i + 1]
    return out


def test_auto_never_measures_weights_that_cannot_be_packed(monkeypatch):
    from heisd_ros.core import onednn

    monkeypatch.setattr(onednn, "_decisions", {})
    assert onednn.packed_min_rows([torch.zeros(8, 8, dtype=torch.bfloat16)]) is None
    assert onednn.packed_min_rows([]) is None
    assert onednn.min_rows_for("torch", [torch.zeros(8, 8)]) is None
    assert onednn.decisions() == []
