"""The PySpark releases the sink runs on, and what differs between them.

The package accepts ``pyspark>=4.1,<5`` (``pyproject.toml``); ``make test-compat`` runs the sink
on the newest patch of each of those minor versions (``tests/compat/versions.txt``). PySpark 4.0
has no ``DataSourceStreamArrowWriter`` (only the row-based stream writer): importing the data
source there raises ``PySparkVersionError``, whose one line names the version found and the
version needed. This module imports nothing of PySpark's but its version until it is asked to
convert a schema, so that the check can run before the data source's own imports.
"""

from __future__ import annotations

import inspect
import re
from functools import cache
from typing import TYPE_CHECKING, Any

from dedupsink.errors import DedupError, PySparkVersionError

if TYPE_CHECKING:
    from collections.abc import Callable

    import pyarrow as pa
    from pyspark.sql.types import StructType

NEEDED = (4, 1)
# What the sink needs of 4.1 that 4.0 lacks: named in the refusal.
NEEDED_FOR = "its Arrow stream writer, DataSourceStreamArrowWriter"


def pyspark_version() -> str:
    """The installed PySpark's version, read without importing more than its version module."""
    from pyspark.version import __version__

    return str(__version__)


def check_pyspark(version: str | None = None) -> None:
    """Raise ``PySparkVersionError`` if PySpark (or ``version``) is older than ``NEEDED``."""
    found = pyspark_version() if version is None else version
    match = re.match(r"(\d+)\.(\d+)", found)
    if match is None or (int(match[1]), int(match[2])) < NEEDED:
        raise PySparkVersionError(found, ".".join(map(str, NEEDED)), NEEDED_FOR)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark's Arrow writers hand the sink for a write of ``schema``: Spark's
    timestamps (with a zone) as ``timestamp[us, tz=UTC]``, those without one (TIMESTAMP_NTZ)
    without a zone.

    PySpark has no public conversion of a ``StructType`` to Arrow. Its own (private)
    ``pyspark.sql.pandas.types.to_arrow_schema`` is used, so that the schema is the one that
    release makes (4.2 and 4.3 carry a field's Spark metadata into Arrow, 4.1 does not), but
    its signature changed: 4.1 takes ``timestamp_utc`` (``True`` by default: UTC), 4.2 and 4.3
    a keyword-only ``timezone`` (``None`` by default, which fails on a timestamp). The
    parameter is found by its name, not by the version. ``tests/compat/test_smoke.py`` checks
    the result on each release.
    """
    convert, arguments = _to_arrow_schema()
    return convert(schema, **arguments)


@cache
def _to_arrow_schema() -> tuple[Callable[..., pa.Schema], dict[str, Any]]:
    from pyspark.sql.pandas.types import to_arrow_schema

    parameters = inspect.signature(to_arrow_schema).parameters
    if "timezone" in parameters:  # 4.2 and later
        return to_arrow_schema, {"timezone": "UTC"}
    if "timestamp_utc" in parameters:  # 4.1
        return to_arrow_schema, {"timestamp_utc": True}
    raise DedupError(
        f"dedupsink does not know the to_arrow_schema{inspect.signature(to_arrow_schema)} of "
        f"PySpark {pyspark_version()}: it runs on PySpark 4.1 to 4.3"
    )
