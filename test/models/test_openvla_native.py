"""The native OpenVLA loader on random-weight checkpoints in the published layout.

Pinned: every tensor of the checkpoint is consumed and checked (a missing, extra or reshaped
tensor names itself and its file); the loaded model's logits equal an independent composition
written here (a functional ViT over the raw tensors, transformers' LlamaForCausalLM, PIL, the
`tokenizers` library); a checkpoint whose config names remote code loads without running any of it.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from heisd_ros.core.errors import ModelLoadError, UnknownTaskError
from heisd_ros.models.openvla import load_openvla
from heisd_ros.models.openvla_processor import (
    ImageTransform,
    center_crop_resize,
    read_tower_inputs,
)
from heisd_ros.models.openvla_random import (
    PRESETS,
    RandomCheckpoint,
    write_random_checkpoint,
)

REPO = Path(__file__).resolve().parents[2]
INDEX = "model.safetensors.index.json"
INSTRUCTION = "Pick up the red bowl."
VARIANTS = {
    "fused": PRESETS["tiny"],
    "dinov2": RandomCheckpoint(towers="dinov2", image_size=28, vit_widths=(40,), vit_depth=3, vit_heads=2, llm_layers=2,
                               llm_width=64, llm_intermediate=172, llm_heads=4, dtype="float32", shard_mb=1.0, seed=1),
    "siglip": RandomCheckpoint(towers="siglip", image_size=42, vit_widths=(36,), vit_depth=2, vit_heads=3, llm_layers=1,
                               llm_width=48, llm_intermediate=100, llm_heads=2, dtype="float32", shard_mb=64.0, seed=2,
                               resize_strategy="letterbox"),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("openvla")
    return {name: Path(write_random_checkpoint(root / name, spec)["directory"]) for name, spec in VARIANTS.items()}


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(directory.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


# -- every tensor consumed ------------------------------------------------------------------------

def test_every_checkpoint_tensor_becomes_a_parameter_with_its_value(checkpoints):
    for name, directory in checkpoints.items():
        vla = load_openvla(directory, dtype="float32", unnorm_key="bridge_orig")
        params = dict(vla.model.named_parameters())
        stored = _tensors(directory)
        assert set(params) == set(stored), name
        assert all(torch.equal(params[k], v) for k, v in stored.items()), name
    # The tensors OpenVLA carries but never runs are there too: the last block, the final norm, SigLIP's pool.
    assert {"vision_backbone.featurizer.blocks.2.mlp.fc2.weight", "vision_backbone.featurizer.norm.weight",
            "vision_backbone.fused_featurizer.attn_pool.latent", "projector.fc3.weight",
            "language_model.lm_head.weight"} <= set(_tensors(checkpoints["fused"]))


def _edit_shard(directory: Path, key: str, edit) -> str:
    """Apply `edit(tensors)` to the shard holding `key`; returns that shard's name."""
    from safetensors.torch import load_file, save_file

    index = json.loads((directory / INDEX).read_text())
    shard = index["weight_map"][key]
    tensors = load_file(str(directory / shard))
    edit(tensors, index["weight_map"], shard)
    save_file(tensors, str(directory / shard))
    (directory / INDEX).write_text(json.dumps(index))
    return shard


KEYS = ("vision_backbone.featurizer.reg_token", "vision_backbone.featurizer.blocks.2.ls2.scale_factor",
        "vision_backbone.fused_featurizer.attn_pool.mlp.fc1.bias", "projector.fc3.bias",
        "language_model.model.layers.1.self_attn.k_proj.weight", "language_model.lm_head.weight")


@pytest.mark.parametrize("key", KEYS)
def test_a_missing_tensor_is_named_with_its_file(checkpoints, tmp_path, key):
    d = _copy(checkpoints["fused"], tmp_path / "c")

    def drop(tensors, weight_map, shard):
        del tensors[key]
        del weight_map[key]

    _edit_shard(d, key, drop)
    with pytest.raises(ModelLoadError, match=rf"{INDEX}: missing tensor {key}"):
        load_openvla(d, dtype="float32")
    # The same tensor gone from its shard but still in the index: the index names it and the shard.
    d2 = _copy(checkpoints["fused"], tmp_path / "c2")
    shard = _edit_shard(d2, key, lambda t, w, s: t.pop(key))
    with pytest.raises(ModelLoadError, match=rf"lists tensor {key} in {shard}, which does not hold it"):
        load_openvla(d2, dtype="float32")


@pytest.mark.parametrize("key", KEYS)
def test_an_unexpected_or_reshaped_tensor_is_named_with_its_file(checkpoints, tmp_path, key):
    d = _copy(checkpoints["fused"], tmp_path / "extra")
    extra = key.rsplit(".", 1)[0] + ".surplus"

    def add(tensors, weight_map, shard):
        tensors[extra] = torch.zeros(3)
        weight_map[extra] = shard

    shard = _edit_shard(d, key, add)
    with pytest.raises(ModelLoadError, match=rf"{shard}: unexpected tensor {extra}"):
        load_openvla(d, dtype="float32")
    d2 = _copy(checkpoints["fused"], tmp_path / "shape")

    def reshape(tensors, weight_map, shard):
        tensors[key] = torch.cat([tensors[key].flatten(), torch.zeros(1)])

    shard = _edit_shard(d2, key, reshape)
    with pytest.raises(ModelLoadError, match=rf"{shard}: tensor {key} has shape"):
        load_openvla(d2, dtype="float32")


def test_a_single_weights_file_without_index_loads(checkpoints, tmp_path):
    from safetensors.torch import save_file

    d = _copy(checkpoints["fused"], tmp_path / "single")
    stored = _tensors(d)
    for f in list(d.glob("*.safetensors")) + [d / INDEX]:
        f.unlink()
    save_file(stored, str(d / "model.safetensors"))
    vla = load_openvla(d, dtype="float32")
    assert torch.equal(vla.action_head_weight(), stored["language_model.lm_head.weight"][31744:32000])


def test_index_entries_must_stay_inside_the_checkpoint(checkpoints, tmp_path):
    d = _copy(checkpoints["fused"], tmp_path / "c")
    index = json.loads((d / INDEX).read_text())
    index["weight_map"]["projector.fc1.bias"] = "../elsewhere.safetensors"
    (d / INDEX).write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="projector.fc1.bias points at"):
        load_openvla(d, dtype="float32")


@pytest.mark.parametrize("field, value, message", [
    ("timm_model_ids", ["vit_huge_patch14_clip_224", "vit_so400m_patch14_siglip_224"], "is not supported; known"),
    ("arch_specifier", "no-align+gelu-mlp", "does not match use_fused_vision_backbone"),
    ("image_resize_strategy", "stretch", "is not one of"),
    ("n_action_bins", 128, "decodes 256 bins"),
    ("text_config", {"model_type": "llama", "vocab_size": 32064, "hidden_size": 30, "num_attention_heads": 4},
     "invalid text_config"),
])
def test_a_config_it_cannot_build_is_named(checkpoints, tmp_path, field, value, message):
    d = _copy(checkpoints["fused"], tmp_path / "c")
    config = json.loads((d / "config.json").read_text())
    config[field] = value
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=rf"config.json: .*{message}"):
        load_openvla(d, dtype="float32")


# -- an independent composition -------------------------------------------------------------------

TOWER_FACTS = {  # what timm builds for these ids: (class token, registers, positions skip prefix, layer scale)
    "vit_large_patch14_reg4_dinov2.lvd142m": (True, 4, True, True, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "vit_so400m_patch14_siglip_224": (False, 0, False, False, (0.5,) * 3, (0.5,) * 3),
}


def _ref_tower(sd: dict, p: str, x: torch.Tensor, heads: int, facts) -> torch.Tensor:
    cls, regs, skip_prefix, scaled = facts[:4]

    def w(k):
        return sd[p + k]

    patch = w("patch_embed.proj.weight").shape[-1]
    x = F.conv2d(x, w("patch_embed.proj.weight"), w("patch_embed.proj.bias"), stride=patch).flatten(2).transpose(1, 2)
    b, _, d = x.shape
    prefix = ([w("cls_token").expand(b, 1, d)] if cls else []) + ([w("reg_token").expand(b, regs, d)] if regs else [])
    x = torch.cat(prefix + [x + w("pos_embed")], 1) if skip_prefix else torch.cat(prefix + [x], 1) + w("pos_embed")
    depth = 1 + max(int(k[len(p):].split(".")[1]) for k in sd if k.startswith(p + "blocks."))
    for i in range(depth - 1):  # OpenVLA reads the second-to-last block
        q = f"blocks.{i}."
        h = F.layer_norm(x, (d,), w(q + "norm1.weight"), w(q + "norm1.bias"), 1e-6)
        qkv = F.linear(h, w(q + "attn.qkv.weight"), w(q + "attn.qkv.bias")).reshape(b, -1, 3, heads, d // heads)
        qq, kk, vv = qkv.permute(2, 0, 3, 1, 4)
        att = torch.softmax(qq @ kk.transpose(-1, -2) / math.sqrt(d // heads), -1) @ vv
        h = F.linear(att.transpose(1, 2).reshape(b, -1, d), w(q + "attn.proj.weight"), w(q + "attn.proj.bias"))
        x = x + (h * w(q + "ls1.scale_factor") if scaled else h)
        h = F.layer_norm(x, (d,), w(q + "norm2.weight"), w(q + "norm2.bias"), 1e-6)
        h = F.linear(F.gelu(F.linear(h, w(q + "mlp.fc1.weight"), w(q + "mlp.fc1.bias"))), w(q + "mlp.fc2.weight"),
                     w(q + "mlp.fc2.bias"))
        x = x + (h * w(q + "ls2.scale_factor") if scaled else h)
    return x[:, int(cls) + regs:]


def _ref_pixels(img: np.ndarray, size: int, facts, strategy: str) -> torch.Tensor:
    from PIL import Image

    pil = Image.fromarray(img)
    if strategy == "letterbox":  # pad to a square with the (last tower's) mean colour
        side = max(pil.size)
        square = Image.new("RGB", (side, side), tuple(int(m * 255) for m in facts[4]))
        square.paste(pil, ((side - pil.size[0]) // 2, (side - pil.size[1]) // 2))
        pil = square
    x = np.asarray(pil.resize((size, size), Image.Resampling.BICUBIC), np.float32) / np.float32(255)
    x = (x - np.asarray(facts[4], np.float32)) / np.asarray(facts[5], np.float32)
    return torch.from_numpy(x).permute(2, 0, 1)[None]


def _reference_logits(directory: Path, img: np.ndarray, prompt: str) -> tuple[torch.Tensor, list[int]]:
    from tokenizers import Tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    config = json.loads((directory / "config.json").read_text())
    sd = _tensors(directory)
    feats = []
    for i, (tid, size) in enumerate(zip(config["timm_model_ids"], config["image_sizes"])):
        facts = TOWER_FACTS[tid]
        heads = config["timm_model_kwargs"][i]["num_heads"]
        prefix = "vision_backbone.featurizer." if i == 0 else "vision_backbone.fused_featurizer."
        pixels = _ref_pixels(img, size, facts, config["image_resize_strategy"])
        feats.append(_ref_tower(sd, prefix, pixels, heads, facts))
    x = torch.cat(feats, dim=2)[0]
    n_fc = 3 if config["use_fused_vision_backbone"] else 2
    for j in range(1, n_fc + 1):
        x = F.linear(x, sd[f"projector.fc{j}.weight"], sd[f"projector.fc{j}.bias"])
        x = F.gelu(x) if j < n_fc else x
    text = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
            "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 10000.0}
    text.update({k: v for k, v in config["text_config"].items() if k not in ("model_type", "torch_dtype")})
    lm = LlamaForCausalLM(LlamaConfig(**text, attn_implementation="eager")).eval()
    lm.load_state_dict({k[len("language_model."):]: v for k, v in sd.items() if k.startswith("language_model.")})
    ids = Tokenizer.from_file(str(directory / "tokenizer.json")).encode(prompt).ids + [29871]
    emb = lm.get_input_embeddings()(torch.tensor(ids))
    with torch.no_grad():
        return lm(inputs_embeds=torch.cat([emb[:1], x, emb[1:]])[None]).logits[0], ids


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_equal_an_independent_composition(checkpoints, variant):
    directory = checkpoints[variant]
    vla = load_openvla(directory, dtype="float32", unnorm_key="bridge_orig")
    img = np.random.default_rng(5).integers(0, 256, (48, 64, 3), dtype=np.uint8)  # siglip: letterboxed
    ref, ids = _reference_logits(directory, img, "In: What action should the robot take to pick up the red bowl?\nOut:")
    with torch.inference_mode():
        visual = vla.projector(vla.vision_backbone(vla.preprocess([img]))[0])
        logits = vla.language_model(inputs_embeds=vla.prompt_embeds(INSTRUCTION, visual)).logits[0]
    assert list(vla._prompt_ids(INSTRUCTION)) == ids and ids[0] == 1 and ids[-1] == 29871
    assert logits.shape == (len(ids) + vla.arch.patch_tokens, 32064)
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)
    assert vla.prompt_length(INSTRUCTION) == logits.shape[0]


def test_text_config_is_a_diff_against_llama2_and_actions_sit_below_the_padding(checkpoints):
    vla = load_openvla(checkpoints["fused"], dtype="float32", unnorm_key="bridge_orig")
    cfg = vla.language_model.config
    assert "rms_norm_eps" not in json.loads((checkpoints["fused"] / "config.json").read_text())["text_config"]
    assert (cfg.rms_norm_eps, cfg.max_position_embeddings, cfg.vocab_size) == (1e-6, 2048, 32064)
    assert vla.get_input_embeddings().num_embeddings == 32064
    tok = vla.action_tokenizer
    assert (tok.first_token_id, tok.vocab_size) == (31744, 32000)
    assert vla.query_dim == 32 + 48 and vla.input_hw == (56, 56) and vla.max_positions == 2048
    assert vla.instruction_tokens(INSTRUCTION) == 5  # '▁pick ▁up ▁the ▁red ▁bowl'


def test_bfloat16_load_casts_every_parameter(checkpoints):
    vla = load_openvla(checkpoints["fused"], dtype="bfloat16", unnorm_key="bridge_orig")
    assert {p.dtype for p in vla.model.parameters()} == {torch.bfloat16}
    img = np.zeros((64, 64, 3), np.uint8)
    with torch.inference_mode():
        assert vla.vision_backbone(vla.preprocess([img])).dtype == torch.bfloat16


def test_unknown_unnorm_key_lists_the_known_ones(checkpoints):
    with pytest.raises(UnknownTaskError, match=r"'nowhere'.*bridge_orig.*libero_spatial_no_noops"):
        load_openvla(checkpoints["fused"], dtype="float32", unnorm_key="nowhere")
    vla = load_openvla(checkpoints["fused"], dtype="float32")
    with pytest.raises(UnknownTaskError, match="give unnorm_key"):
        vla.stats()
    assert vla.stats("libero_spatial_no_noops").q99[0] == pytest.approx(0.02)


# -- no remote code ------------------------------------------------------------------------------

def test_remote_code_named_by_the_checkpoint_is_never_run(checkpoints, tmp_path):
    d = _copy(checkpoints["fused"], tmp_path / "remote")
    marker = tmp_path / "remote-code-ran"
    for module in ("modeling_prismatic", "configuration_prismatic", "processing_prismatic"):
        (d / f"{module}.py").write_text(f"open({str(marker)!r}, 'w').write('{module}')\nraise RuntimeError('ran')\n")
    tok_config = json.loads((d / "tokenizer_config.json").read_text())
    tok_config["auto_map"] = {"AutoTokenizer": ["processing_prismatic.Tok", None]}
    (d / "tokenizer_config.json").write_text(json.dumps(tok_config))
    assert "auto_map" in json.loads((d / "config.json").read_text())
    vla = load_openvla(d, dtype="float32", unnorm_key="bridge_orig")
    assert vla.action_head_weight().shape == (256, 64)
    assert not marker.exists()
    assert not {"modeling_prismatic", "configuration_prismatic", "processing_prismatic"} & set(sys.modules)


def test_nothing_in_the_package_asks_for_remote_code():
    hits = [f"{p.relative_to(REPO)}:{i}" for p in sorted([*(REPO / "heisd_ros").rglob("*.py"), *(REPO / "heisd_libero").rglob("*.py")])
            for i, line in enumerate(p.read_text().splitlines(), 1)
            if "trust_remote_code=True" in line or "get_class_from_dynamic_module" in line]
    assert not hits


# -- images --------------------------------------------------------------------------------------

def test_center_crop_takes_the_middle_ninety_percent_of_the_area():
    ramp = np.tile(np.linspace(0, 255, 101).astype(np.uint8)[None, :, None], (101, 1, 3))
    out = center_crop_resize(ramp)
    assert out.shape == ramp.shape
    side = math.sqrt(0.9)
    assert out[50, 0, 0] == pytest.approx(255 * (1 - side) / 2, abs=1.5)
    assert out[50, -1, 0] == pytest.approx(255 * (1 + side) / 2, abs=1.5)
    flat = np.full((30, 40, 3), 77, np.uint8)
    assert np.array_equal(center_crop_resize(flat), flat)


def test_the_crop_option_crops_before_the_resize(checkpoints):
    d = checkpoints["fused"]
    vla = load_openvla(d, dtype="float32", unnorm_key="bridge_orig", center_crop=True)
    plain = ImageTransform(read_tower_inputs(d, vla.arch), "resize-naive")
    img = np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    assert torch.equal(vla.preprocess([img])[0], plain(center_crop_resize(img)))
    assert not torch.equal(vla.preprocess([img])[0], plain(img))


@pytest.mark.parametrize("strategy", ["resize-crop", "letterbox"])
def test_non_square_frames_keep_their_aspect(checkpoints, strategy):
    d = checkpoints["dinov2"]
    vla = load_openvla(d, dtype="float32")
    transform = ImageTransform(read_tower_inputs(d, vla.arch), strategy)
    wide = np.zeros((20, 40, 3), np.uint8)
    wide[:, :, 0] = 255  # all red
    x = transform(wide)
    assert x.shape == (3, 28, 28)
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    red = (np.array([1.0, 0.0, 0.0]) - mean) / std
    fill = (np.array([int(m * 255) for m in mean]) / 255 - mean) / std
    np.testing.assert_allclose(x[:, 14, 14].numpy(), red, atol=1e-3)
    np.testing.assert_allclose(x[:, 0, 14].numpy(), red if strategy == "resize-crop" else fill, atol=2e-2)
