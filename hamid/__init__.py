"""hamid: a HAMi-compatible NVIDIA vGPU stack for Kubernetes with NUMA alignment and scheduler refit."""

__version__ = "0.2.0"
