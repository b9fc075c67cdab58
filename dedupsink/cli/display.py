"""Plain-text rendering for the CLI: small aligned tables and counted nouns (sizes and times
come from ``dedupsink.units``, points from ``dedupsink.inspection.points``)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["counted", "table"]


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


def counted(count: int, noun: str, width: int = 0) -> str:
    """``count`` and ``noun`` in its number: "1 batch", "2 batches", "0 rows" (``-es`` after a
    sibilant, else ``-s``; the count right-aligned in ``width``)."""
    if count != 1:
        noun += "es" if noun.endswith(("s", "sh", "ch", "x", "z")) else "s"
    return f"{count:>{width}} {noun}"
