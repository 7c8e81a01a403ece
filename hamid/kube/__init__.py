"""hamid.kube: raw-JSON Kubernetes client, watch-fed caches, event recorder, leader election."""
