"""The interfaces between the layers, as Protocols: what the decoding core needs from a VLA (OpenVLA's
surface) and from an action prior, and what a control loop (the ROS node, replay, an evaluation)
needs from a decoder.

`heisd_ros.models.vla.VLAModel` (tiny and mini models) and `heisd_ros.models.openvla.OpenVLAAdapter`
(real OpenVLA checkpoints) implement `VLA`; `heisd_ros.models.state_prior.StatePrior` implements
`ActionPrior`; `heisd_ros.core.engine.HybridDecoder` implements `Decoder`. The engine never imports
any model class, and the node never imports the engine's. What the engine needs from a database is
`heisd_ros.core.store_api.DemoStore` (its own module, so the store package can name it without torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, runtime_checkable

import numpy as np
import torch

from heisd_ros.core.action_tokenizer import ActionTokenizer, NormStats
from heisd_ros.core.types import Observation, StepStats


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

    @property
    def input_hw(self) -> tuple[int, int]:
        """(height, width) every view is resized to."""
        ...

    @property
    def max_positions(self) -> int:
        """Positions the language model was built for."""
        ...

    def instruction_tokens(self, instruction: str) -> int:
        """Tokens of the instruction alone, by the model's own tokenizer."""
        ...

    def prompt_length(self, instruction: str) -> int:
        """Positions of the whole prompt (BOS, visual tokens, state, text)."""
        ...


class ActionPrior(Protocol):
    """A per-step bias over each action dimension's 256 bins from the robot's state, added to the
    action logits the verifier (and the drafter) take their argmax over."""

    def bias(self, instruction: str, ee_pos, gripper_gap: float | None) -> torch.Tensor | None:
        """[7, 256] in action-column order (column j = token first_token_id + j), or None where
        the prior does not know the task (the VLA then decides alone)."""
        ...


@dataclass(frozen=True)
class DecoderInputs:
    """What a decoder reads from every observation and what its model takes (None: not known), so
    a control loop can check its inputs before a step."""

    views: tuple[str, ...]
    """Camera views every observation must carry (primary first)."""
    reads_finger_gap: bool = False
    """Every observation must carry `gripper_gap` (the model's state token or a state prior reads it)."""
    image_hw: tuple[int, int] | None = None
    """The model's input frame (height, width)."""
    max_positions: int | None = None
    """The language model's positions."""
    instruction_tokens: Callable[[str], int] | None = None
    """Tokens of an instruction alone, by the model's tokenizer."""
    prompt_length: Callable[[str], int] | None = None
    """Positions of the whole prompt for an instruction."""


class SkipThresholds(Protocol):
    """Verify-skip's running thresholds: the configured ones, moved by episode feedback."""

    min_similarity: float
    max_distance_m: float


@runtime_checkable
class Decoder(Protocol):
    """One policy step at a time, episode by episode: what the node, replay and the evaluation use."""

    @property
    def inputs(self) -> DecoderInputs: ...

    @property
    def skip(self) -> SkipThresholds:
        """Verify-skip's thresholds as they run now (episode feedback moves them from decoder.verify_skip.*)."""
        ...

    def known_tasks(self) -> list[str]:
        """The tasks its database holds demonstrations of ([] without a database, or while it is down)."""
        ...

    def task_problem(self, task: str) -> str:
        """Why an episode of `task` cannot run ('' = it can): a method that retrieves, with
        `unknown_task` 'error', needs the task's demonstrations in its database. A database fault
        is no problem here (the step then decodes in drafter mode)."""
        ...

    def reset(self, instruction: str | None = None) -> None:
        """Start an episode (None: idle); per-episode state is cleared."""
        ...

    def prepare_vision(self) -> None:
        """Build now what the first steps would otherwise build (the vision backbone's graphs)."""
        ...

    def step(self, obs: Observation) -> tuple[np.ndarray, StepStats]:
        """The action [7] for one observation and what the step did; raises HeisdError on bad input."""
        ...

    def episode_feedback(self, success: bool) -> None:
        """The episode's outcome (verify-skip feedback where the decoder adapts)."""
        ...

    def health(self) -> tuple[bool, str]:
        """(ok, status) of what the decoder depends on (its database); never raises."""
        ...

    def close(self) -> None:
        """Release what it holds (an embedded database's file lock)."""
        ...
