"""Serving requests, for any server of the core (the ROS node, the HTTP server): the bounded line of requests
that runs one synthesis at a time, and the intake that checks them one at a time in the order they arrive. Neither
knows what a request is, nor where it came from."""
