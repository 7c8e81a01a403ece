"""The embedded in-memory Kubernetes API server (``hamid sim apiserver``, the demo, the tests).

Modules, named after the API server's own parts: ``server`` (HTTP routing and verbs), ``store``
(objects, resourceVersions, watch fan-out), ``resources`` (served kinds and discovery), ``patch``,
``select`` (label and field selectors), ``tokens`` (TokenReview), ``faults`` (fault injection),
``errors`` (``Status`` bodies), ``cli`` (the standalone command).
"""

from hamidsim.apiserver.server import ApiServer
from hamidsim.apiserver.tokens import TokenIdentity

__all__ = ["ApiServer", "TokenIdentity"]
