"""The one typed error for malformed input anywhere in the model layer."""

from __future__ import annotations


class InvalidInput(ValueError):
    """Input (an annotation, a config, a JSON body) is malformed.

    The message says what was wrong and where (for example the annotation key and the value);
    nothing that raises it returns half-parsed data.
    """
