"""User values as they travel: pickling, small values as msgpack, packed runs of inputs and results,
large values in parts and by file.
"""
