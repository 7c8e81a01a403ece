"""Keys of a bound ServiceAccount token's ``extra`` in a TokenReview status (Kubernetes facts)."""

from __future__ import annotations

POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
NODE_UID_EXTRA = "authentication.kubernetes.io/node-uid"
