"""A latest or expiry point as a person reads it, in the answers that carry one as text."""

from __future__ import annotations

from collections.abc import Sequence

from dedupsink.store.history import point_text as history_point_text
from dedupsink.store.records import StoreSettings

__all__ = ["point_text"]


def point_text(value: float | None, settings: StoreSettings, categories: Sequence[str]) -> str:
    """A latest or expiry point in the domain of the expiry key (timestamps made readable), as
    the history writes it, but for a category, shown with its ordinal."""
    if value is None:
        return "none yet"
    if settings.mode == "categorical" and value >= 0:
        ordinal = int(value)
        name = categories[ordinal] if ordinal < len(categories) else "?"
        return f"{ordinal} ({name!r})"
    return history_point_text(value, settings, categories) or "none yet"
