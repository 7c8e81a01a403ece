"""The device plugin's refusals to kubelet, with messages bounded for gRPC."""

from __future__ import annotations

from collections.abc import Sequence


class AllocationError(Exception):
    """An Allocate/GetPreferredAllocation that must fail: the message goes to kubelet verbatim.

    ``code`` names the kind of refusal for counting (one short, stable label per rule).
    """

    def __init__(self, message: str, *, code: str = "refused") -> None:
        super().__init__(message)
        self.code = code


#: At most this many items, each cut to this many characters, go into a message for kubelet: gRPC
#: carries it in a header, and a huge one (a 2 MB device ID) would stall the whole plugin.
SUMMARY_ITEMS = 8
SUMMARY_ITEM_CHARS = 96


def summarize(items: Sequence[str]) -> str:
    """A bounded rendering of ``items`` for error messages (first few, each cut, and a count)."""
    limit = SUMMARY_ITEM_CHARS
    shown = [i if len(i) <= limit else f"{i[:limit]}…({len(i)} chars)" for i in items]
    text = repr(shown[:SUMMARY_ITEMS])
    return text if len(items) <= SUMMARY_ITEMS else f"{text} and {len(items) - SUMMARY_ITEMS} more"
