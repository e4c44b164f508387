"""lifelong-controller: the edge-side controller of Sedna lifelong-learning jobs."""

__version__ = "0.1.0"
