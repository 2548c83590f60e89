"""Approximate-time synchronisation of N camera views plus the newest end-effector pose.

ROS-free and pure (no clocks, no threads): the node feeds it stamped items from its
subscription callbacks and asks, once per control tick, for the newest synchronised set.

Policy (what a controller wants, not what a recorder wants):
- The newest `FRAMES_KEPT` frames per view are kept (bounded, as received: nothing is decoded here);
  a frame older than the newest held is dropped as out of order.
- A set is anchored on the view whose newest frame is oldest (the lagging view): that frame, and
  from every other view its newest unused frame stamped at most `slop_s` after it. So when an
  executor busy with other callbacks has taken one view's next frame but not yet the other's, the
  set is the previous pair rather than a refusal. It is accepted when the spread of its stamps is
  at most `slop_s` and no frame is older than `image_staleness_s` relative to `now_s`.
- Each frame is used at most once (like message_filters): a set is offered only when every view
  has a frame newer than the set consumed last. The pose is state, not a frame: the newest pose
  is attached to every set, provided it is not older than `pose_staleness_s`.
- When no set can be formed, `poll` returns None and `reason` says why (missing view, stale,
  out of slop, nothing new), so the node can warn and report it; problems are counted by kind in
  `refusals` (the node's /diagnostics shows them).
- Clock jumps (a bag played in a loop, a simulator reset under sim time): a frame stamped more
  than `image_staleness_s` before the one held for its view (a pose: `pose_staleness_s`) means its
  source restarted; it replaces the held one and the view's "used" mark is cleared, otherwise the
  new timeline would never be offered. A `now_s` that goes back drops what is then stamped too
  far in the future (frames with their "used" marks, the pose). Each such
  restart is counted in `clock_resets` and described in `events`. Safety does not depend on it:
  every set is still checked against `now_s` for staleness (and for stamps in the future).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Generic, Sequence, TypeVar

from heisd_ros.core.errors import ConfigError

T = TypeVar("T")

# Reasons why no set is available. Problems are worth a warning; IDLE is the normal state
# between two frames.
IDLE = "no new frames since the last step"
NOTHING_HEARD = "no frame or pose received yet"
CLOCK_JUMP_TOLERANCE_S = 1e-3
"""A `now_s` further back than this from the previous poll is a clock jump."""
FRAMES_KEPT = 3
"""Frames held per view: enough to pair the previous frames when one view's newest came a period
early; few, so a flood of large frames holds little memory."""
REFUSAL_KINDS = ("missing_view", "stale_image", "future_image", "out_of_sync", "no_pose", "stale_pose",
                 "future_pose")
"""The kinds of problem `poll` counts in `refusals`."""


@dataclass(frozen=True)
class Stamped(Generic[T]):
    """One received item and its header stamp (seconds)."""

    stamp_s: float
    data: T


@dataclass(frozen=True)
class SyncedSet:
    """The inputs of one control step.

    frames: view name -> newest frame of that view (in the configured view order).
    pose: the newest pose (its `data` is whatever the caller stored, e.g. a PoseStamped).
    stamp_s: newest stamp among the frames and the pose (the command's header stamp).
    """

    frames: dict[str, Stamped[Any]]
    pose: Stamped[Any]
    stamp_s: float

    @property
    def image_stamp_s(self) -> float:
        """Newest image stamp of the set."""
        return max(f.stamp_s for f in self.frames.values())

    @property
    def spread_s(self) -> float:
        stamps = [f.stamp_s for f in self.frames.values()]
        return max(stamps) - min(stamps)


@dataclass(frozen=True)
class SyncConfig:
    """Limits of the synchroniser; all in seconds."""

    views: tuple[str, ...]
    slop_s: float = 0.05
    """Largest allowed spread between the stamps of the views of one set."""
    image_staleness_s: float = 0.5
    """Frames older than this (relative to now) are never used."""
    pose_staleness_s: float = 0.5
    """A pose older than this (relative to now) is never used."""

    def __post_init__(self) -> None:
        if not self.views or len(set(self.views)) != len(self.views):
            raise ConfigError("sync needs at least one view and unique view names")
        for name in ("slop_s", "image_staleness_s", "pose_staleness_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ConfigError(f"{name} must be finite and >= 0, got {value}")


class ApproxTimeSync:
    """Depth-1 approximate-time synchroniser over `cfg.views` plus a pose (see module doc)."""

    def __init__(self, cfg: SyncConfig) -> None:
        self.cfg = cfg
        self._frames: dict[str, deque[Stamped[Any]]] = {}
        """View -> its newest frames, oldest first (at most FRAMES_KEPT)."""
        self._pose: Stamped[Any] | None = None
        self._consumed: dict[str, float] = {}
        self.reason: str = NOTHING_HEARD
        self.problem = False
        self.heard = False
        """Whether any frame or pose was ever offered (since construction or `clear`): before that the
        node is waiting for its sources to come up, which is not a rejected step."""
        self.dropped_out_of_order = 0
        self.refusals: Counter = Counter()
        """Polls that found a problem, by kind (REFUSAL_KINDS)."""
        self.clock_resets = 0
        self.events: list[str] = []
        """Clock jumps seen since the caller last emptied the list."""
        self._last_now: float | None = None

    def reconfigure(self, cfg: SyncConfig) -> None:
        """Change the limits (views must stay the same: they shape the subscriptions)."""
        if cfg.views != self.cfg.views:
            raise ConfigError("the views of a running synchroniser cannot change")
        self.cfg = cfg

    def add_frame(self, view: str, stamp_s: float, data: Any) -> bool:
        """Offer a frame; returns False if it was dropped (unknown view, not newer than held)."""
        if view not in self.cfg.views:
            return False
        held = self._frames.get(view)
        if held and stamp_s < held[-1].stamp_s:
            back = held[-1].stamp_s - stamp_s
            if back <= self.cfg.image_staleness_s:
                self.dropped_out_of_order += 1
                return False
            self._restart(f"stamps of view {view!r} jumped back {back:.3f} s", view)
        self._frames.setdefault(view, deque(maxlen=FRAMES_KEPT)).append(Stamped(float(stamp_s), data))
        self.heard = True
        return True

    def add_pose(self, stamp_s: float, data: Any) -> bool:
        """Offer a pose; an older pose than the one held is dropped (unless it is a clock jump)."""
        if self._pose is not None and stamp_s < self._pose.stamp_s:
            back = self._pose.stamp_s - stamp_s
            if back <= self.cfg.pose_staleness_s:
                self.dropped_out_of_order += 1
                return False
            self._restart(f"pose stamps jumped back {back:.3f} s", None)
        self._pose = Stamped(float(stamp_s), data)
        self.heard = True
        return True

    def _restart(self, why: str, view: str | None) -> None:
        """A source (one view, or the pose with view None) restarted its timeline."""
        if view is not None:
            self._frames.pop(view, None)
            self._consumed.pop(view, None)
        self.clock_resets += 1
        self.events.append(why)

    def _clock_went_back(self, now_s: float, back_s: float) -> None:
        """Forget what lies beyond the future tolerance of the new clock (it belongs to the old timeline)."""
        for v, frames in list(self._frames.items()):
            if frames[-1].stamp_s - now_s > self.cfg.image_staleness_s:
                del self._frames[v]
                self._consumed.pop(v, None)
        if self._pose is not None and self._pose.stamp_s - now_s > self.cfg.pose_staleness_s:
            self._pose = None
        self.clock_resets += 1
        self.events.append(f"clock jumped back {back_s:.3f} s")

    def clear(self) -> None:
        """Forget all frames and the pose (e.g. when an episode restarts)."""
        self._frames.clear()
        self._pose = None
        self._consumed.clear()
        self._last_now = None
        self.heard = False
        self.reason, self.problem = NOTHING_HEARD, False

    def poll(self, now_s: float) -> SyncedSet | None:
        """The newest unused synchronised set, or None.

        When None, `self.reason` says why and `self.problem` tells whether that is a fault worth a
        warning (missing/stale view or pose, views out of slop) or the normal wait between frames.
        Does not consume the set: call `consume(s)` once it is handed to the policy.
        """
        cfg = self.cfg
        if self._last_now is not None and now_s < self._last_now - CLOCK_JUMP_TOLERANCE_S:
            self._clock_went_back(now_s, self._last_now - now_s)
        self._last_now = now_s
        if not self.heard:
            return self._none(NOTHING_HEARD)
        missing = [v for v in cfg.views if v not in self._frames]
        if missing:
            return self._none(f"missing view(s) {missing}: no frame received", "missing_view")
        newest = {v: self._frames[v][-1] for v in cfg.views}
        for v, f in newest.items():
            age = now_s - f.stamp_s
            if age > cfg.image_staleness_s:
                return self._none(
                    f"stale image on view {v!r}: {age:.3f} s old > limit {cfg.image_staleness_s:.3f} s", "stale_image"
                )
            if age < -cfg.image_staleness_s:
                return self._none(f"image on view {v!r} stamped {-age:.3f} s in the future", "future_image")
        used = [v for v in cfg.views if newest[v].stamp_s <= self._consumed.get(v, -math.inf)]
        if len(used) == len(cfg.views):
            return self._none(IDLE)
        if used:
            return self._none(f"waiting for a new frame on view(s) {used}")
        frames = self._paired(newest)
        for v, f in frames.items():  # a paired frame is older than its view's newest
            age = now_s - f.stamp_s
            if age > cfg.image_staleness_s:
                return self._none(
                    f"stale image on view {v!r}: {age:.3f} s old > limit {cfg.image_staleness_s:.3f} s", "stale_image"
                )
        stamps = [f.stamp_s for f in frames.values()]
        spread = max(stamps) - min(stamps)
        if spread > cfg.slop_s:
            return self._none(
                f"views out of sync: stamps spread {spread:.3f} s > slop {cfg.slop_s:.3f} s", "out_of_sync"
            )
        if self._pose is None:
            return self._none("no end-effector pose received yet", "no_pose")
        pose_age = now_s - self._pose.stamp_s
        if pose_age > cfg.pose_staleness_s:
            return self._none(
                f"stale pose: {pose_age:.3f} s old > limit {cfg.pose_staleness_s:.3f} s", "stale_pose"
            )
        if pose_age < -cfg.pose_staleness_s:
            return self._none(f"pose stamped {-pose_age:.3f} s in the future", "future_pose")
        self.reason, self.problem = "", False
        return SyncedSet(frames=frames, pose=self._pose, stamp_s=max(max(stamps), self._pose.stamp_s))

    def _paired(self, newest: dict[str, Stamped[Any]]) -> dict[str, Stamped[Any]]:
        """The set anchored on the lagging view's newest frame: from every view, its newest unused
        frame stamped at most slop_s after the anchor (the view's newest when none is)."""
        anchor = min(f.stamp_s for f in newest.values())
        frames = {}
        for v in self.cfg.views:
            consumed = self._consumed.get(v, -math.inf)
            fitting = [f for f in self._frames[v] if consumed < f.stamp_s <= anchor + self.cfg.slop_s]
            frames[v] = fitting[-1] if fitting else newest[v]
        return frames

    def consume(self, synced: SyncedSet) -> None:
        """Mark the frames of `synced` as used: they will not be offered again."""
        for v, f in synced.frames.items():
            self._consumed[v] = f.stamp_s

    def _none(self, reason: str, problem: str = "") -> None:
        """No set: `reason` says why; `problem` is the refusal's kind ('' = the normal wait)."""
        self.reason, self.problem = reason, bool(problem)
        if problem:
            self.refusals[problem] += 1
        return None


def make_sync(views: Sequence[str], slop_s: float, image_staleness_s: float, pose_staleness_s: float) -> ApproxTimeSync:
    """Convenience constructor."""
    return ApproxTimeSync(SyncConfig(tuple(views), slop_s, image_staleness_s, pose_staleness_s))
