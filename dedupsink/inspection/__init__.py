"""The operator's questions, answered as typed values: where a store is, what it holds, its
history, whether it remembers a key, and what its report draws.

Below the command line and above the store and ports: each answer is a frozen dataclass (or the
history's Arrow table) with ``to_dict()`` where a command prints JSON, so a notebook, a listener
or a test asks the same questions ``dedupsink inspect``, ``history``, ``lookup`` and ``report``
print. Nothing here prints; ``page`` renders the report's answer as the one HTML page the
library itself writes (``dedupsink.report``).
"""

from __future__ import annotations

from dedupsink.inspection.history import history
from dedupsink.inspection.location import Location, locate
from dedupsink.inspection.lookup import LookupResult, lookup
from dedupsink.inspection.report import Column, ReportData, columns_of, report_data
from dedupsink.inspection.state import Inspection, inspect_store

__all__ = [
    "Column",
    "Inspection",
    "Location",
    "LookupResult",
    "ReportData",
    "columns_of",
    "history",
    "inspect_store",
    "locate",
    "lookup",
    "report_data",
]
