"""The node: one per machine. It runs a worker per CPU (more while calls wait), feeds them the
inputs its head pushes, returns their results and output, pushes its state, and steals when idle."""
