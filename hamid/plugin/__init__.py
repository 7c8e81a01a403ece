"""`hamid plugin`: GPU discovery, node registration and the kubelet device plugin (grpclib)."""
