"""The head: the control plane of a cluster. One aiohttp application holding the node registry,
job admission, the input queue and push scheduling, reaping, history, the dashboard and the fleet."""
