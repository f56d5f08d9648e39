"""A node's worker processes: the worker itself, the fork server that starts them, the pool that
watches them, their socket and their output.
"""
