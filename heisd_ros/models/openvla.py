"""Real OpenVLA checkpoints from a local directory (offline: `local_files_only`, never a hub).

An OpenVLA checkpoint directory (as published: config.json with model_type "openvla", its
`modeling_prismatic.py`/`processing_prismatic.py`, safetensors shards, `dataset_statistics.json`,
tokenizer files) is loaded with transformers' remote-code path and wrapped so it exposes the
`heisd_ros.core.model_api.VLA` surface the decoding core uses: the fused DINOv2+SigLIP backbone,
the projector, the LLaMA-2 language model, the action tokens (the last 256 ids of the 32000-token
LLaMA-2 vocabulary; the embedding matrix is padded to 32064) and the norm statistics.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from heisd_ros.core.action_tokenizer import ActionTokenizer, NormStats, select_stats
from heisd_ros.core.errors import InvalidObservationError, ModelLoadError
from heisd_ros.models.text_tokenizer import PROMPT_CACHE_SIZE, PROMPT_TEMPLATE, prompt_text

LLAMA2_VOCAB = 32000
EMPTY_TOKEN_ID = 29871
"""OpenVLA appends this (the empty token of the LLaMA-2 tokenizer) after the prompt."""
REQUIRED_FILES = ("config.json", "dataset_statistics.json")


class OpenVLAAdapter:
    """Wrap a loaded OpenVLA HF model + processor into the VLA protocol."""

    def __init__(self, hf_model, processor, norm_stats: dict[str, NormStats], unnorm_key: str | None = None) -> None:
        self.hf = hf_model
        self.processor = processor
        self.vision_backbone = _PatchFeatures(hf_model.vision_backbone)
        self.projector = hf_model.projector
        self.language_model = hf_model.language_model
        self.action_tokenizer = ActionTokenizer(LLAMA2_VOCAB)
        self.norm_stats = norm_stats
        self.unnorm_key = unnorm_key
        self._prompt_cache: dict[str, list[int]] = {}
        self._patch_tokens: int | None = None

    @property
    def hidden_size(self) -> int:
        return self.language_model.config.hidden_size

    @property
    def device(self) -> torch.device:
        return next(self.language_model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.language_model.parameters()).dtype

    def preprocess(self, images: list[np.ndarray]) -> torch.Tensor:
        from PIL import Image as PILImage

        for i, img in enumerate(images):
            if not isinstance(img, np.ndarray) or img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
                raise InvalidObservationError(f"view {i}: expected uint8 [H, W, 3] image")
        pil = [PILImage.fromarray(img) for img in images]
        pixels = self.processor.image_processor(pil, return_tensors="pt")["pixel_values"]
        return pixels.to(device=self.device, dtype=self.dtype)

    prompt_views = 1
    """OpenVLA's prompt holds the primary view only, and no robot state."""
    reads_gripper_gap = False
    query_dim = None
    """The retrieval query pools every channel (the fused backbone does not say its width)."""

    def _prompt_ids(self, instruction: str) -> list[int]:
        ids = self._prompt_cache.get(instruction)
        if ids is None:
            if len(self._prompt_cache) >= PROMPT_CACHE_SIZE:
                self._prompt_cache.clear()
            text = PROMPT_TEMPLATE.format(instruction=prompt_text(instruction))
            ids = list(self.processor.tokenizer(text)["input_ids"]) + [EMPTY_TOKEN_ID]
            self._prompt_cache[instruction] = ids
        return ids

    def prompt_embeds(self, instruction: str, visual: torch.Tensor, state=None,
                      gripper_gap: float | None = None) -> torch.Tensor:
        ids = self._prompt_ids(instruction)
        emb = self.get_input_embeddings()(torch.tensor(ids, device=self.device))
        return torch.cat([emb[:1], visual.to(emb.dtype), emb[1:]], dim=0)[None]

    # -- input limits (what a caller checks before a step) ----------------------------------------
    @property
    def input_hw(self) -> tuple[int, int] | None:
        """(height, width) the processor resizes every view to (None: it does not say)."""
        sizes = getattr(self.processor.image_processor, "input_sizes", None)
        return (int(sizes[0][1]), int(sizes[0][2])) if sizes else None

    @property
    def max_positions(self) -> int:
        return int(self.language_model.config.max_position_embeddings)

    def instruction_tokens(self, instruction: str) -> int:
        """Tokens of the instruction alone, by the checkpoint's own tokenizer."""
        return len(self.processor.tokenizer(prompt_text(instruction), add_special_tokens=False)["input_ids"])

    def prompt_length(self, instruction: str) -> int:
        """Positions of the prompt: BOS, the primary view's patch tokens, text, the appended token."""
        if self._patch_tokens is None:  # measured once on a blank frame
            hw = self.input_hw or (224, 224)
            with torch.inference_mode():
                self._patch_tokens = int(self.vision_backbone(self.preprocess([np.zeros((*hw, 3), np.uint8)])).shape[1])
        return len(self._prompt_ids(instruction)) + self._patch_tokens

    def get_input_embeddings(self):
        return self.language_model.get_input_embeddings()

    def action_head_weight(self) -> torch.Tensor:
        first = self.action_tokenizer.first_token_id
        return self.language_model.lm_head.weight[first : first + self.action_tokenizer.n_bins]

    def stats(self, unnorm_key: str | None = None) -> NormStats:
        return select_stats(self.norm_stats, unnorm_key or self.unnorm_key)

    def to(self, device=None, dtype=None) -> "OpenVLAAdapter":
        self.hf.to(device=device, dtype=dtype)
        return self

    def eval(self) -> "OpenVLAAdapter":
        self.hf.eval()
        return self


class _PatchFeatures(torch.nn.Module):
    """OpenVLA's backbone returns patch features [B, N, C] for pixel_values [B, 3 or 6, S, S]."""

    def __init__(self, backbone) -> None:
        super().__init__()
        self.backbone = backbone

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.backbone(pixels)


def check_checkpoint_dir(directory: Path) -> dict:
    """Validate an OpenVLA directory before handing it to transformers; returns config.json."""
    missing = [f for f in REQUIRED_FILES if not (directory / f).is_file()]
    if missing:
        raise ModelLoadError(f"OpenVLA checkpoint {directory} lacks {missing}")
    if not any(directory.glob("*.safetensors")):
        raise ModelLoadError(f"OpenVLA checkpoint {directory} has no *.safetensors weights (pickles are refused)")
    try:
        return json.loads((directory / "config.json").read_text())
    except json.JSONDecodeError as err:
        raise ModelLoadError(f"corrupt {directory / 'config.json'}: {err}") from err


def load_openvla(directory: str | Path, dtype: str = "bfloat16", device: str = "cpu", unnorm_key: str | None = None):
    """Load an OpenVLA checkpoint directory with its own remote code (local files only).

    The model class is taken from config.json's `auto_map` (OpenVLA registers it as
    AutoModelForVision2Seq, an auto class transformers 5 no longer has).
    """
    from transformers import AutoProcessor
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    from heisd_ros.core.action_tokenizer import load_dataset_statistics
    from heisd_ros.models.loader import DTYPES

    d = Path(directory)
    config = check_checkpoint_dir(d)
    stats = load_dataset_statistics(d / "dataset_statistics.json")
    auto_map = config.get("auto_map", {})
    ref = auto_map.get("AutoModelForVision2Seq") or auto_map.get("AutoModelForImageTextToText")
    if not ref:
        raise ModelLoadError(f"{d / 'config.json'} has no auto_map entry for the OpenVLA model class")
    try:
        model_cls = get_class_from_dynamic_module(ref, str(d), local_files_only=True)
        processor = AutoProcessor.from_pretrained(str(d), trust_remote_code=True, local_files_only=True)
        model = model_cls.from_pretrained(str(d), local_files_only=True, dtype=DTYPES[dtype], use_safetensors=True)
    except (OSError, ValueError, ImportError, AttributeError) as err:
        raise ModelLoadError(f"cannot load OpenVLA checkpoint {d}: {err}") from err
    return OpenVLAAdapter(model, processor, stats, unnorm_key).to(device=device).eval()
