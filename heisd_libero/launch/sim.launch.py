"""LIBERO as a ROS 2 arm: the simulated arm and the policy node, the closed loop a user's stack would run.

    ros2 launch heisd_libero/launch/sim.launch.py                          # heisd, task 0 init state 40
    ros2 launch heisd_libero/launch/sim.launch.py method:=ar episodes:="['0:40', '0:41']" time_mode:=lockstep
    ros2 launch heisd_libero/launch/sim.launch.py exit_when_done:=false   # then: ros2 service call /sim_arm/run_episode std_srvs/srv/Trigger

Run from a checkout (the workbench is a pip package, not an ament one, so the launch file is named by
its path). The policy node comes from heisd_ros' own launch file (policy.launch.py, included: the
node as a user's stack starts it) with the shipped mini policy of this checkout (models/mini_libero)
and the simulator's settings over its parameter file (heisd_libero/config/sim_policy.yaml:
use_sim_time, 20 Hz, commanding on). The arm is `heisd-libero sim-arm` (heisd_libero/sim_arm_node.py):
it runs `episodes` through the node's ~/run_task and reports each on /sim_arm/episode_report; with
exit_when_done (default) it exits after the last one, and either process ending ends the launch.
The database must hold the episodes' tasks: `heisd-libero sim-demo` builds the one of task 0 (artifacts/mini_libero_db/...).
"""

from pathlib import Path

from launch.actions import (
    DeclareLaunchArgument,
    EmitEvent,
    IncludeLaunchDescription,
    OpaqueFunction,
    RegisterEventHandler,
)
from launch.event_handlers import OnProcessExit
from launch.events import Shutdown
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

from launch import LaunchDescription

CHECKOUT = Path(__file__).resolve().parents[2]
MINI = CHECKOUT / "models" / "mini_libero"
OVERLAY = Path(__file__).resolve().parents[1] / "config" / "sim_policy.yaml"

# launch argument -> (default, what it is); the policy's (passed to policy.launch.py)
POLICY_ARGUMENTS = {
    "method": ("heisd", "decoding method: ar, drafter, specvla, retrieval or heisd"),
    "model_dir": (str(MINI / "vla"), "the policy's checkpoint"),
    "drafter_dir": (str(MINI / "drafter"), "the drafter"),
    "calibration_path": (str(MINI / "calibration.json"), "the operating point"),
    "db_path": (str(CHECKOUT / "artifacts" / "mini_libero_db" / "libero_object_task0"),
                "the demonstration database of the episodes' tasks"),
}
# launch argument -> (default, what it is); the arm's (heisd_libero/sim_arm_node.py PARAMETERS)
ARM_ARGUMENTS = {
    "episodes": ("['0:40']", "episodes run at start-up, a list of 'task:init_state'"),
    "suite": ("libero_object", "LIBERO suite"),
    "time_mode": ("arm_time", "lockstep or arm_time"),
    "latency_scale": ("1.0", "arm_time: the measured latency times this (a larger model)"),
    "scene_shift_m": ("0.0", "objects shifted by a seeded U(-d, d) in x and y"),
    "scene_seed": ("0", "eval-libero's --scene-seed"),
    "max_steps": ("300", "control periods per episode"),
    "exit_when_done": ("true", "exit (and shut the launch down) after the last queued episode"),
}
ARM_TYPES = {"latency_scale": float, "scene_shift_m": float, "scene_seed": int, "max_steps": int}
"""The control rate is sim_policy.yaml's for the node and the arm's default for the arm (20 Hz, LIBERO's)."""


def _nodes(context, *args, **kwargs):
    def value(name: str) -> str:
        return LaunchConfiguration(name).perform(context)

    policy = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(PathJoinSubstitution([FindPackageShare("heisd_ros"), "launch",
                                                            "policy.launch.py"])),
        launch_arguments={**{name: value(name) for name in POLICY_ARGUMENTS}, "use_sim_time": "true",
                          "params_overlay": str(OVERLAY)}.items(),
    )
    params = {name: ARM_TYPES.get(name, str)(value(name)) for name in ARM_ARGUMENTS if name != "exit_when_done"}
    # a YAML list as text -> strings; [''] for none (an empty list has no parameter type)
    params["episodes"] = [e.strip(" '\"") for e in value("episodes").strip("[] ").split(",") if e.strip(" '\"")] or [""]
    params["exit_when_done"] = value("exit_when_done").strip().lower() in ("true", "1", "yes")
    arm = Node(executable="heisd-libero", arguments=["sim-arm"], name="sim_arm", parameters=[params],
               output="screen", emulate_tty=True)
    # either process ending ends the launch: the arm after its last episode, or a node that died
    done = RegisterEventHandler(OnProcessExit(on_exit=[EmitEvent(event=Shutdown())]))
    return [policy, arm, done]


def generate_launch_description() -> LaunchDescription:
    arguments = [DeclareLaunchArgument(name, default_value=default, description=text)
                 for name, (default, text) in {**POLICY_ARGUMENTS, **ARM_ARGUMENTS}.items()]
    return LaunchDescription(arguments + [OpaqueFunction(function=_nodes)])
