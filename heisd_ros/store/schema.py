"""What the demonstration database stores and how a store is reached (docs/design.md §4).

One point per demonstration step, with three named cosine vectors:
  obs       [D_obs]  the retrieval query (pooled, L2-normalised vision features of all views)
  feat      [D_f]    mean LLM final hidden state at the 7 action positions (teacher-forced)
  feat_prev [D_f]    the same for the previous step of the episode
and a payload: dataset, task (keyword index, the partition key), instruction, episode, step,
action [7], action_tokens [7], next_actions [<=3, 7], ee_pos [3], success.

Qdrant normalises cosine vectors on insert, so vectors come back with unit norm (their direction,
which is all a cosine consumer uses, is kept). Payload arrays are float32 and round-trip exactly.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import (
    Any,
    Iterator,
    Mapping,
    Protocol,
    Sequence,
    runtime_checkable,
)

import numpy as np

from heisd_ros.core.errors import (
    ConfigError,
    DatabaseError,
    InvalidObservationError,
)
from heisd_ros.core.store_api import DemoStore
from heisd_ros.core.types import ACTION_DIM, Hit

OBS, FEAT, FEAT_PREV = "obs", "feat", "feat_prev"
VECTOR_NAMES = (OBS, FEAT, FEAT_PREV)
HIT_VECTORS = [FEAT, FEAT_PREV]
"""Named vectors a search returns with each hit (the query vector itself is not needed)."""
TASK_FIELD = "task"
EE_POS_FIELD = "ee_pos"
PAYLOAD_FIELDS = (
    "dataset", "task", "instruction", "episode", "step",
    "action", "action_tokens", "next_actions", "ee_pos", "success",
)  # fmt: skip
MAX_NEXT_ACTIONS = 3
SCHEMA_VERSION = 1

_ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "heisd_ros/store/demo-point")


class InvalidDemoPointError(InvalidObservationError):
    """A demonstration step cannot be stored: wrong dimensions, non-finite or zero vectors."""


def point_id(dataset: str, episode: int, step: int) -> str:
    """Deterministic point id (UUID5 of the triple), so re-ingesting a step overwrites it."""
    key = json.dumps([str(dataset), int(episode), int(step)], separators=(",", ":"))
    return str(uuid.uuid5(_ID_NAMESPACE, key))


def _vector(name: str, value: Any, dim: int | None = None) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float32)
    if arr.ndim != 1 or arr.size == 0:
        raise InvalidDemoPointError(f"{name} must be a non-empty 1-D vector, got shape {arr.shape}")
    if dim is not None and arr.shape[0] != dim:
        raise InvalidDemoPointError(f"{name} has dimension {arr.shape[0]}, expected {dim}")
    if not np.all(np.isfinite(arr)):
        raise InvalidDemoPointError(f"{name} contains NaN or Inf")
    if not np.any(arr):
        raise InvalidDemoPointError(f"{name} is all zeros (cosine similarity is undefined)")
    return arr


def _floats(name: str, value: Any, shape: tuple[int, ...]) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float32)
    if arr.shape != shape:
        raise InvalidDemoPointError(f"{name} must have shape {shape}, got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise InvalidDemoPointError(f"{name} contains NaN or Inf")
    return arr


@dataclass(frozen=True, eq=False)
class DemoPoint:
    """One demonstration step. Arrays are converted and validated on construction.

    obs [D_obs], feat / feat_prev [D_f] (non-zero, finite); action [7] (unnormalised),
    next_actions [n<=3, 7], ee_pos [3] metres: all float32, which the stored JSON doubles reproduce
    exactly. action_tokens: 7 ints >= 0. For step 0 of an episode use feat itself as feat_prev.
    The point id is dataset/episode/step: number episodes uniquely within a dataset, across tasks.
    """

    dataset: str
    task: str
    instruction: str
    episode: int
    step: int
    obs: np.ndarray
    feat: np.ndarray
    feat_prev: np.ndarray
    action: np.ndarray
    action_tokens: tuple[int, ...]
    ee_pos: np.ndarray
    next_actions: np.ndarray = field(default_factory=lambda: np.zeros((0, ACTION_DIM), np.float32))
    success: bool = True

    def __post_init__(self) -> None:
        put = object.__setattr__  # frozen: normalise the fields once, here
        for name in ("dataset", "task", "instruction"):
            if not isinstance(getattr(self, name), str):
                raise InvalidDemoPointError(f"{name} must be a str")
        if not self.task:
            raise InvalidDemoPointError("task must be a non-empty string")
        for name in ("episode", "step"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise InvalidDemoPointError(f"{name} must be an integer >= 0, got {value!r}")
            put(self, name, int(value))
        put(self, "obs", _vector("obs", self.obs))
        put(self, "feat", _vector("feat", self.feat))
        put(self, "feat_prev", _vector("feat_prev", self.feat_prev, self.feat.shape[0]))
        put(self, "action", _floats("action", self.action, (ACTION_DIM,)))
        put(self, "ee_pos", _floats("ee_pos", self.ee_pos, (3,)))
        nxt = np.asarray(self.next_actions, dtype=np.float32)
        nxt = nxt.reshape(-1, ACTION_DIM) if nxt.size else np.zeros((0, ACTION_DIM), np.float32)
        if nxt.shape[0] > MAX_NEXT_ACTIONS:
            raise InvalidDemoPointError(f"at most {MAX_NEXT_ACTIONS} next_actions, got {nxt.shape[0]}")
        put(self, "next_actions", _floats("next_actions", nxt, nxt.shape))
        tokens = tuple(self.action_tokens)
        if len(tokens) != ACTION_DIM or not all(
            isinstance(t, (int, np.integer)) and not isinstance(t, bool) and t >= 0 for t in tokens
        ):
            raise InvalidDemoPointError(f"action_tokens must be {ACTION_DIM} integers >= 0, got {tokens!r}")
        put(self, "action_tokens", tuple(int(t) for t in tokens))
        put(self, "success", bool(self.success))

    @property
    def id(self) -> str:
        return point_id(self.dataset, self.episode, self.step)

    def check_dims(self, obs_dim: int, feat_dim: int) -> None:
        """Raise InvalidDemoPointError unless the vectors match the store's dimensions."""
        if self.obs.shape[0] != obs_dim or self.feat.shape[0] != feat_dim:
            raise InvalidDemoPointError(
                f"point {self.dataset}/{self.episode}/{self.step}: obs {self.obs.shape[0]}, "
                f"feat {self.feat.shape[0]}; the store expects obs {obs_dim}, feat {feat_dim}"
            )

    def vectors(self) -> dict[str, list[float]]:
        return {OBS: self.obs.tolist(), FEAT: self.feat.tolist(), FEAT_PREV: self.feat_prev.tolist()}

    def payload(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "task": self.task,
            "instruction": self.instruction,
            "episode": self.episode,
            "step": self.step,
            "action": self.action.tolist(),
            "action_tokens": list(self.action_tokens),
            "next_actions": self.next_actions.tolist(),
            "ee_pos": self.ee_pos.tolist(),
            "success": self.success,
        }

    @classmethod
    def from_stored(cls, payload: Mapping[str, Any], vectors: Mapping[str, Any]) -> "DemoPoint":
        """Inverse of payload()/vectors() (vectors come back unit-normalised)."""
        missing = [k for k in PAYLOAD_FIELDS if k not in payload] + [v for v in VECTOR_NAMES if v not in vectors]
        if missing:
            raise DatabaseError(f"stored point lacks {missing}")
        try:
            return cls(**{k: payload[k] for k in PAYLOAD_FIELDS}, **{v: vectors[v] for v in VECTOR_NAMES})
        except (TypeError, ValueError) as err:
            raise DatabaseError(f"stored point is malformed: {err}") from err


def hit_from_stored(score: float, payload: Mapping[str, Any], vectors: Mapping[str, Any]) -> Hit:
    """Build a Hit (feat/feat_prev as float32 [D_f]) from a stored payload and its vectors."""
    try:
        return _hit(score, payload, vectors)
    except (KeyError, TypeError, ValueError) as err:
        raise DatabaseError(f"stored point is malformed: {err!r}") from err


def _hit(score: float, payload: Mapping[str, Any], vectors: Mapping[str, Any]) -> Hit:
    return Hit(
        score=float(score),
        task=str(payload["task"]),
        episode=int(payload["episode"]),
        step=int(payload["step"]),
        action=np.asarray(payload["action"], dtype=np.float32),
        action_tokens=tuple(int(t) for t in payload["action_tokens"]),
        feat=np.asarray(vectors[FEAT], dtype=np.float32),
        feat_prev=np.asarray(vectors[FEAT_PREV], dtype=np.float32),
        ee_pos=np.asarray(payload["ee_pos"], dtype=np.float32),
        success=bool(payload["success"]),
        next_actions=tuple(tuple(float(x) for x in row) for row in payload["next_actions"]),
    )


def check_query(query: Any, obs_dim: int) -> list[float]:
    """Validate a retrieval query [D_obs]; returns it as a list of floats for the engine."""
    arr = np.asarray(query, dtype=np.float32)
    if arr.ndim != 1 or arr.shape[0] != obs_dim:
        raise InvalidObservationError(f"retrieval query must have shape ({obs_dim},), got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise InvalidObservationError("retrieval query contains NaN or Inf")
    if not np.any(arr):
        raise InvalidObservationError("retrieval query is all zeros (cosine similarity is undefined)")
    return arr.tolist()


def check_dims(obs_dim: Any, feat_dim: Any) -> tuple[int, int]:
    for name, dim in (("obs_dim", obs_dim), ("feat_dim", feat_dim)):
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not 1 <= dim <= 65536:
            raise ConfigError(f"{name} must be an integer in [1, 65536], got {dim!r}")
    return int(obs_dim), int(feat_dim)


@runtime_checkable
class DemoDatabase(DemoStore, Protocol):
    """A demonstration database partitioned by task (embedded or remote Qdrant): what the engine
    reads (`heisd_ros.core.store_api.DemoStore`) and what building and inspecting one takes."""

    @property
    def obs_dim(self) -> int: ...

    @property
    def feat_dim(self) -> int: ...

    def upsert(self, points: Sequence[DemoPoint], batch_size: int = 256) -> int:
        """Insert or overwrite points (id = point_id); returns how many were written."""
        ...

    def count(self, task: str | None = None) -> int: ...

    def scroll(self, task: str | None = None) -> Iterator[DemoPoint]:
        """Every point (of one task) with all three vectors, in the backend's order."""
        ...

    def optimize(self) -> None:
        """Build indexes after a bulk ingest (no-op where the backend indexes by itself)."""
        ...
