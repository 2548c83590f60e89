"""What the decoding core needs from a VLA: OpenVLA's surface, as a Protocol.

`heisd_ros.models.vla.VLAModel` (tiny and mini models) and `heisd_ros.models.openvla.OpenVLAAdapter`
(real OpenVLA checkpoints) implement it; the engine never imports either.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from heisd_ros.core.action_tokenizer import ActionTokenizer, NormStats


class VLA(Protocol):
    vision_backbone: torch.nn.Module
    """pixels [V, C, S, S] -> patch features [V, N, C_vis]."""
    projector: torch.nn.Module
    """patch features [N, C_vis] -> LLM embeddings [N, D]."""
    language_model: torch.nn.Module
    """A transformers LLaMA-family *ForCausalLM (its `.model` and `.lm_head` are used)."""
    action_tokenizer: ActionTokenizer
    prompt_views: int
    """How many of the policy's views (primary first) the prompt reads: OpenVLA 1."""

    @property
    def hidden_size(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    def preprocess(self, images: list[np.ndarray]) -> torch.Tensor:
        """RGB uint8 [H, W, 3] per view -> pixels [V, C, S, S]; InvalidObservationError on bad input."""
        ...

    def prompt_embeds(self, instruction: str, visual: torch.Tensor, state=None,
                      prev_gripper: float | None = None, gripper_dwell: int | None = None,
                      gripper_gap: float | None = None) -> torch.Tensor:
        """visual [V*N, D] -> inputs_embeds [1, T, D] in OpenVLA's order (BOS, patches, prompt text);
        `state` (end-effector position [3]) and `prev_gripper` (the previous step's gripper command,
        +1 close / -1 open), `gripper_dwell` (for how many steps that command has been executed) and
        `gripper_gap` (the opening between the fingers, m) are read only by models that take them."""
        ...

    def get_input_embeddings(self) -> torch.nn.Embedding: ...

    def action_head_weight(self) -> torch.Tensor:
        """lm_head rows of the 256 action tokens [256, D]; row j is token first_token_id + j."""
        ...

    def stats(self, unnorm_key: str | None = None) -> NormStats: ...
