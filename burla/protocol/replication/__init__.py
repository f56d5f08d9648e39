"""The client's environment as a node replicates it: installed distributions, extra package indexes and
their pins, and local modules.
"""
