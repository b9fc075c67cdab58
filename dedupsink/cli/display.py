"""Plain-text rendering for the CLI: sizes, durations, expiry points and small tables."""

from __future__ import annotations

from collections.abc import Sequence

from dedupsink.store.history import point_text as history_point_text
from dedupsink.store.records import StoreSettings
from dedupsink.units import utc_text

__all__ = ["human_bytes", "point_text", "table", "utc_text"]


def human_bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{count} B"


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


def table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "  "
) -> list[str]:
    """Left-aligned first column, right-aligned numbers, a final column left as it is."""
    cells = [[str(cell) for cell in row] for row in rows]
    widths = [max([len(headers[i])] + [len(row[i]) for row in cells]) for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        parts = []
        for index, value in enumerate(values):
            if index == 0:
                parts.append(value.ljust(widths[index]))
            elif index == len(values) - 1 and not value.replace(",", "").isdigit():
                parts.append(value)
            else:
                parts.append(value.rjust(widths[index]))
        return (indent + "  ".join(parts)).rstrip()

    return [line(list(headers)), *(line(row) for row in cells)]
