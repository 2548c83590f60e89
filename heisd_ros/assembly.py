"""The one place HybridDecoders are assembled: decoders for one or more methods over one loaded
policy (the VLA and its state prior), its drafter and its database.

Loading those parts from files is `heisd_ros.policy`'s (`load_parts`, `build_decoders`: the node's
path and the tools'); a tool or benchmark that loads the parts itself (another LLM kernel, a model
without the file layout) or wraps the database (per-method search timing, a whole-pool reader)
hands them in here. This module loads nothing and imports no loader, so that a pipeline step which
decodes while it builds a policy's files (the tiny policy's live features) can assemble its decoder
without importing the file handling that builds those files.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any, NamedTuple, TypeVar

from heisd_ros.core.config import DecoderConfig
from heisd_ros.core.engine import NEEDS_DRAFTER, HybridDecoder
from heisd_ros.core.shadow import ShadowDecoder

Key = TypeVar("Key", bound=Hashable)

__all__ = ["PolicyParts", "assemble_decoders", "assemble_shadow"]


class PolicyParts(NamedTuple):
    """What the decoders of one policy share: loaded once, used by every method."""

    vla: Any
    state_prior: Any = None
    """The model's bias over action bins from the robot's state; None: the VLA alone."""
    drafter: Any = None
    """Given to the methods that draft (NEEDS_DRAFTER) and to no other."""
    store: Any = None
    """The database every decoder gets unless `assemble_decoders`'s `stores` names another."""


def assemble_decoders(parts: PolicyParts, configs: Mapping[Key, DecoderConfig],
                      stores: Mapping[Key, Any] | None = None) -> dict[Key, HybridDecoder]:
    """One HybridDecoder per entry of `configs`, keyed alike (a method, or a label such as an
    ablation's name), all over the same `parts`: the VLA and state prior, the drafter for the
    methods that draft, and `parts.store` or, for a key in `stores`, that entry (None: no database;
    a wrapped store: e.g. one that times its searches). A method that needs a part it is not given
    fails here, naming the method (HybridDecoder's check)."""
    stores = stores or {}
    return {key: HybridDecoder(parts.vla, cfg, store=stores.get(key, parts.store),
                               drafter=parts.drafter if cfg.method in NEEDS_DRAFTER else None,
                               state_prior=parts.state_prior)
            for key, cfg in configs.items()}


def assemble_shadow(parts: PolicyParts, cfg: DecoderConfig) -> ShadowDecoder:
    """The shadow decoder (heisd at `cfg`, never executing) over the same parts as the decoder it
    shadows: the VLA, state prior, drafter and database are shared, nothing is loaded twice."""
    return ShadowDecoder(parts.vla, cfg, store=parts.store, drafter=parts.drafter, state_prior=parts.state_prior)
