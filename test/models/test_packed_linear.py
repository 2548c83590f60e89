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
    assert ModelSpec.of_decoder("m", DecoderConfig()).llm_linear == "onednn"
    assert ModelSpec.of_decoder("m", DecoderConfig(llm_linear="torch")).llm_linear == "torch"
    assert ModelSpec("m").llm_linear == "torch"  # tools that embed or train keep torch's kernel
    with pytest.raises(ConfigError, match="llm_linear"):
        DecoderConfig(llm_linear="mkl")
    with pytest.raises(ConfigError, match="llm_linear"):
        ModelSpec("m", llm_linear="mkl")
