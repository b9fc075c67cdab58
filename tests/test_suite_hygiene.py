"""The suite cleans up after itself: a signal stops the servers it started, and the state
folders its processes make live under the session's temporary folder (``conftest.py``)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pytest

from dedupsink.sink.local import LocalSink
from dedupsink.store.shared import STATE_FOLDER, default_root

TESTS = Path(__file__).parent

WAITING_TEST = """
import os
import threading
from pathlib import Path


def test_holds_a_server(postgres):
    Path(os.environ["DEDUP_MARK"]).write_text(postgres)
    threading.Event().wait(120)  # until the signal
"""


def test_the_default_state_folder_is_under_the_sessions_temporary_folder(
    tmp_path: Path, local_dirs: Path
) -> None:
    assert default_root() == local_dirs
    schema = pa.schema([("id", pa.int64())])
    sink = LocalSink({"path": str(tmp_path / "out"), "keys": "id", "numBuckets": "1"}, schema)
    sink.window(0, pa.table({"id": pa.array(range(2_000), pa.int64())}, schema))
    assert (local_dirs / STATE_FOLDER).is_dir()


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def test_a_sigterm_ends_the_session_and_stops_its_postgresql(tmp_path: Path) -> None:
    from postgres import missing_reason

    if (reason := missing_reason()) is not None:
        pytest.skip(reason)
    (tmp_path / "test_waiting.py").write_text(WAITING_TEST)
    mark = tmp_path / "url"
    # The child's temporary folder, where its cluster goes: outside pytest's (owner-only), as
    # root runs the server as its own user, which must reach it.
    with tempfile.TemporaryDirectory(prefix="dedup-sigterm-") as name:
        temp = Path(name)
        temp.chmod(0o755)
        _start_then_terminate(tmp_path, temp, mark)


def _start_then_terminate(tmp_path: Path, temp: Path, mark: Path) -> None:
    env = {**os.environ, "TMPDIR": str(temp), "DEDUP_MARK": str(mark)}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    waiting = str(tmp_path / "test_waiting.py")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider"]
    child = subprocess.Popen(
        [*command, waiting],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not mark.exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)  # the child starts PostgreSQL: a few seconds
    assert mark.exists(), child.communicate()[0] if child.poll() is not None else "no server"
    port = int(mark.read_text().split("@127.0.0.1:")[1].split("/")[0])
    assert _answers(port)
    child.send_signal(signal.SIGTERM)
    output = child.communicate(timeout=60)[0]
    assert child.returncode == 2, output  # interrupted, as Ctrl-C ends a session
    assert not _answers(port), output
    assert not list(temp.glob("dedup-postgres-*")), output
