"""OpenVLA checkpoints from a local directory, built natively (docs/design.md §3).

A checkpoint directory as published (config.json with model_type "openvla", safetensors shards
with `model.safetensors.index.json` or one `model.safetensors`, tokenizer.json,
preprocessor_config.json, dataset_statistics.json) is read as data: the architecture comes from
config.json (`heisd_ros.models.openvla_config`), the vision towers and projector are this
package's modules with the checkpoint's parameter names (`openvla_towers`), the language model is
transformers' `LlamaForCausalLM`, and the weights fill a model built on the meta device tensor by
tensor (`openvla_weights`). Code shipped in the directory (`modeling_prismatic.py` and the other
files its `auto_map` names) is never imported.

`OpenVLAAdapter` exposes the `heisd_ros.core.model_api.VLA` surface: the action tokens are the
last 256 ids of the unpadded LLaMA-2 vocabulary (31744-31999; the embedding matrix has 32064 rows,
padded to a multiple of 64), `ActionTokenizer.first_token_id` says where they start.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from heisd_ros.core.action_tokenizer import (
    ActionTokenizer,
    NormStats,
    load_dataset_statistics,
    select_stats,
)
from heisd_ros.core.errors import InvalidObservationError, ModelLoadError
from heisd_ros.core.files import read_json
from heisd_ros.models.openvla_config import OpenVLAArch, parse_config
from heisd_ros.models.openvla_processor import ImageTransform, read_tower_inputs
from heisd_ros.models.openvla_tokenizer import LlamaPromptTokenizer
from heisd_ros.models.openvla_towers import PrismaticBackbone, PrismaticProjector
from heisd_ros.models.openvla_weights import (
    INDEX_FILE,
    SINGLE_FILE,
    assert_materialised,
    check_layout,
    empty_model,
    load_tensors,
    read_layout,
)
from heisd_ros.models.text_tokenizer import (
    PROMPT_CACHE_SIZE,
    PROMPT_TEMPLATE,
    prompt_text,
)

STATISTICS_FILE = "dataset_statistics.json"


class OpenVLAModel(nn.Module):
    """vision_backbone -> projector -> language_model, the module tree of the published checkpoints."""

    def __init__(self, arch: OpenVLAArch) -> None:
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        self.vision_backbone = PrismaticBackbone(arch)
        self.projector = PrismaticProjector(arch)
        self.language_model = LlamaForCausalLM(LlamaConfig(**arch.text, attn_implementation="sdpa"))


class OpenVLAAdapter:
    """A loaded OpenVLA checkpoint behind the `VLA` protocol."""

    prompt_views = 1
    """OpenVLA's prompt holds the primary view only, and no robot state."""
    reads_gripper_gap = False

    def __init__(self, model: OpenVLAModel, arch: OpenVLAArch, transform: ImageTransform,
                 tokenizer: LlamaPromptTokenizer, norm_stats: dict[str, NormStats],
                 unnorm_key: str | None = None, config_digest: str = "") -> None:
        self.model = model
        self.config_digest = config_digest
        """sha256 of the checkpoint's config.json (part of `fingerprint`)."""
        self.arch = arch
        self.transform = transform
        self.tokenizer = tokenizer
        self.vision_backbone = model.vision_backbone
        self.projector = model.projector
        self.language_model = model.language_model
        self.action_tokenizer = ActionTokenizer(arch.action_vocab, arch.n_action_bins)
        self.norm_stats = norm_stats
        self.unnorm_key = unnorm_key
        self._prompt_cache: dict[str, tuple[int, ...]] = {}

    @property
    def hidden_size(self) -> int:
        return self.language_model.config.hidden_size

    @property
    def device(self) -> torch.device:
        return next(self.language_model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.language_model.parameters()).dtype

    @property
    def query_dim(self) -> int:
        """Channels per view of the retrieval query: the backbone's patch features (both towers)."""
        return self.vision_backbone.out_dim

    def fingerprint(self) -> str:
        """Short hash of what the backbone's patch features depend on: config.json, the image
        transform (resize strategy, each tower's input, the centre crop) and (a sample of) the
        towers' weights; feature caches live under it."""
        from heisd_ros.models.vla import hash_weights

        t = self.transform
        h = hashlib.sha256(f"openvla:{self.config_digest}:{t.strategy}:{t.center_crop}:{t.towers!r}".encode())
        return hash_weights(h, self.vision_backbone).hexdigest()[:12]

    def preprocess(self, images: list[np.ndarray]) -> torch.Tensor:
        """RGB uint8 [H, W, 3] per view -> pixels [V, 3 * towers, S, S] in the model's dtype."""
        for i, img in enumerate(images):
            if not isinstance(img, np.ndarray) or img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
                desc = f"{getattr(img, 'dtype', type(img).__name__)} {getattr(img, 'shape', '')}"
                raise InvalidObservationError(f"view {i}: expected uint8 [H, W, 3] image, got {desc}")
        pixels = torch.stack([self.transform(img) for img in images])
        return pixels.to(device=self.device, dtype=self.dtype)

    def _prompt_ids(self, instruction: str) -> tuple[int, ...]:
        ids = self._prompt_cache.get(instruction)
        if ids is None:
            if len(self._prompt_cache) >= PROMPT_CACHE_SIZE:
                self._prompt_cache.clear()
            text = PROMPT_TEMPLATE.format(instruction=prompt_text(instruction))
            ids = self._prompt_cache[instruction] = tuple(self.tokenizer.encode(text))
        return ids

    def prompt_embeds(self, instruction: str, visual: torch.Tensor, state=None,
                      gripper_gap: float | None = None) -> torch.Tensor:
        """[BOS] + visual [N, D] + prompt text + the empty token -> inputs_embeds [1, P, D]."""
        ids = torch.tensor(self._prompt_ids(instruction), device=self.device)
        emb = self.get_input_embeddings()(ids)
        return torch.cat([emb[:1], visual.to(emb.dtype), emb[1:]], dim=0)[None]

    # -- input limits (what a caller checks before a step) ----------------------------------------
    @property
    def input_hw(self) -> tuple[int, int]:
        """(height, width) of the backbone's input (every strategy ends at S x S)."""
        return (self.arch.image_size, self.arch.image_size)

    @property
    def max_positions(self) -> int:
        return int(self.language_model.config.max_position_embeddings)

    def instruction_tokens(self, instruction: str) -> int:
        """Tokens of the instruction alone, by the checkpoint's own tokenizer."""
        return self.tokenizer.count(prompt_text(instruction))

    def prompt_length(self, instruction: str) -> int:
        """Positions of the prompt: BOS, the primary view's patch tokens, text, the empty token."""
        return len(self._prompt_ids(instruction)) + self.arch.patch_tokens

    def get_input_embeddings(self) -> nn.Embedding:
        return self.language_model.get_input_embeddings()

    def action_head_weight(self) -> torch.Tensor:
        """lm_head rows of the 256 action tokens [256, D]; row j is token first_token_id + j."""
        first = self.action_tokenizer.first_token_id
        return self.language_model.lm_head.weight[first : first + self.action_tokenizer.n_bins]

    def stats(self, unnorm_key: str | None = None) -> NormStats:
        return select_stats(self.norm_stats, unnorm_key or self.unnorm_key)

    def to(self, device=None, dtype=None) -> OpenVLAAdapter:
        self.model.to(device=device, dtype=dtype)
        return self

    def eval(self) -> OpenVLAAdapter:
        self.model.eval()
        return self


def check_checkpoint_dir(directory: Path) -> dict:
    """Validate an OpenVLA directory's files before anything is built; returns config.json."""
    if not (directory / "config.json").is_file():
        raise ModelLoadError(f"OpenVLA checkpoint {directory} lacks config.json")
    try:
        meta = read_json(directory / "config.json", ModelLoadError)
    except (OSError, json.JSONDecodeError) as err:
        raise ModelLoadError(f"corrupt {directory / 'config.json'}: {err}") from err
    if not isinstance(meta, dict):
        raise ModelLoadError(f"{directory / 'config.json'} must hold a mapping")
    if not (directory / STATISTICS_FILE).is_file() and not meta.get("norm_stats"):
        raise ModelLoadError(f"OpenVLA checkpoint {directory} lacks {STATISTICS_FILE} "
                             "(and config.json has no norm_stats)")
    if not (directory / INDEX_FILE).is_file() and not (directory / SINGLE_FILE).is_file():
        raise ModelLoadError(f"OpenVLA checkpoint {directory} has no safetensors weights ({INDEX_FILE} or "
                             f"{SINGLE_FILE}; pickles are refused)")
    return meta


def _norm_stats(directory: Path, meta: dict) -> dict[str, NormStats]:
    """The checkpoint's action statistics: dataset_statistics.json (what fine-tunes write, and what
    OpenVLA's evaluation reads), else config.json's norm_stats."""
    if (directory / STATISTICS_FILE).is_file():
        return load_dataset_statistics(directory / STATISTICS_FILE)
    stats = meta["norm_stats"]
    if not isinstance(stats, dict):
        raise ModelLoadError(f"{directory / 'config.json'}: norm_stats must map dataset names to statistics")
    return {key: NormStats.from_json(entry) for key, entry in stats.items()}


def _device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ModelLoadError(f"unknown device {name!r}") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {name!r} asked for, but CUDA is not available")
    return device


def _finish(model: OpenVLAModel, device: torch.device) -> None:
    """What loading leaves on meta: the rotary frequencies (computed, not stored) and, for a model
    with tied embeddings, the head that shares the input embedding."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    lm = model.language_model
    lm.model.rotary_emb = LlamaRotaryEmbedding(lm.config).to(device)
    if lm.config.tie_word_embeddings:
        lm.lm_head.weight = lm.model.embed_tokens.weight
    assert_materialised(model)


def load_openvla(directory: str | Path, dtype: str = "bfloat16", device: str = "cpu", unnorm_key: str | None = None,
                 center_crop: bool = False) -> OpenVLAAdapter:
    """Load an OpenVLA checkpoint directory natively, as `dtype` on `device`.

    `unnorm_key`: the dataset whose action statistics un-normalise actions (an unknown one is an
    error listing the known ones; None: the only one). `center_crop`: take the centre 90 % of each
    frame first, as OpenVLA's LIBERO fine-tunes expect (see `openvla_processor`).
    """
    from heisd_ros.models.dtypes import DTYPES

    if dtype not in DTYPES:
        raise ModelLoadError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    d = Path(directory)
    meta = check_checkpoint_dir(d)
    arch = parse_config(meta, d / "config.json")
    stats = _norm_stats(d, meta)
    if unnorm_key is not None:
        select_stats(stats, unnorm_key)
    transform = ImageTransform(read_tower_inputs(d, arch), arch.resize_strategy, center_crop)
    tokenizer = LlamaPromptTokenizer(d)
    target = _device(device)
    layout = read_layout(d)
    model = empty_model(lambda: OpenVLAModel(arch))
    check_layout(model, layout, d)
    load_tensors(model, layout, d, DTYPES[dtype], target)
    _finish(model, target)
    config_digest = hashlib.sha256((d / "config.json").read_bytes()).hexdigest()
    return OpenVLAAdapter(model.eval(), arch, transform, tokenizer, stats, unnorm_key, config_digest)
