"""OpenVLA action tokenizer and (un)normalisation (docs/design.md §3).

256 uniform bins over [-1, 1]; token id = vocab_size - digitize(a); decoding goes through the 255
bin centres. A token's *bin* (used by the relaxed acceptance rules) is `vocab_size - token`, in
[1, 256]; neighbouring bins are neighbouring actions, so |bin_a - bin_b| is a distance.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from heisd_ros.core.errors import ModelLoadError, UnknownTaskError
from heisd_ros.core.files import read_json
from heisd_ros.core.types import ACTION_DIM, GRIPPER_INDEX

N_BINS = 256


class ActionTokenizer:
    """Maps normalised actions in [-1, 1]^7 to the last 256 token ids of the vocabulary and back."""

    def __init__(self, vocab_size: int, n_bins: int = N_BINS) -> None:
        if vocab_size <= n_bins:
            raise ValueError(f"vocab_size {vocab_size} must exceed n_bins {n_bins}")
        self.vocab_size = vocab_size
        self.n_bins = n_bins
        self.edges = np.linspace(-1.0, 1.0, n_bins)
        self.centers = (self.edges[:-1] + self.edges[1:]) / 2.0
        self.first_token_id = vocab_size - n_bins
        """Action token ids are [first_token_id, vocab_size)."""

    def encode(self, normalised: np.ndarray) -> np.ndarray:
        """[..., 7] in [-1, 1] (clipped) -> token ids [..., 7] int64."""
        a = np.clip(np.asarray(normalised, dtype=np.float64), -1.0, 1.0)
        return (self.vocab_size - np.digitize(a, self.edges)).astype(np.int64)

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        """Token ids [..., 7] -> normalised actions [..., 7] (bin centres)."""
        digit = self.vocab_size - np.asarray(tokens, dtype=np.int64)
        return self.centers[np.clip(digit - 1, 0, self.centers.shape[0] - 1)]

    def to_bins(self, tokens: np.ndarray) -> np.ndarray:
        return self.vocab_size - np.asarray(tokens, dtype=np.int64)

    def is_action_token(self, tokens: np.ndarray) -> np.ndarray:
        t = np.asarray(tokens)
        return (t >= self.first_token_id) & (t < self.vocab_size)


MIN_HALF_SPAN = 0.05
"""Smallest half-width of a fitted normalised dimension, in action units."""


@dataclass(frozen=True)
class NormStats:
    """Per-dimension q01/q99 action statistics; `mask[i]` False = dimension not normalised."""

    q01: np.ndarray
    q99: np.ndarray
    mask: np.ndarray

    def normalise(self, action: np.ndarray) -> np.ndarray:
        a = np.asarray(action, dtype=np.float64)
        span = np.where(self.q99 - self.q01 > 1e-8, self.q99 - self.q01, 1.0)
        n = 2.0 * (a - self.q01) / span - 1.0
        return np.clip(np.where(self.mask, n, a), -1.0, 1.0)

    def unnormalise(self, normalised: np.ndarray) -> np.ndarray:
        x = np.asarray(normalised, dtype=np.float64)
        a = np.where(self.mask, 0.5 * (x + 1.0) * (self.q99 - self.q01) + self.q01, x)
        # The gripper is binarised on output: -1 open, +1 close.
        a[..., GRIPPER_INDEX] = np.where(x[..., GRIPPER_INDEX] >= 0.0, 1.0, -1.0)
        return a

    def to_json(self) -> dict:
        return {"action": {"q01": self.q01.tolist(), "q99": self.q99.tolist(), "mask": self.mask.tolist()}}

    @staticmethod
    def from_json(entry: dict) -> "NormStats":
        try:
            act = entry["action"]
            q01 = np.asarray(act["q01"], dtype=np.float64)
            q99 = np.asarray(act["q99"], dtype=np.float64)
            mask = np.asarray(act.get("mask", [True] * 6 + [False]), dtype=bool)
        except (KeyError, TypeError, ValueError) as err:
            raise ModelLoadError(f"malformed action statistics: {err}") from err
        if not (q01.shape == q99.shape == mask.shape == (ACTION_DIM,)):
            raise ModelLoadError(f"action statistics must have {ACTION_DIM} dims, got {q01.shape}")
        if not (np.all(np.isfinite(q01)) and np.all(np.isfinite(q99))):
            raise ModelLoadError("action statistics contain non-finite values")
        return NormStats(q01=q01, q99=q99, mask=mask)

    @staticmethod
    def fit(actions: np.ndarray) -> "NormStats":
        """Statistics from demonstrations [N, 7] (the gripper stays un-normalised)."""
        actions = np.asarray(actions, dtype=np.float64)
        mask = np.array([True] * 6 + [False])
        q01, q99 = np.quantile(actions, 0.01, axis=0), np.quantile(actions, 0.99, axis=0)
        # A dimension that is (nearly) constant, e.g. a deadbanded rotation that is zero in > 98 % of
        # the steps, would get a zero span: its constant value would land on an edge bin and every
        # rare correction would saturate. Widen it to MIN_HALF_SPAN around its centre instead.
        centre, half = 0.5 * (q01 + q99), np.maximum(0.5 * (q99 - q01), MIN_HALF_SPAN)
        return NormStats(np.where(mask, centre - half, q01), np.where(mask, centre + half, q99), mask)


def load_dataset_statistics(path: str | Path) -> dict[str, NormStats]:
    """Read `dataset_statistics.json` (OpenVLA layout: {unnorm_key: {"action": {q01, q99, mask}}})."""
    try:
        data = read_json(path, ModelLoadError)
    except (OSError, json.JSONDecodeError) as err:
        raise ModelLoadError(f"cannot read dataset statistics {path}: {err}") from err
    if not isinstance(data, dict) or not data:
        raise ModelLoadError(f"dataset statistics {path} hold no entries")
    return {key: NormStats.from_json(entry) for key, entry in data.items()}


def select_stats(stats: dict[str, NormStats], unnorm_key: str | None) -> NormStats:
    if unnorm_key is None:
        if len(stats) != 1:
            raise UnknownTaskError(f"several datasets in statistics ({sorted(stats)}); give unnorm_key")
        return next(iter(stats.values()))
    if unnorm_key not in stats:
        raise UnknownTaskError(f"unnorm_key {unnorm_key!r} not in statistics ({sorted(stats)})")
    return stats[unnorm_key]
