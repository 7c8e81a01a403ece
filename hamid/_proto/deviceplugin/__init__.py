"""Kubelet device plugin API (generated)."""
