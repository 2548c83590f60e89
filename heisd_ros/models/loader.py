"""Load VLA checkpoints and their state priors from a local directory (offline; never a hub),
and build tiny test models."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from heisd_ros.core.action_tokenizer import (
    NormStats,
    load_dataset_statistics,
    select_stats,
)
from heisd_ros.core.config import from_dict
from heisd_ros.core.errors import ConfigError, ModelLoadError
from heisd_ros.core.files import read_json
from heisd_ros.core.model_api import VLA
from heisd_ros.models.dtypes import DTYPES
from heisd_ros.models.packed_linear import pack_decoder_layers
from heisd_ros.models.spec import ModelSpec
from heisd_ros.models.state_prior import StatePrior, load_state_prior
from heisd_ros.models.text_tokenizer import HashWordTokenizer, HFTokenizer
from heisd_ros.models.vla import VLAConfig, VLAModel

RETIRED_KEYS = {"proprio_prev_gripper": False, "proprio_gripper_dwell": 0, "proprio_fourier": 0}
"""`heisd_vla` config keys of earlier versions, with the value that meant "off". Checkpoints saved
then carry them; at that value they change nothing and are dropped."""
RETIRED_VISION = ("efficientnet_lite0_ms",)


def _without_retired(section: dict, config_path: Path) -> dict:
    """The `heisd_vla` section without retired keys at their off value; a retired option that is
    switched on is a ModelLoadError (this version cannot run that model)."""
    if not isinstance(section, dict):
        raise ModelLoadError(f"{config_path}: the heisd_vla section must be a mapping")
    out = dict(section)
    for key, off in RETIRED_KEYS.items():
        if key in out and out.pop(key) != off:
            raise ModelLoadError(f"{config_path}: {key} = {section[key]!r} was retired in this version; "
                                 "this model needs an earlier heisd_ros")
    if out.get("vision") in RETIRED_VISION:
        raise ModelLoadError(f"{config_path}: vision {out['vision']!r} was retired in this version; "
                             "this model needs an earlier heisd_ros")
    return out


def _text_tokenizer(cfg: VLAConfig, directory: Path | None):
    if cfg.tokenizer == "hash_words":
        return HashWordTokenizer(cfg.hash_text_ids)
    if directory is None:
        raise ModelLoadError("an 'hf' tokenizer needs a model directory")
    try:
        return HFTokenizer(str(directory), append_ids=cfg.append_ids)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"cannot load tokenizer from {directory}: {err}") from err


def _read_config(d: Path) -> dict:
    config_path = d / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"no config.json in model directory {d}")
    try:
        meta = read_json(config_path, ModelLoadError)
    except (OSError, json.JSONDecodeError) as err:
        raise ModelLoadError(f"corrupt model config {config_path}: {err}") from err
    if not isinstance(meta, dict):
        raise ModelLoadError(f"{config_path} must hold a mapping")
    return meta


def require_heisd_vla(directory: str | Path, tool: str) -> None:
    """Refuse an OpenVLA checkpoint for `tool`, which trains or rewrites a VLA saved by heisd
    (ModelLoadError naming the directory); the config alone is read, no weights."""
    if _read_config(Path(directory)).get("model_type") == "openvla":
        raise ModelLoadError(f"{tool} trains or rewrites a VLA saved by heisd (heisd-libero train-vla --out); {directory} "
                             "is an OpenVLA checkpoint (train-drafter, build-db and calibrate take it as it is)")


def load_vla(directory: str | Path, dtype: str = "float32", device: str = "cpu", unnorm_key: str | None = None,
             center_crop: bool = False) -> VLA:
    """Load a VLA saved by `VLAModel.save_pretrained` or an OpenVLA checkpoint from `directory`
    (its state prior, if any, is `load_state_prior(directory)`).

    `unnorm_key`: the dataset whose action statistics `vla.stats()` returns (None: the model's own
    default; an unknown one names the known ones). `center_crop`: OpenVLA's 90 % centre crop of
    every frame (`load_openvla`); a run-time choice for OpenVLA checkpoints only."""
    d = Path(directory)
    config_path = d / "config.json"
    meta = _read_config(d)
    model_type = meta.get("model_type")
    if model_type == "openvla":
        from heisd_ros.models.openvla import load_openvla

        return load_openvla(d, dtype=dtype, device=device, unnorm_key=unnorm_key, center_crop=center_crop)
    if model_type != "heisd_vla":
        raise ModelLoadError(f"{config_path}: unsupported model_type {model_type!r}")
    if center_crop:
        raise ModelLoadError(f"{d}: center_crop is OpenVLA's LIBERO preprocessing; this heisd model resizes whole "
                             "frames as it was trained")
    if "heisd_vla" not in meta:
        raise ModelLoadError(f"{config_path}: no heisd_vla section")
    try:
        cfg = from_dict(VLAConfig, _without_retired(meta["heisd_vla"], config_path))
    except (ConfigError, TypeError) as err:
        raise ModelLoadError(f"{config_path}: invalid heisd_vla section: {err}") from err
    stats = load_dataset_statistics(d / "dataset_statistics.json")
    if unnorm_key is not None:
        select_stats(stats, unnorm_key)  # an unknown key names the known ones
        cfg = dataclasses.replace(cfg, unnorm_key=unnorm_key)
    model = VLAModel(cfg, stats, _text_tokenizer(cfg, d))
    _load_weights(model, d / "model.safetensors")
    return model.to(device=device, dtype=DTYPES[dtype]).eval()


class PolicyModel(NamedTuple):
    """A model directory's VLA and its state prior (None where the directory has none)."""

    vla: VLA
    state_prior: StatePrior | None


def load_policy_model(directory: str | Path, dtype: str = "float32", device: str = "cpu",
                      unnorm_key: str | None = None, center_crop: bool = False, llm_linear: str = "torch") -> PolicyModel:
    """The VLA of `directory` (`load_vla`) and its state prior (float32 on the CPU: 4 inputs,
    < 0.1 ms a step). `llm_linear` 'onednn': the LLM's decoder layers on oneDNN-packed weights
    (`models.packed_linear`; float32 CPU only); 'auto': packed where that is measured faster here."""
    vla = load_vla(directory, dtype=dtype, device=device, unnorm_key=unnorm_key, center_crop=center_crop)
    if llm_linear in ("onednn", "auto"):
        pack_decoder_layers(vla.language_model, device, dtype, llm_linear)
    return PolicyModel(vla, load_state_prior(directory))


def load_model(spec: ModelSpec) -> PolicyModel:
    """The VLA and state prior of a ModelSpec: how the node and every tool load a checkpoint."""
    return load_policy_model(spec.directory, dtype=spec.dtype, device=spec.device,
                             unnorm_key=spec.unnorm_key or None, center_crop=spec.center_crop,
                             llm_linear=spec.llm_linear)  # fmt: skip


def _load_weights(model: torch.nn.Module, path: Path) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise ModelLoadError(f"missing weights file {path}")
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise ModelLoadError(f"corrupt weights file {path}: {err}") from err
    expected = model.state_dict()
    for name, tensor in state.items():
        if name in expected and expected[name].shape != tensor.shape:
            raise ModelLoadError(
                f"{path}: tensor {name} has shape {tuple(tensor.shape)}, model expects {tuple(expected[name].shape)}"
            )
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = getattr(getattr(model, "language_model", None), "config", None)
    allowed = {"language_model.lm_head.weight"} if tied is not None and tied.tie_word_embeddings else set()
    package = getattr(getattr(model, "vision_backbone", None), "package_weights", False)
    missing = [m for m in missing if m not in allowed and not (package and m.startswith("vision_backbone."))]
    if missing or unexpected:
        raise ModelLoadError(f"{path}: missing tensors {missing[:5]}, unexpected tensors {unexpected[:5]}")


def tiny_vla_config(
    vocab_size: int = 640, hidden_size: int = 128, layers: int = 4, image_size: int = 64, patch_size: int = 16
) -> VLAConfig:
    """A tiny OpenVLA-shaped config: 16 visual tokens, a 4-layer LLaMA (tests and the bench)."""
    llm = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
        initializer_range=0.1,  # wide enough that greedy actions depend on the image (0.02 gives constants)
    )
    return VLAConfig(vision="tinyconv", image_size=image_size, patch_size=patch_size, vision_dim=64, llm=llm)


def tiny_vla(seed: int = 0, dtype: str = "float32", cfg: VLAConfig | None = None, **kwargs) -> VLAModel:
    """Random-initialised tiny VLA with identity norm stats (seeded, nothing read from disk)."""
    cfg = cfg or tiny_vla_config(**kwargs)
    torch.manual_seed(seed)
    stats = {cfg.unnorm_key: NormStats(q01=-np.ones(7), q99=np.ones(7), mask=np.array([True] * 6 + [False]))}
    model = VLAModel(cfg, stats, HashWordTokenizer(cfg.hash_text_ids))
    return model.to(dtype=DTYPES[dtype]).eval()
