"""kubelet PodResources API v1 (generated)."""
