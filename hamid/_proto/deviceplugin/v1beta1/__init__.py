"""Kubelet device plugin API v1beta1 (generated: api_pb2, api_grpc)."""
