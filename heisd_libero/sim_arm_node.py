"""`heisd-libero sim-arm`: the simulated arm as a ROS 2 node of its own (what launch/sim.launch.py starts).

    heisd-libero sim-arm --ros-args -p episodes:="['0:40', '0:41']" -p time_mode:=arm_time

It publishes and executes what `SimArm` does (heisd_libero/sim_arm.py: the views, `ee_pose`,
`joint_states`, `/clock`; `arm_command` in), driving each episode through the policy node's
`~/run_task`, and publishes every episode's outcome on `episode_result` (std_msgs/Bool, for the
policy node) and `~/episode_report` (std_msgs/String, JSON: success, steps, task time in simulation
seconds, frame-to-command age; exit 1 if one was dropped). Episodes come from the `episodes` parameter at start-up and from
`~/run_episode` (std_srvs/Trigger), which queues the episode the `task` and `init_state` parameters
name (set them with `ros2 param set` first). With `exit_when_done` the node exits once its queue is
empty (the launch file then shuts down).

The arm publishes `/clock`; the policy node must run with use_sim_time and the same control rate
(launch/sim.launch.py passes both).
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import sys
from typing import Any

from heisd_ros.core.errors import ConfigError

NODE_NAME = "sim_arm"
PARAMETERS: dict[str, Any] = {
    "suite": "libero_object",
    "episodes": [""],  # 'task:init_state' entries run at start-up; [''] none (a typed empty list)
    "task": 0,  # ~/run_episode's episode
    "init_state": 40,
    "scene_shift_m": 0.0,
    "scene_seed": 0,  # eval-libero's --scene-seed: the episode's seed is scene_shift_seed(scene_seed, task, init)
    "time_mode": "arm_time",
    "latency_scale": 1.0,
    "control_rate_hz": 20.0,
    "max_steps": 300,
    "policy_node": "/policy_node",
    "node_timeout_s": 180.0,
    "exit_when_done": False,
}


def parse_episodes(entries: list[str]) -> list[tuple[int, int]]:
    """['0:40', '3:41'] -> [(0, 40), (3, 41)]; empty entries are ignored."""
    out = []
    for e in entries:
        if not e.strip():
            continue
        task, sep, init = e.partition(":")
        if not sep or not task.strip().isdigit() or not init.strip().isdigit():
            raise ConfigError(f"episodes entries are 'task:init_state', got {e!r}")
        out.append((int(task), int(init)))
    return out


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering, before MuJoCo is first imported
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    import rclpy
    from std_msgs.msg import String
    from std_srvs.srv import Trigger

    from heisd_libero.sim.libero_env import LiberoEnv, LiberoEnvConfig, scene_shift_seed
    from heisd_libero.sim_arm import SimArm, SimArmConfig
    from heisd_libero.sim_episodes import episode_record, summary
    from heisd_ros.ros.qos import EVENT_QOS

    rclpy.init(args=[sys.argv[0], *args])
    node = rclpy.create_node(NODE_NAME)
    p = {k: node.declare_parameter(k, v).value for k, v in PARAMETERS.items()}
    requests: queue.Queue[tuple[int, int]] = queue.Queue()
    try:
        for episode in parse_episodes(list(p["episodes"])):
            requests.put(episode)
        cfg = SimArmConfig(control_rate_hz=p["control_rate_hz"], max_steps=p["max_steps"], policy_node=p["policy_node"],
                           time_mode=p["time_mode"], latency_scale=p["latency_scale"],
                           scene_shift_m=p["scene_shift_m"])  # fmt: skip
    except ConfigError as e:
        node.get_logger().error(str(e))
        node.destroy_node()
        rclpy.try_shutdown()
        return 1
    report = node.create_publisher(String, "~/episode_report", EVENT_QOS)

    def run_episode(request: Any, response: Any) -> Any:
        episode = (node.get_parameter("task").value, node.get_parameter("init_state").value)
        requests.put(episode)
        response.success, response.message = True, f"queued task {episode[0]} init state {episode[1]}"
        return response

    node.create_service(Trigger, "~/run_episode", run_episode)
    # the arm spins the node (and so answers ~/run_episode) from here on; one environment per task
    env_task = requests.queue[0][0] if requests.queue else p["task"]
    log = node.get_logger()
    try:
        arm = SimArm(LiberoEnv(LiberoEnvConfig(suite=p["suite"], task_index=env_task)), cfg, node=node)
    except Exception as err:  # noqa: BLE001 - e.g. a task the suite does not have
        log.error(f"cannot start the arm on {p['suite']} task {env_task}: {type(err).__name__}: {err}")
        node.destroy_node()
        rclpy.try_shutdown()
        return 1
    failed = 0
    try:
        while rclpy.ok():
            try:
                task, init = requests.get(timeout=0.5)
            except queue.Empty:
                if p["exit_when_done"]:
                    break
                continue
            try:  # an episode that cannot run is reported and dropped; the arm serves the next one
                if env_task != task:
                    arm.env.close()
                    env_task = None  # closed: a failed swap must not close it again
                    arm.env, env_task = LiberoEnv(LiberoEnvConfig(suite=p["suite"], task_index=task)), task
                seed = scene_shift_seed(p["scene_seed"], task, init)
                arm.cfg = dataclasses.replace(cfg, init_state=init, scene_seed=seed)
                if not arm.wait_for_node(p["node_timeout_s"]):
                    raise RuntimeError(f"{p['policy_node']} did not come up in {p['node_timeout_s']:.0f} s")
                out = arm.run_episode()
            except Exception as err:  # noqa: BLE001 - a bad task index, a refused goal, a failed reset
                failed += 1
                log.error(f"task {task} init state {init}: episode dropped: {type(err).__name__}: {err}")
                continue
            figures = summary([episode_record(task, init, out, {}, p["latency_scale"])])
            report.publish(String(data=json.dumps({"task": task, "init_state": init, "scene_seed": seed,
                                                   "ended": out.ended, **figures})))  # fmt: skip
            log.info(f"task {task} init state {init}: {out.ended} in {out.steps} steps ({out.sim_time_s:.1f} s sim)")
    except KeyboardInterrupt:
        pass
    finally:
        if env_task is not None:
            arm.env.close()
        arm.close()
        rclpy.try_shutdown()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
