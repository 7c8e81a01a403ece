"""Integration tests of the simulated kubelet and the kube-scheduler driver."""
