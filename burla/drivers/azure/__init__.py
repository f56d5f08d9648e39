"""Azure: the Resource Manager driver, its credentials and settings, VM sizes, permissions, checks and baked images."""
