"""A port compaction loop in a process of its own, racing the windows of the test's process.

``start`` spawns a process (nothing inherited but the arguments) that compacts every port of
an output again and again, as ``dedupsink compact`` run by hand or by a scheduler would, until
the test creates the stop file; it then reports every outcome and how many commit rounds each
compaction needed.
"""

from __future__ import annotations

import multiprocessing
import traceback
from pathlib import Path
from typing import Any

from dedupsink.options import DedupOptions
from dedupsink.ports.compaction import compact_ports
from dedupsink.ports.formats import compactor_for, port_format

TARGET_SIZE = 1 << 20


def compact_until(path: str, output_format: str, stop: str, results: Any) -> None:
    outcomes: list[tuple[str, str, int]] = []
    try:
        ports = port_format(DedupOptions(path=path, output_format=output_format))
        stopping = False
        while not stopping:
            stopping = Path(stop).exists()  # one more pass after the stop: the last windows
            for done in compact_ports(compactor_for(ports), TARGET_SIZE):
                outcomes.append((done.port, done.outcome, done.rounds))
        results.put(("ok", outcomes))
    except Exception:  # reported to the test, which fails on it
        results.put(("error", traceback.format_exc()))


class CompactionLoop:
    """The compaction process; ``finish`` stops it and returns its outcomes."""

    def __init__(self, path: Path, output_format: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.stop = path.parent / "stop-compacting"
        self.results = context.Queue()
        self.process = context.Process(
            target=compact_until, args=(str(path), output_format, str(self.stop), self.results)
        )
        self.process.start()

    def finish(self) -> list[tuple[str, str, int]]:
        self.stop.touch()
        status, outcomes = self.results.get(timeout=300)
        self.process.join(60)
        assert status == "ok", outcomes
        return list(outcomes)
