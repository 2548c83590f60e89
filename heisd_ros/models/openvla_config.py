"""The architecture of an OpenVLA checkpoint, read from its config.json (docs/design.md §3).

The fields are those the published Prismatic/OpenVLA configuration saves: `vision_backbone_id`,
`use_fused_vision_backbone`, `timm_model_ids`, `image_sizes`, `timm_override_act_layers`,
`arch_specifier`, `image_resize_strategy`, `text_config`, `pad_to_multiple_of`, `n_action_bins`
(and `norm_stats`, read by `heisd_ros.models.openvla`). A config that names a model class in
`auto_map` is read as data like any other: nothing it names is imported.

A timm model id stands for a ViT architecture; the towers are built from the table below (the
widths timm gives those ids), so no timm install and no remote code is needed. One field is our
own: `timm_model_kwargs` (one mapping per tower, e.g. `{"embed_dim": 32, "depth": 3}`), the
keyword arguments a test checkpoint would pass to `timm.create_model`; published checkpoints
do not have it and get the table's widths.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from heisd_ros.core.errors import ModelLoadError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
HALF = (0.5, 0.5, 0.5)

VISION_BACKBONES: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {
    "dinov2-vit-l": (("vit_large_patch14_reg4_dinov2.lvd142m",), (224,)),
    "siglip-vit-so400m": (("vit_so400m_patch14_siglip_224",), (224,)),
    "siglip-vit-so400m-384px": (("vit_so400m_patch14_siglip_384",), (384,)),
    "dinosiglip-vit-so-224px": (("vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224"), (224, 224)),
    "dinosiglip-vit-so-384px": (("vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_384"), (384, 384)),
}
"""Prismatic vision backbone ids -> (timm model ids, image sizes): what the published config
derives from `vision_backbone_id` when it does not store them itself."""

_DINOV2_L = {"patch_size": 14, "embed_dim": 1024, "depth": 24, "num_heads": 16, "mlp_ratio": 4.0,
             "class_token": True, "reg_tokens": 4, "no_embed_class": True, "layer_scale": True, "attn_pool": False,
             "mean": IMAGENET_MEAN, "std": IMAGENET_STD}
_SIGLIP_SO400M = {"patch_size": 14, "embed_dim": 1152, "depth": 27, "num_heads": 16, "mlp_ratio": 3.7362,
                  "class_token": False, "reg_tokens": 0, "no_embed_class": False, "layer_scale": False,
                  "attn_pool": True, "mean": HALF, "std": HALF}
TOWER_FAMILIES = {
    "vit_large_patch14_reg4_dinov2": _DINOV2_L,
    "vit_so400m_patch14_siglip_224": _SIGLIP_SO400M,
    "vit_so400m_patch14_siglip_384": _SIGLIP_SO400M,
}
"""timm architecture names (a model id without its pretrained tag) -> ViT hyperparameters and the
input normalisation of their pretrained weights (timm's data config for them)."""
TOWER_OVERRIDES = ("embed_dim", "depth", "num_heads", "mlp_ratio", "patch_size")
ACT_LAYERS = ("gelu", "gelu_tanh", "quick_gelu")
RESIZE_STRATEGIES = ("resize-naive", "letterbox", "resize-crop")
PROJECTORS = {"fused-gelu-mlp": 3, "gelu-mlp": 2}
"""arch_specifier suffix -> projector layers (fc1..fc3 with GELUs between)."""

LLAMA2_DEFAULTS = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "silu", "max_position_embeddings": 2048,
    "initializer_range": 0.02, "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2,
    "tie_word_embeddings": False, "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False,
    "attention_dropout": 0.0, "mlp_bias": False,
}
"""LlamaConfig defaults (LLaMA-2-7B shapes) of the transformers release OpenVLA was saved with: a
saved `text_config` holds only the fields that differ from them, so they are filled in here rather
than taken from whatever transformers is installed."""
_TEXT_METADATA = ("model_type", "torch_dtype", "dtype", "architectures", "_name_or_path", "transformers_version",
                  "attn_implementation", "_attn_implementation")
SUPPORTED_BINS = 256


@dataclass(frozen=True)
class TowerSpec:
    """One ViT tower: its architecture, its input size and its input normalisation."""

    timm_id: str
    image_size: int
    patch_size: int
    embed_dim: int
    depth: int
    num_heads: int
    mlp_ratio: float
    class_token: bool
    reg_tokens: int
    no_embed_class: bool
    """Position embeddings cover the patches only (prefix tokens are added after them)."""
    layer_scale: bool
    attn_pool: bool
    """The tower carries timm's attention-pool head (never run: features come from a block)."""
    act: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @property
    def prefix_tokens(self) -> int:
        return int(self.class_token) + self.reg_tokens

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def mlp_hidden(self) -> int:
        return int(self.embed_dim * self.mlp_ratio)


@dataclass(frozen=True)
class OpenVLAArch:
    """What config.json says about the model (towers primary first, projector, language model)."""

    towers: tuple[TowerSpec, ...]
    projector_layers: int
    text: dict
    """LlamaConfig keyword arguments (LLAMA2_DEFAULTS with the saved text_config over them)."""
    resize_strategy: str
    pad_to_multiple_of: int
    n_action_bins: int

    @property
    def fused(self) -> bool:
        return len(self.towers) == 2

    @property
    def vision_dim(self) -> int:
        return sum(t.embed_dim for t in self.towers)

    @property
    def image_size(self) -> int:
        return self.towers[0].image_size

    @property
    def patch_tokens(self) -> int:
        return self.towers[0].grid ** 2

    @property
    def action_vocab(self) -> int:
        """The unpadded vocabulary whose last `n_action_bins` ids are the action tokens (the
        published code subtracts `pad_to_multiple_of` from the padded embedding rows)."""
        return int(self.text["vocab_size"]) - self.pad_to_multiple_of


def _bad(path: Path, message: str) -> ModelLoadError:
    return ModelLoadError(f"{path}: {message}")


def _tower_lists(meta: dict, path: Path) -> tuple[list, list, list, list]:
    """(timm ids, image sizes, activation overrides, timm kwargs), one entry per tower."""
    backbone = meta.get("vision_backbone_id")
    derived = VISION_BACKBONES.get(backbone)
    ids = meta.get("timm_model_ids") or (derived and list(derived[0]))
    sizes = meta.get("image_sizes") or (derived and list(derived[1]))
    if not ids or not sizes:
        raise _bad(path, f"no timm_model_ids / image_sizes, and vision_backbone_id {backbone!r} is not one of "
                         f"{sorted(VISION_BACKBONES)}")
    acts = meta.get("timm_override_act_layers") or [None] * len(ids)
    kwargs = meta.get("timm_model_kwargs") or [{}] * len(ids)
    if not (len(ids) == len(sizes) == len(acts) == len(kwargs)) or len(ids) not in (1, 2):
        raise _bad(path, "timm_model_ids, image_sizes, timm_override_act_layers (and timm_model_kwargs) must "
                         f"list the same 1 or 2 towers, got {ids}, {sizes}, {acts}")
    return list(ids), list(sizes), list(acts), list(kwargs)


def _tower(timm_id, size, act, kwargs, path: Path) -> TowerSpec:
    family = TOWER_FAMILIES.get(str(timm_id).split(".")[0])
    if family is None:
        raise _bad(path, f"timm model {timm_id!r} is not supported; known: {sorted(TOWER_FAMILIES)}")
    if act is not None and act not in ACT_LAYERS:
        raise _bad(path, f"timm_override_act_layers entry {act!r} is not one of {list(ACT_LAYERS)} (or null)")
    if not isinstance(kwargs, dict) or set(kwargs) - set(TOWER_OVERRIDES):
        raise _bad(path, f"timm_model_kwargs entry {kwargs!r} may only set {list(TOWER_OVERRIDES)}")
    spec = TowerSpec(timm_id=str(timm_id), image_size=int(size), act=act or "gelu", **family)
    spec = replace(spec, **kwargs)
    if spec.embed_dim % spec.num_heads or spec.image_size % spec.patch_size or spec.depth < 2:
        raise _bad(path, f"tower {timm_id}: embed_dim {spec.embed_dim} must divide by num_heads {spec.num_heads}, "
                         f"image size {spec.image_size} by patch size {spec.patch_size}, and depth must be >= 2")
    return spec


def _projector_layers(meta: dict, fused: bool, path: Path) -> int:
    arch = str(meta.get("arch_specifier", "no-align+fused-gelu-mlp" if fused else "no-align+gelu-mlp"))
    layers = next((n for suffix, n in PROJECTORS.items() if arch.endswith(suffix)), None)
    if layers is None:
        raise _bad(path, f"arch_specifier {arch!r} is not supported (projectors: {sorted(PROJECTORS)})")
    if (layers == 3) != fused:
        raise _bad(path, f"arch_specifier {arch!r} does not match use_fused_vision_backbone = {fused}")
    return layers


def _text_config(meta: dict, path: Path) -> dict:
    text = meta.get("text_config") or {}
    if not isinstance(text, dict):
        raise _bad(path, "text_config must be a mapping")
    if text.get("model_type", "llama") != "llama":
        raise _bad(path, f"text_config model_type {text['model_type']!r} is not supported (LLaMA only)")
    merged = dict(LLAMA2_DEFAULTS)
    merged.update({k: v for k, v in text.items() if k not in _TEXT_METADATA})
    if merged.get("pad_token_id") is None and meta.get("pad_token_id") is not None:
        merged["pad_token_id"] = meta["pad_token_id"]
    from huggingface_hub.errors import StrictDataclassError
    from transformers import LlamaConfig

    try:  # the LLaMA config validates field types and head divisibility
        LlamaConfig(**merged)
    except (StrictDataclassError, TypeError, ValueError) as err:
        raise _bad(path, f"invalid text_config: {err}") from err
    return merged


def parse_config(meta: dict, path: Path) -> OpenVLAArch:
    """The architecture of config.json's content `meta` (read from `path`, named in errors)."""
    if meta.get("model_type") != "openvla":
        raise _bad(path, f"model_type {meta.get('model_type')!r} is not 'openvla'")
    ids, sizes, acts, kwargs = _tower_lists(meta, path)
    backbone = str(meta.get("vision_backbone_id", ""))
    fused = meta.get("use_fused_vision_backbone")
    fused = bool(fused) if fused is not None else backbone.startswith(("dinoclip", "dinosiglip"))
    if fused != (len(ids) == 2):
        raise _bad(path, f"use_fused_vision_backbone = {fused} but {len(ids)} timm_model_ids")
    towers = tuple(_tower(*entry, path) for entry in zip(ids, sizes, acts, kwargs))
    if len({(t.image_size, t.grid) for t in towers}) != 1:
        raise _bad(path, "fused towers must share image size and patch grid")
    strategy = meta.get("image_resize_strategy", "letterbox")
    if strategy not in RESIZE_STRATEGIES:
        raise _bad(path, f"image_resize_strategy {strategy!r} is not one of {list(RESIZE_STRATEGIES)}")
    arch = OpenVLAArch(towers=towers, projector_layers=_projector_layers(meta, fused, path),
                       text=_text_config(meta, path), resize_strategy=strategy,
                       pad_to_multiple_of=int(meta.get("pad_to_multiple_of", 64)),
                       n_action_bins=int(meta.get("n_action_bins", SUPPORTED_BINS)))
    if arch.n_action_bins != SUPPORTED_BINS:
        raise _bad(path, f"n_action_bins {arch.n_action_bins}: this version decodes {SUPPORTED_BINS} bins")
    if not SUPPORTED_BINS < arch.action_vocab <= int(arch.text["vocab_size"]):
        raise _bad(path, f"text_config vocab_size {arch.text['vocab_size']} less pad_to_multiple_of "
                         f"{arch.pad_to_multiple_of} leaves no room for {SUPPORTED_BINS} action tokens")
    return arch
