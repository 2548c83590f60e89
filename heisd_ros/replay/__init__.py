"""`heisd replay`'s machinery: a rosbag2 recording played into a running (or started) policy node
over real topics, and what the node publishes recorded. The command line is `heisd_ros.tools.replay`.

- `bag_stream`: which bag topics feed which input of the node, and the bag streamed as synchronised
  step segments (ROS-free);
- `playback`: `Player` publishes the segments, `Recorder` records the node's outputs (rclpy lazily);
- `target`: the node replayed into: its configuration, its resolved topics, the node found on the
  graph, the warm-up of a node the replay starts.

This package sits above `heisd_ros.ros` (it reuses the node's sync, topics and parameters) and below
`heisd_ros.tools`; the node itself never imports it. Nothing is imported here.
"""
