"""ROS 2 side of heisd_ros: the policy node and its ROS-free helpers.

- `conversions`: messages <-> numpy (images, poses, commands, stats); the only message-aware module;
- `sync`: approximate-time synchronisation of the camera views and the pose (no ROS imports);
- `params`: node parameters generated from the configuration dataclasses;
- `node`: `PolicyNode` and the `policy_node` entry point.

Nothing is imported here, so `import heisd_ros.ros.sync` stays free of rclpy.
"""
