"""``/ui``: a read-only web view of the cluster's NUMA alignment, served on the metrics listener.

Pages are rendered from the scheduler's own caches and ledgers (no API-server call per view):
the cluster (GPUs allocated/idle/stranded, pod alignment, prediction scores, recent refits), a
node (an SVG NUMA map), a pod (GPUs, CPUs, predicted and observed NUMA node, refit history).
``docs/ui.md`` describes the figures; :mod:`.routes` mounts the pages, :mod:`.access` the
optional Kubernetes authentication of ``/ui`` and ``/metrics``.
"""
