"""What the decoding core needs from a VLA (OpenVLA's surface) and from an action prior, as Protocols.

`heisd_ros.models.vla.VLAModel` (tiny and mini models) and `heisd_ros.models.openvla.OpenVLAAdapter`
(real OpenVLA checkpoints) implement `VLA`; `heisd_ros.models.state_prior.StatePrior` implements
`ActionPrior`. The engine never imports any of them.
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
    """A transformers LLaMA-family *ForCausalLM (its `.model`, `.config` and `.lm_head` are used)."""
    action_tokenizer: ActionTokenizer
    prompt_views: int
    """How many of the policy's views (primary first) the prompt reads: OpenVLA 1."""
    reads_gripper_gap: bool
    """Whether `prompt_embeds` needs the finger gap (every observation must then carry it)."""

    @property
    def query_dim(self) -> int | None:
        """Channels per view of the retrieval query (None: the backbone does not say)."""
        ...

    @property
    def hidden_size(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    def preprocess(self, images: list[np.ndarray]) -> torch.Tensor:
        """RGB uint8 [H, W, 3] per view -> pixels [V, C, S, S]; InvalidObservationError on bad input."""
        ...

    def prompt_embeds(self, instruction: str, visual: torch.Tensor, state=None,
                      gripper_gap: float | None = None) -> torch.Tensor:
        """visual [V*N, D] -> inputs_embeds [1, T, D] in OpenVLA's order (BOS, patches, prompt text);
        `state` (end-effector position [3]) and `gripper_gap` (the opening between the fingers, m)
        are read only by models that take them."""
        ...

    def get_input_embeddings(self) -> torch.nn.Embedding: ...

    def action_head_weight(self) -> torch.Tensor:
        """lm_head rows of the 256 action tokens [256, D]; row j is token first_token_id + j."""
        ...

    def stats(self, unnorm_key: str | None = None) -> NormStats: ...


class ActionPrior(Protocol):
    """A per-step bias over each action dimension's 256 bins from the robot's state, added to the
    action logits the verifier (and the drafter) take their argmax over."""

    def bias(self, instruction: str, ee_pos, gripper_gap: float | None) -> torch.Tensor | None:
        """[7, 256] in action-column order (column j = token first_token_id + j), or None where
        the prior does not know the task (the VLA then decides alone)."""
        ...
