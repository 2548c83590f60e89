"""ROS-free decoding core: nothing under here may import rclpy or message packages."""
