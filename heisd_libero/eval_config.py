"""What `heisd-libero eval-libero` runs: its configuration and the init states each kind of run may use
(the evaluation, its closed loop and its report read it; nothing here runs anything)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from heisd_ros.core.config import METHODS
from heisd_ros.core.errors import ConfigError
from heisd_ros.pipeline.libero_runs import EVAL_INIT_STATES
from heisd_ros.pipeline.method_variants import MethodVariant

PURPOSE_INIT_STATES = {"evaluation": tuple(EVAL_INIT_STATES), "calibration": tuple(range(20, 40))}
"""Which LIBERO init states each kind of run may use."""
MAX_SCENE_SHIFT_M = 0.02
"""The largest sealed-scene shift per axis, metres: a few centimetres vary a scene, not its layout;
above it shifted objects may overlap and MuJoCo throws them apart (none of 900 LIBERO-Object scenes
at 0.02 m, 0.7 % at 0.03 m, 6.6 % at 0.05 m)."""


@dataclass(frozen=True)
class EvalLiberoConfig:
    """What `heisd-libero eval-libero` runs (defaults: the mini artifacts on LIBERO-Object)."""

    model_dir: str = "artifacts/mini_vla"
    """VLA checkpoint directory, or 'tiny' (the test policy, built under tiny_dir)."""
    drafter_dir: str = "artifacts/mini_drafter"
    db_path: str = "artifacts/mini_db"
    calibration_path: str = "artifacts/mini_calibration.json"
    tiny_dir: str = "artifacts/tiny"
    suite: str = "libero_object"
    tasks: tuple[int, ...] = tuple(range(10))
    init_states: tuple[int, ...] = tuple(EVAL_INIT_STATES)
    """LIBERO init state indices: 40-49 for an evaluation, 20-39 for a calibration run."""
    methods: tuple[str, ...] = METHODS
    """Methods and variant names, in the order they take turns."""
    variants: tuple[MethodVariant, ...] = ()
    """Named methods with changed DecoderConfig fields (ablations, candidate operating points)."""
    subset_methods: tuple[str, ...] = ()
    """Methods run only on `subset_init_states` (beside `methods`, in the same run and report)."""
    subset_init_states: tuple[int, ...] = ()
    purpose: str = "evaluation"
    """'evaluation' (init states 40-49) or 'calibration' (init states 20-39: held out from the
    demonstrations at 0-19 the database and the policy are built from, and from the evaluation)."""
    max_steps: int = 280
    """Control steps per episode (20 Hz) before it counts as a failure (LIBERO-Object's usual 280)."""
    camera_size_px: int = 128
    seed: int = 0
    scene_shift_m: float = 0.0
    """Sealed scenes: after the init state, every movable object is shifted by U(-d, d) metres in x and
    y (0 = LIBERO's init states as shipped; at most MAX_SCENE_SHIFT_M)."""
    scene_seed: int = 0
    """Seed of the sealed scenes: with the task and init state it fixes each pair's shift."""
    threads: int = 1
    """torch CPU threads (fixed, so step latencies are comparable)."""
    dtype: str = "float32"
    unknown_task: str = "error"
    """A task missing from the database: 'error' or 'drafter' (decode without retrieval)."""
    shadow_ar: bool = True
    """On every lossy step (a skip, a relaxed acceptance) also decode greedy `ar` on the same
    observation, outside the timed call, and log its tokens: the per-step deviation from ar."""
    shadow_strict_every: int = 1
    """With `shadow_ar`, also shadow strict steps (every method but `ar`): 0 never, 1 every strict step,
    N the 1st, (N+1)-th, ... strict step of an episode. A shadowed strict step is checked against
    greedy ar along the method's own path, where no step of ar's episode has its input."""
    online_methods: tuple[str, ...] = ()
    """Labels that keep episode feedback across episodes (Alg. 1's online stage, over the run's
    task sequence: --tasks order, then --init-states order). Every other label starts each episode
    from the configured operating point."""
    out: str = "benchmarks/libero_object.json"
    plots_dir: str = ""
    progress: bool = True

    def __post_init__(self) -> None:
        if self.purpose not in PURPOSE_INIT_STATES:
            raise ConfigError(f"purpose must be one of {sorted(PURPOSE_INIT_STATES)}, got {self.purpose!r}")
        allowed = PURPOSE_INIT_STATES[self.purpose]
        bad = sorted(set(self.init_states) - set(allowed))
        if bad:
            raise ConfigError(f"init states {bad} refused for {self.purpose}: it uses {allowed[0]}-{allowed[-1]} "
                              "(0-19 are the demonstrations, 20-39 calibration, 40-49 evaluation)")
        if not self.tasks or not self.init_states:
            raise ConfigError("need at least one task and one init state")
        if min(self.tasks) < 0:
            raise ConfigError("task indices must be >= 0")
        labels = (*METHODS, *(v.name for v in self.variants))
        everything = (*self.methods, *self.subset_methods)
        unknown = [m for m in everything if m not in labels]
        if not self.methods or unknown or len(set(everything)) != len(everything):
            raise ConfigError(f"methods must be distinct names from {labels}, got {list(everything)}")
        if bool(self.subset_methods) != bool(self.subset_init_states) or \
                not set(self.subset_init_states) <= set(self.init_states):
            raise ConfigError("--subset-methods needs --subset-init-states, a part of --init-states")
        if not set(self.online_methods) <= set(everything):
            raise ConfigError(f"--online-methods {list(self.online_methods)} must be among the run's methods")
        if self.shadow_strict_every < 0:
            raise ConfigError("--shadow-strict-every must be >= 0 (0: never shadow a strict step)")
        if self.max_steps < 1 or self.threads < 1:
            raise ConfigError("max_steps and threads must be >= 1")
        if not (math.isfinite(self.scene_shift_m) and 0.0 <= self.scene_shift_m <= MAX_SCENE_SHIFT_M):
            raise ConfigError(f"--scene-shift-m must be in [0, {MAX_SCENE_SHIFT_M}] m, got {self.scene_shift_m}")
        if self.scene_seed < 0:
            raise ConfigError("--scene-seed must be >= 0")
        if not self.out.endswith(".json"):
            raise ConfigError("--out must name a .json file")

    @property
    def log_path(self) -> Path:
        return Path(self.out).with_suffix(".jsonl")

    def methods_at(self, init_state: int) -> list[str]:
        """The method labels that run on `init_state`, in turn order."""
        return [*self.methods, *(self.subset_methods if init_state in self.subset_init_states else ())]

    def triples(self) -> list[tuple[int, int, str]]:
        """Every (task, init state, method label) of the run."""
        return [(t, k, m) for t in self.tasks for k in self.init_states for m in self.methods_at(k)]

    @property
    def labels(self) -> list[str]:
        return [*self.methods, *self.subset_methods]
