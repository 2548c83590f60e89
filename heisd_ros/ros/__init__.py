"""ROS 2 side of heisd_ros: the policy node and its helpers.

The node (`node.PolicyNode`, entry point `node.main`, whose process loop is `node_main`) and what it is made of:
- `params`: node parameters generated from the configuration dataclasses; `param_file` writes them
  out as a documented ROS 2 parameter file; `topics`: the fixed topic names users remap;
- `sync`: approximate-time synchronisation of the camera views and the pose;
- `step`: one control step (observation, decoder, safety checks); `worker`: the inference thread;
- `lifecycle`: the managed-node transitions and the warm-up; `task_control`: episodes, the one
  gate of every command, the ~/run_task action and the ~/enable, ~/reset services;
- `watchdog`: withholds commands while inference overruns its budget;
- `status`: problems, throttled warnings and step counters; `diagnostics`: the /diagnostics message;
- `conversions`: messages <-> numpy (poses, commands, stats; images through
  `heisd_ros.core.image_codec`); `outputs`: the publishers;
- `qos`, `log_bridge`, `standalone_args`: topic QoS, core warnings to /rosout, the standalone CLI.
Replaying bags into the node (`heisd replay`) is a tool, not part of the node: `heisd_ros.replay`.

Nothing is imported here; `topics`, `sync`, `params`, `param_file`, `status`, `watchdog`, `conversions`,
`log_bridge` and `standalone_args` import without rclpy.
"""
