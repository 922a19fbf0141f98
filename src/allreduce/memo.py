"""A bounded memo for per-shape facts worked out once (a group's planned calls)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any


class Memo(dict[Hashable, Any]):
    """A dict that forgets everything once it holds ``limit`` entries.

    Call shapes repeat, so a hit is the common case and must cost one dict lookup; a program that
    makes endless new shapes (sizes that grow every step) must not grow memory without bound. Clearing
    all at once keeps lookups plain; a forgotten shape is only worked out again.
    """

    def __init__(self, limit: int = 4096):
        super().__init__()
        self.limit = limit

    def remember(self, key: Hashable, value: Any) -> Any:
        """Store ``value`` under ``key`` (first forgetting everything if full) and return it."""
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value
