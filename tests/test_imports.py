"""What the data source costs the Python processes Spark starts only to find it or ask its schema.

Spark imports ``pyspark_dedup`` in every session with dedupsink installed (to find the ``dedup``
format) and asks the data source for its schema before every write, each in a process of its
own that stays for the session: neither may import pyarrow or the sink's engine and store.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

HEAVY = ("pyarrow", "numpy", "fsspec", "msgpack", "dedupsink.engine", "dedupsink.store")


def printed_by(probe: str) -> list[str]:
    """The words a fresh interpreter prints running ``probe``."""
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    return result.stdout.split()


def imported_after(code: str) -> list[str]:
    """The heavy modules a fresh interpreter holds after running ``code``."""
    return printed_by(
        f"import sys\n{code}\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    )


def test_finding_the_format_imports_no_pyarrow() -> None:
    assert imported_after("import pyspark_dedup") == []


def test_the_schema_spark_asks_before_a_write_imports_no_pyarrow() -> None:
    code = "from pyspark_dedup import DefaultSource\nDefaultSource(options={}).schema()"
    assert imported_after(code) == []


def test_the_data_source_schema_is_the_history_schema() -> None:
    from pyspark.sql.pandas.types import from_arrow_schema

    from dedupsink.sink.datasource import DedupDataSource
    from dedupsink.store.history import SCHEMA

    expected = from_arrow_schema(SCHEMA, prefer_timestamp_ntz=False)
    assert DedupDataSource(options={}).schema() == expected


def test_planning_and_committing_import_no_compute_kernels_nor_other_formats() -> None:
    """Spark's planner and commit processes import the sink afresh for a query's first batch:
    they import neither pyarrow.compute (the tasks' classification needs it) nor the modules
    of a port format the query does not use."""
    probe = (
        "import sys, tempfile\n"
        "import pyarrow as pa\n"
        "from dedupsink.sink.plan import plan_for\n"
        "import dedupsink.sink.commit\n"
        "schema = pa.schema([('id', pa.string()), ('t', pa.timestamp('us', 'UTC'))])\n"
        "options = {'path': tempfile.mkdtemp() + '/out', 'keys': 'id', 'expiryKey': 't',\n"
        "           'expiryPeriod': '1 hour'}\n"
        "plan_for(options, schema, 'run', 'once')\n"
        "prefixes = ('pyarrow.compute', 'dedupsink.ports.delta', 'dedupsink.ports.iceberg',\n"
        "            'dedupsink.ports.compaction', 'deltalake', 'pyiceberg')\n"
        "print(' '.join(m for m in sys.modules if m.startswith(prefixes)))"
    )
    assert printed_by(probe) == []


def test_a_first_commit_writing_the_empty_ports_files_imports_no_compute_kernels(
    tmp_path: Path,
) -> None:
    """The commit of a query's first window writes an empty file for each port its rows left
    empty, in Spark's commit process, which the tasks' classification never ran in."""
    import pyarrow as pa

    from dedupsink.sink.local import LocalSink

    schema = pa.schema([("id", pa.string()), ("n", pa.int64())])
    options = {"path": str(tmp_path / "out"), "keys": "id"}
    rows = pa.table({"id": ["a", "b"], "n": [1, 2]}, schema=schema)
    summaries = LocalSink(options, schema).tasks(0, rows, partitions=2)
    (tmp_path / "window.pickle").write_bytes(pickle.dumps((options, schema, summaries)))
    probe = (
        "import pickle, sys\n"
        "from dedupsink.sink.commit import commit_window\n"
        "from dedupsink.sink.plan import plan_for\n"
        f"options, schema, summaries = pickle.loads(open({str(tmp_path / 'window.pickle')!r},"
        " 'rb').read())\n"
        "commit_window(plan_for(options, schema, 'commit', 'never'), summaries, 0)\n"
        "print(' '.join(m for m in sys.modules if m.startswith('pyarrow.compute')))"
    )
    assert printed_by(probe) == []
    assert list((tmp_path / "out" / "expired").glob("*.parquet")), "no empty port file written"


def test_each_port_format_is_found_by_its_name() -> None:
    from dedupsink.ports.formats import COMPACTORS, FORMATS, _class_of

    assert {name: _class_of(where).name for name, where in FORMATS.items()} == {
        name: name for name in FORMATS
    }
    assert all(_class_of(where).__name__.endswith("Compactor") for where in COMPACTORS.values())
