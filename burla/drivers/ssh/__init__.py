"""The SSH path to a cloud VM: logging in, trusting its host keys, the bootstrap that makes it a node,
and the tunnel back to a head it can't reach.
"""
