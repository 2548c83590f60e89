"""An OpenVLA-shaped policy: vision backbone -> projector -> LLaMA decoder (docs/design.md §3).

`VLAModel` implements `heisd_ros.core.model_api.VLA`, the surface of OpenVLA's HF class the
decoding core uses: the vision backbone, the projector, the language model (a transformers
`LlamaForCausalLM`), its input embeddings, the action tokenizer and the normalisation statistics.
Tiny and mini models are this class; OpenVLA checkpoints are wrapped by
`heisd_ros.models.openvla.OpenVLAAdapter` to the same surface, so every decoding path tested on
the tiny model runs unchanged on the others.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from heisd_ros.core.action_tokenizer import ActionTokenizer, NormStats, select_stats
from heisd_ros.core.errors import InvalidObservationError, ModelLoadError
from heisd_ros.models.text_tokenizer import (PROMPT_CACHE_SIZE, PROMPT_TEMPLATE, HFTokenizer, TextTokenizer,
                                             prompt_text)

GAP_SCALE_M = 0.04
"""The finger gap enters the state token as gap / 0.04 m: 0 (closed) to ~2 (a Panda hand fully open,
~0.08 m), the scale of the normalised position beside it."""
MAX_GAP_M = 0.2
"""Larger finger gaps are sensor errors (no parallel gripper in LIBERO or on a Panda opens that far)."""


@dataclass(frozen=True)
class VLAConfig:
    """Architecture of a VLAModel; stored as config.json next to the weights."""

    vision: str = "tinyconv"
    """'tinyconv' (tests) or 'efficientnet_lite0' (mini VLA, real ImageNet weights)."""
    image_size: int = 64
    patch_size: int = 16
    """tinyconv only: patch grid = image_size // patch_size per side."""
    vision_dim: int = 64
    llm: dict[str, Any] = field(default_factory=dict)
    """LlamaConfig keyword arguments (vocab_size, hidden_size, layers, heads...)."""
    tokenizer: str = "hash_words"
    """'hash_words' or 'hf' (a tokenizer saved in the model directory)."""
    hash_text_ids: int = 200
    append_ids: tuple[int, ...] = ()
    """Ids appended after the prompt (OpenVLA appends 29871 for LLaMA-2 tokenizers)."""
    unnorm_key: str = "default"
    prompt_views: int = 1
    """How many views' patch features enter the prompt, in the policy's view order (primary
    first). OpenVLA uses 1; the mini VLA may also read the wrist view (2), which costs no extra
    vision time because the retrieval query already embeds every view."""
    proprio_dim: int = 0
    """0: no state input (OpenVLA). 3: the end-effector position enters the prompt as one
    projected token after the patches, normalised by `proprio_mean` / `proprio_std`."""
    proprio_mean: tuple[float, ...] = ()
    proprio_std: tuple[float, ...] = ()
    proprio_gripper_gap: bool = False
    """The state token also reads the opening between the fingers (m), as gap / GAP_SCALE_M: it
    says whether the fingers are open, closing, or holding something, which the end-effector
    position alone does not."""

    def __post_init__(self) -> None:
        if self.prompt_views < 1:
            raise ModelLoadError("prompt_views must be >= 1")
        if self.proprio_dim < 0 or (self.proprio_dim and not (
                len(self.proprio_mean) == len(self.proprio_std) == self.proprio_dim)):
            raise ModelLoadError("proprio_dim needs proprio_mean and proprio_std of that length")
        if self.proprio_gripper_gap and not self.proprio_dim:
            raise ModelLoadError("proprio_gripper_gap needs proprio_dim > 0 (it rides on the state token)")
        if any(s <= 0 for s in self.proprio_std):
            raise ModelLoadError("proprio_std must be > 0")
        if self.vision not in VISION_BACKBONES:
            raise ModelLoadError(f"unknown vision backbone {self.vision!r}; known: {sorted(VISION_BACKBONES)}")
        if self.image_size < 8:
            raise ModelLoadError("image_size must be >= 8")


def hash_weights(h, module: nn.Module, sample: int = 1024):
    """`h` updated with every tensor's name and its first `sample` values as float32, in name
    order: a cheap digest of a module's weights (any retraining changes those values)."""
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().reshape(-1)[:sample].float().cpu().numpy().tobytes())
    return h


class TinyConvBackbone(nn.Module):
    """Patchify conv + pointwise conv: images [B, 3, S, S] -> patch features [B, N, C]."""

    def __init__(self, cfg: VLAConfig) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, cfg.vision_dim, cfg.patch_size, stride=cfg.patch_size)
        self.mix = nn.Conv2d(cfg.vision_dim, cfg.vision_dim, 1)
        self.out_dim = cfg.vision_dim

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.mix(nn.functional.gelu(self.patch(pixels)))
        return x.flatten(2).transpose(1, 2)


def _efficientnet_backbone(cfg: VLAConfig) -> nn.Module:
    from heisd_ros.models.efficientnet import EfficientNetBackbone

    return EfficientNetBackbone()


VISION_BACKBONES = {"tinyconv": TinyConvBackbone, "efficientnet_lite0": _efficientnet_backbone}
PACKAGE_BACKBONE_PREFIX = "vision_backbone."
"""The state-dict prefix a save leaves out when the backbone holds its package's frozen weights."""


class VLAModel(nn.Module):
    """vision_backbone -> projector -> language_model, with the OpenVLA prompt and action tokens."""

    def __init__(self, cfg: VLAConfig, norm_stats: dict[str, NormStats], text_tokenizer: TextTokenizer) -> None:
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        self.cfg = cfg
        self.vision_backbone = VISION_BACKBONES[cfg.vision](cfg)
        llm_cfg = LlamaConfig(**cfg.llm)
        hidden = llm_cfg.hidden_size
        self.projector = nn.Sequential(
            nn.Linear(self.vision_backbone.out_dim, hidden), nn.GELU(), nn.Linear(hidden, hidden)
        )
        self.language_model = LlamaForCausalLM(llm_cfg)
        state_in = cfg.proprio_dim + int(cfg.proprio_gripper_gap)
        self.state_projector = nn.Linear(state_in, hidden) if cfg.proprio_dim else None
        self._state_mean = np.asarray(cfg.proprio_mean, dtype=np.float64)
        self._state_std = np.asarray(cfg.proprio_std, dtype=np.float64)
        self.action_tokenizer = ActionTokenizer(llm_cfg.vocab_size)
        self.norm_stats = norm_stats
        self.text_tokenizer = text_tokenizer
        self.image_mean = 0.5
        self.image_std = 0.5
        self._prompt_cache: dict[str, tuple[int, ...]] = {}
        self._patch_tokens: int | None = None

    # -- shapes -------------------------------------------------------------------------------
    @property
    def hidden_size(self) -> int:
        return self.language_model.config.hidden_size

    @property
    def dtype(self) -> torch.dtype:
        return next(self.language_model.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.language_model.parameters()).device

    @property
    def query_dim(self) -> int:
        """Channels per view of the retrieval query (the backbone's patch features)."""
        return self.vision_backbone.out_dim

    def fingerprint(self) -> str:
        """Short hash of what the backbone's patch features depend on: the backbone kind, its input
        size and (a sample of) its weights; feature caches live under it."""
        h = hashlib.sha256(f"{self.cfg.vision}:{self.cfg.image_size}:{self.cfg.patch_size}".encode())
        return hash_weights(h, self.vision_backbone).hexdigest()[:12]

    @property
    def reads_gripper_gap(self) -> bool:
        """Whether `prompt_embeds` needs the finger gap (`proprio_gripper_gap`)."""
        return self.cfg.proprio_gripper_gap

    def get_input_embeddings(self) -> nn.Embedding:
        return self.language_model.get_input_embeddings()

    def action_head_weight(self) -> torch.Tensor:
        """lm_head rows of the 256 action tokens [256, D]; row j is token first_token_id + j."""
        first = self.action_tokenizer.first_token_id
        return self.language_model.lm_head.weight[first : first + self.action_tokenizer.n_bins]

    def stats(self, unnorm_key: str | None = None) -> NormStats:
        return select_stats(self.norm_stats, unnorm_key or self.cfg.unnorm_key)

    # -- inputs -------------------------------------------------------------------------------
    def preprocess(self, images: list[np.ndarray]) -> torch.Tensor:
        """RGB uint8 images [H, W, 3] (one per view) -> pixels [V, 3, S, S] in the model's dtype."""
        for i, img in enumerate(images):
            if not isinstance(img, np.ndarray) or img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
                desc = f"{getattr(img, 'dtype', type(img).__name__)} {getattr(img, 'shape', '')}"
                raise InvalidObservationError(f"view {i}: expected uint8 [H, W, 3] image, got {desc}")
            if min(img.shape[:2]) < 8:
                raise InvalidObservationError(f"view {i}: image {img.shape[:2]} too small")
        s = self.cfg.image_size
        batch = []
        for img in images:
            t = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)[None].float()
            if t.shape[-2:] != (s, s):
                t = nn.functional.interpolate(t, size=(s, s), mode="bilinear", antialias=True, align_corners=False)
            batch.append(t)
        pixels = torch.cat(batch) / 255.0
        pixels = (pixels - self.image_mean) / self.image_std
        return pixels.to(device=self.device, dtype=self.dtype)

    def _prompt_ids(self, instruction: str) -> tuple[int, ...]:
        ids = self._prompt_cache.get(instruction)
        if ids is None:
            if len(self._prompt_cache) >= PROMPT_CACHE_SIZE:
                self._prompt_cache.clear()
            text = PROMPT_TEMPLATE.format(instruction=prompt_text(instruction))
            ids = self._prompt_cache[instruction] = tuple(self.text_tokenizer.encode(text))
        return ids

    # -- input limits (what a caller checks before a step) ----------------------------------------
    @property
    def input_hw(self) -> tuple[int, int]:
        """(height, width) every view is resized to."""
        return (self.cfg.image_size, self.cfg.image_size)

    @property
    def max_positions(self) -> int:
        """Positions the language model was built for (max_position_embeddings)."""
        return int(self.language_model.config.max_position_embeddings)

    def instruction_tokens(self, instruction: str) -> int:
        """Tokens of the instruction alone, as it enters the prompt."""
        return self.text_tokenizer.count(prompt_text(instruction))

    def prompt_length(self, instruction: str) -> int:
        """Positions of the prompt `prompt_embeds` builds: BOS, visual tokens, state token, text."""
        return len(self._prompt_ids(instruction)) + self.prompt_views * self.patch_tokens + int(
            self.state_projector is not None)

    @property
    def patch_tokens(self) -> int:
        """Patch tokens per view (measured once on a blank frame of the input size)."""
        if self._patch_tokens is None:
            blank = np.zeros((*self.input_hw, 3), dtype=np.uint8)
            with torch.inference_mode():
                self._patch_tokens = int(self.vision_backbone(self.preprocess([blank])).shape[1])
        return self._patch_tokens

    @property
    def prompt_views(self) -> int:
        return self.cfg.prompt_views

    def state_features(self, state, gripper_gap: float | None = None) -> np.ndarray:
        """What the state projector reads, in float64: the normalised end-effector position [3]
        (+ the scaled finger gap)."""
        x = np.asarray(state, dtype=np.float64).reshape(-1)
        if x.shape != (self.cfg.proprio_dim,) or not np.all(np.isfinite(x)):
            raise InvalidObservationError(f"state must be {self.cfg.proprio_dim} finite numbers, got {state!r}")
        x = (x - self._state_mean) / self._state_std
        if self.cfg.proprio_gripper_gap:
            if gripper_gap is None or not np.isfinite(gripper_gap) or not 0.0 <= gripper_gap <= MAX_GAP_M:
                raise InvalidObservationError(f"this model reads the finger gap (0-{MAX_GAP_M} m), got {gripper_gap!r}")
            x = np.append(x, gripper_gap / GAP_SCALE_M)
        return x

    def state_token(self, state, gripper_gap: float | None = None) -> torch.Tensor:
        """End-effector position [3] (+ finger gap) -> one prompt token [1, D] (normalised in
        float64 first, so a bf16 model still sees millimetres)."""
        x = self.state_features(state, gripper_gap)
        return self.state_projector(torch.as_tensor(x, dtype=self.dtype, device=self.device))[None]

    def prompt_embeds(self, instruction: str, visual: torch.Tensor, state=None,
                      gripper_gap: float | None = None) -> torch.Tensor:
        """[BOS] + visual [V*N, D] (+ state token) + prompt text -> inputs_embeds [1, P, D]
        (OpenVLA order; `state` is read only by a model with `proprio_dim` > 0, `gripper_gap` only
        by one with `proprio_gripper_gap`)."""
        ids = torch.tensor(self._prompt_ids(instruction), device=self.device)
        text = self.get_input_embeddings()(ids)
        parts = [text[:1], visual.to(text.dtype)]
        if self.state_projector is not None:
            if state is None:
                raise InvalidObservationError("this model reads the end-effector position, but none was given")
            parts.append(self.state_token(state, gripper_gap).to(text.dtype))
        return torch.cat(parts + [text[1:]], dim=0)[None]

    # -- persistence (OpenVLA-like directory: config.json, model.safetensors, dataset_statistics.json)
    def save_pretrained(self, directory: str | Path) -> None:
        from safetensors.torch import save_file

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        meta = {"model_type": "heisd_vla", "heisd_vla": dataclasses.asdict(self.cfg)}
        (d / "config.json").write_text(json.dumps(meta, indent=2))
        stats = {k: v.to_json() for k, v in self.norm_stats.items()}
        (d / "dataset_statistics.json").write_text(json.dumps(stats, indent=2))
        state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        # lm_head may be tied to the embeddings; safetensors refuses shared storage.
        if self.language_model.config.tie_word_embeddings:
            state.pop("language_model.lm_head.weight", None)
        if getattr(self.vision_backbone, "package_weights", False):  # rebuilt from its package on load
            state = {k: v for k, v in state.items() if not k.startswith(PACKAGE_BACKBONE_PREFIX)}
        save_file(state, str(d / "model.safetensors"))
        if self.cfg.tokenizer == "hf" and isinstance(self.text_tokenizer, HFTokenizer):
            self.text_tokenizer._tok.save_pretrained(str(d))
