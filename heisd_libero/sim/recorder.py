"""Demonstration episodes: LIBERO-layout HDF5 files and rosbag2 (MCAP) export (docs/design.md §4, §9).

HDF5 layout (one file per task, as LIBERO ships its demos)::

    data                      attrs: problem_info (JSON), env_args (JSON), bddl_file_name,
                                     macros_image_convention ('opencv' = upright), num_demos, total,
                                     suite, task_index, task_name, instruction
    data/demo_i               attrs: num_samples, init_state, init_state_index, variant, seed,
                                     perturb_xy_m
        actions   [T, 7] float64    dones [T] uint8    rewards [T] uint8    states [T, S] float64
        robot_states [T, 9]  (gripper qpos 2, ee pos 3, ee quat 4)
        obs/agentview_rgb [T, H, W, 3] uint8   obs/eye_in_hand_rgb [T, H, W, 3] uint8
        obs/ee_pos [T, 3]  obs/ee_ori [T, 3] (axis-angle)  obs/ee_states [T, 6]  obs/ee_quat [T, 4]
        obs/gripper_states [T, 2]  obs/joint_states [T, 7]

The rosbag2 export puts one episode on the policy node's input topics (config/policy.yaml) at the
20 Hz control rate, plus the demonstrated command on the node's output topic; bag I/O itself lives
in `heisd_ros.pipeline.bags`.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from heisd_ros.core.errors import DataFileError, HeisdError
from heisd_ros.pipeline.bags import (
    ARM_COMMAND, BOOL, IMAGE, JOINT_STATE, NS_PER_S, POSE, STRING, BagError, BagTopics, BagWriter,
    arm_command_msg, header, image_msg, joint_state_msg, pose_msg,
)
from heisd_ros.pipeline.data_checks import read_dataset
from heisd_libero.sim.expert import rotation_error

HDF5_VIEWS: dict[str, str] = {"agentview": "agentview_rgb", "wrist": "eye_in_hand_rgb"}
"""Our view name -> LIBERO's HDF5 observation key."""
CONTROL_HZ = 20.0
PARTIAL_DEMO = "_partial_demo"


class DemoFileError(HeisdError):
    """A demonstration file or bag cannot be written or read back."""


@dataclass
class Episode:
    """One recorded episode; arrays are per control step t (the observation *before* action t)."""

    actions: np.ndarray  # [T, 7]
    ee_pos: np.ndarray  # [T, 3] m
    ee_quat: np.ndarray  # [T, 4] (x, y, z, w)
    ee_rot: np.ndarray  # [T, 3, 3] grip site
    gripper_qpos: np.ndarray  # [T, 2] m
    joint_pos: np.ndarray  # [T, 7] rad
    states: np.ndarray  # [T, S] flattened MuJoCo states
    images: dict[str, np.ndarray] = field(default_factory=dict)  # view -> [T, H, W, 3] uint8
    instruction: str = ""
    success: bool = False
    init_state_index: int = -1
    variant: int = 0
    seed: int = 0
    perturb_xy_m: float = 0.0

    @property
    def length(self) -> int:
        return int(self.actions.shape[0])


class EpisodeBuffer:
    """Collects (observation, action, state) per step and stacks them into an `Episode`."""

    def __init__(self) -> None:
        self._rows: dict[str, list[np.ndarray]] = {k: [] for k in ("actions", "ee_pos", "ee_quat", "ee_rot", "gripper_qpos", "joint_pos", "states")}

    def append(self, obs: Any, action: np.ndarray, state: np.ndarray) -> None:
        """obs: a SimObservation taken before `action`; state: the MuJoCo state it was taken in."""
        for key, value in (
            ("actions", action), ("ee_pos", obs.ee_pos), ("ee_quat", obs.ee_quat), ("ee_rot", obs.ee_rot),
            ("gripper_qpos", obs.gripper_qpos), ("joint_pos", obs.joint_pos), ("states", state),
        ):
            self._rows[key].append(np.asarray(value, dtype=np.float64))

    def __len__(self) -> int:
        return len(self._rows["actions"])

    def build(self, **meta: Any) -> Episode:
        return Episode(**{k: np.stack(v) for k, v in self._rows.items()}, **meta)


def axis_angle(rot: np.ndarray) -> np.ndarray:
    """[T, 3] axis-angle of [T, 3, 3] rotations (LIBERO's ee_ori)."""
    eye = np.eye(3)
    return np.stack([rotation_error(r, eye) for r in rot]) if len(rot) else np.zeros((0, 3))


# ---------------------------------------------------------------------------------------------
# HDF5


class Hdf5DemoWriter:
    """Appends successful episodes to one task's LIBERO-layout HDF5 file (resumable)."""

    def __init__(self, path: Path, attrs: dict[str, Any]) -> None:
        import h5py

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._file = h5py.File(self.path, "a")
        except OSError as err:
            raise DemoFileError(f"cannot open {self.path}: {err}") from err
        data = self._file.require_group("data")
        for key, value in attrs.items():
            data.attrs[key] = json.dumps(value) if isinstance(value, dict) else value
        data.attrs["macros_image_convention"] = "opencv"
        data.attrs.setdefault("num_demos", 0)
        data.attrs.setdefault("total", 0)
        if PARTIAL_DEMO in data:  # left by a writer killed mid-episode: never half a demo
            del data[PARTIAL_DEMO]
        self._data = data

    def existing(self) -> dict[tuple[int, int], tuple[str, int]]:
        """(init_state_index, variant) -> (demo name, length) of the episodes already in the file."""
        return {
            (int(g.attrs["init_state_index"]), int(g.attrs["variant"])): (name, int(g.attrs["num_samples"]))
            for name, g in self._data.items()
        }

    def write(self, episode: Episode, init_state: np.ndarray | None = None, compression: str | None = "gzip") -> str:
        """Add `episode` as the next data/demo_i; returns its name. Flushes to disk.

        The demo is built under a scratch name and renamed when complete, so a process killed
        mid-write leaves no partial demo_i behind (the scratch group is dropped on reopening).
        """
        name = f"demo_{len(self._data)}"
        group = self._data.create_group(PARTIAL_DEMO)
        T = episode.length
        group.attrs.update(
            num_samples=T, init_state_index=episode.init_state_index, variant=episode.variant,
            seed=episode.seed, perturb_xy_m=episode.perturb_xy_m,
        )
        group.attrs["init_state"] = episode.states[0] if init_state is None else init_state
        dones = np.zeros(T, dtype=np.uint8)
        dones[-1] = int(episode.success)
        group.create_dataset("actions", data=episode.actions)
        group.create_dataset("dones", data=dones)
        group.create_dataset("rewards", data=dones.copy())
        group.create_dataset("states", data=episode.states)
        group.create_dataset("robot_states", data=np.concatenate([episode.gripper_qpos, episode.ee_pos, episode.ee_quat], axis=1))
        obs = group.create_group("obs")
        ori = axis_angle(episode.ee_rot)
        for key, value in (
            ("ee_pos", episode.ee_pos), ("ee_ori", ori), ("ee_states", np.concatenate([episode.ee_pos, ori], axis=1)),
            ("ee_quat", episode.ee_quat), ("gripper_states", episode.gripper_qpos), ("joint_states", episode.joint_pos),
        ):
            obs.create_dataset(key, data=value)
        for view, images in episode.images.items():
            obs.create_dataset(HDF5_VIEWS[view], data=images, compression=compression, chunks=(1, *images.shape[1:]))
        self._data.move(PARTIAL_DEMO, name)
        self._data.attrs["num_demos"] = len(self._data)
        self._data.attrs["total"] = int(self._data.attrs["total"]) + T
        self._file.flush()
        return name

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "Hdf5DemoWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_hdf5_demos(path: Path, with_images: bool = True) -> tuple[dict[str, Any], list[Episode]]:
    """(file attributes, episodes in demo order) of a LIBERO-layout HDF5 file; every dataset's
    declared size is checked before it is read (`read_dataset`)."""
    import h5py

    try:
        f = h5py.File(path, "r")
    except OSError as err:
        raise DemoFileError(f"cannot read {path}: {err}") from err
    try:
        with f:
            return _read_open(path, f, with_images)
    except DataFileError as err:
        raise DemoFileError(str(err)) from err


def _read_open(path: Path, f: Any, with_images: bool) -> tuple[dict[str, Any], list[Episode]]:
    data = f["data"]
    attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in data.attrs.items()}
    instruction = str(attrs.get("instruction", ""))
    names = sorted(data.keys(), key=lambda n: int(n.split("_")[1]))
    episodes = []
    for name in names:
        g = data[name]
        read = functools.partial(read_dataset, path, g)
        robot = read("robot_states")
        images = {v: read(f"obs/{k}") for v, k in HDF5_VIEWS.items() if with_images and f"obs/{k}" in g}
        episodes.append(Episode(
            actions=read("actions"), ee_pos=read("obs/ee_pos"), ee_quat=robot[:, 5:9],
            ee_rot=_rotations_from_axis_angle(read("obs/ee_ori")), gripper_qpos=read("obs/gripper_states"),
            joint_pos=read("obs/joint_states"), states=read("states"), images=images, instruction=instruction,
            success=bool(read("dones")[-1]), init_state_index=int(g.attrs["init_state_index"]),
            variant=int(g.attrs["variant"]), seed=int(g.attrs["seed"]), perturb_xy_m=float(g.attrs["perturb_xy_m"]),
        ))
    return attrs, episodes


def _rotations_from_axis_angle(vecs: np.ndarray) -> np.ndarray:
    """[T, 3, 3] from [T, 3] axis-angle (Rodrigues)."""
    out = np.empty((len(vecs), 3, 3))
    for i, v in enumerate(vecs):
        angle = float(np.linalg.norm(v))
        if angle < 1e-12:
            out[i] = np.eye(3)
            continue
        k = v / angle
        K = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
        out[i] = np.eye(3) + np.sin(angle) * K + (1 - np.cos(angle)) * K @ K
    return out


# ---------------------------------------------------------------------------------------------
# rosbag2 (MCAP)


def export_mcap(episode: Episode, path: Path, topics: BagTopics = BagTopics(), start_ns: int = NS_PER_S) -> int:
    """Write `episode` as a rosbag2 MCAP directory at `path` (must not exist) on the node's topics at
    the control rate, with the demonstrated action as ArmCommand; returns messages written."""
    dt_ns = int(round(1e9 / CONTROL_HZ))
    try:
        with BagWriter(path) as bag:
            for _, topic in topics.images:
                bag.add(topic, IMAGE)
            bag.add(topics.ee_pose, POSE)
            bag.add(topics.instruction, STRING, latched=True)
            bag.add(topics.episode_result, BOOL)
            bag.add(topics.command, ARM_COMMAND)
            bag.add(topics.joint_states, JOINT_STATE)
            T = bag.ts.types
            bag.write(topics.instruction, start_ns, T[STRING](data=episode.instruction))
            for t in range(episode.length):
                stamp = start_ns + t * dt_ns
                hdr = header(stamp, topics.frame_id)
                for view, topic in topics.images:
                    if view in episode.images:
                        bag.write(topic, stamp, image_msg(hdr, episode.images[view][t]))
                bag.write(topics.ee_pose, stamp, pose_msg(hdr, episode.ee_pos[t], episode.ee_quat[t]))
                fingers = joint_state_msg(hdr, topics.finger_joints, episode.gripper_qpos[t])
                bag.write(topics.joint_states, stamp, fingers)
                bag.write(topics.command, stamp, arm_command_msg(hdr, t, episode.actions[t], "expert", "expert"))
            bag.write(topics.episode_result, start_ns + episode.length * dt_ns, T[BOOL](data=bool(episode.success)))
    except BagError as err:
        raise DemoFileError(str(err)) from err
    return sum(bag.counts.values())


# ---------------------------------------------------------------------------------------------
# rollout


def record_episode(env: Any, expert: Any, init_state_index: int, variant: int = 0, seed: int = 0,
                   perturb_xy_m: float = 0.0, max_steps: int = 300) -> Episode:
    """Run `expert` in `env` (a LiberoEnv) from one init state; returns the episode, images included
    only when it succeeded.

    Two passes: physics alone decides success (a camera render costs ~10x a physics step on CPU),
    then the kept episode's images are rendered from its saved MuJoCo states (same pixels as
    rendering while stepping: an image depends on the state only).
    """
    obs = env.reset(init_state_index, perturb_xy_m=perturb_xy_m, seed=seed)
    expert.reset(env.goal, seed=seed)
    buffer = EpisodeBuffer()
    success = False
    for _ in range(max_steps):
        action = expert.act(obs)
        buffer.append(obs, action, env.get_state())
        obs, success = env.step(expert.explore(action), render=False)
        if success:
            break
    meta = dict(instruction=env.instruction, success=success, init_state_index=init_state_index,
                variant=variant, seed=seed, perturb_xy_m=perturb_xy_m)
    episode = buffer.build(**meta)
    if success:
        frames: dict[str, list[np.ndarray]] = {}
        for state in episode.states:
            env.set_state(state)
            for view, image in env.render_views().items():
                frames.setdefault(view, []).append(image)
        episode.images = {view: np.stack(images) for view, images in frames.items()}
    return episode
