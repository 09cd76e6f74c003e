"""gpuhook: GPU-optional containers. Probe the node, inject whatever GPUs it has."""

__version__ = "0.1.0"
