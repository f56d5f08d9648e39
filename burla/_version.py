"""The package's version: a head refuses clients and nodes of another major.minor."""

__version__ = "0.2.0"
