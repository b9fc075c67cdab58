"""What the sink does to its worker process (``sink/worker.py``), and the switch that stops it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = (
    "import pyarrow as pa; from dedupsink.sink.worker import tune_worker_process; "
    "tune_worker_process(); print(pa.default_memory_pool().backend_name)"
)


def pool_after_tuning(**env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=environment | env,
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip()


def test_the_sink_serves_arrow_from_jemalloc_unless_switched_off() -> None:
    import pyarrow as pa

    if "jemalloc" not in pa.supported_memory_backends():
        pytest.skip("this pyarrow was built without jemalloc")
    assert pool_after_tuning() == "jemalloc"
    assert pool_after_tuning(DEDUPSINK_TUNE_PROCESS="false") == "mimalloc"


def test_an_application_chosen_arrow_pool_is_kept() -> None:
    assert pool_after_tuning(ARROW_DEFAULT_MEMORY_POOL="system") == "system"


def test_the_collector_is_paused_while_the_sink_imports_in_bulk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gc

    from dedupsink.sink.worker import importing_in_bulk

    monkeypatch.delenv("DEDUPSINK_TUNE_PROCESS", raising=False)
    assert gc.isenabled()
    with importing_in_bulk():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(KeyError), importing_in_bulk():
        raise KeyError("an import failed")
    assert gc.isenabled(), "a failed import leaves the collector running"
    monkeypatch.setenv("DEDUPSINK_TUNE_PROCESS", "false")
    with importing_in_bulk():
        assert gc.isenabled()
