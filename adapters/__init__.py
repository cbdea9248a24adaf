"""Implementations of the ports; each technology lives in its own subpackage."""
