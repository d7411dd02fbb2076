"""The ROS 2 adapter: the node, its request line and its audio publishers."""
