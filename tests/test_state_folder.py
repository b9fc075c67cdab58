"""The machine-local state folder is the user's alone, and a damaged copy costs a retry at most.

The shared copies (``store/shared.py``) live in ``<stateCacheDir>/dedupsink-state/<store id>/``,
whose default root may be the system's temporary folder, shared by every user. A new folder is
owner-only and its copies read-only; a folder of another user, one others can write, or a link
is not used (one warning, keys private, the same answers). A full disk while a copy is written
keeps that segment's keys private and leaves no partial file. A copy changed in place is
checked again and rebuilt; one truncated under a live map kills the process that reads it
(SIGBUS, which no check can catch), and the task's retry rebuilds it and loses nothing.

One window of ``STORED`` ids is committed through the sink's own task and commit code, in four
hash buckets (a shared copy each); a window of half remembered, half new ids is then classified
through bucket managers over state folders in every condition. No Spark.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dedupsink.engine.classify import PORTS, CommittedState, WindowClassifier, stamp_dtype
from dedupsink.engine.keyset import KeySet
from dedupsink.engine.settings import resolve
from dedupsink.options import DedupOptions
from dedupsink.runtime import RUNTIME
from dedupsink.sink.commit import commit_window
from dedupsink.sink.plan import SinkPlan, TaskIdentity
from dedupsink.sink.task import run_task
from dedupsink.store.cache import BucketCache, BucketManager
from dedupsink.store.format import Manifest, Segment
from dedupsink.store.shared import IDLE_SECONDS, STATE_FOLDER, SharedSegments

QUERY, RUN = "state-query", "state-run"
SCHEMA = pa.schema([("id", pa.int64())])
# Four hash buckets of about 2,500 keys: each segment is shared (SHARE_FROM_KEYS is 512), its
# copy about 40 KB, and no bucket is large enough for the managers' Bloom filter, so every
# lookup searches the mapped pages.
STORED = 10_000
PROBE = range(STORED // 2, STORED + STORED // 2)
EXPECTED = ["duplicate"] * (STORED // 2) + ["unique"] * (STORED // 2)
HEADER = 32
OTHER_UID = 65534  # nobody
TESTS = Path(__file__).parent


def make_plan(root: Path, state: Path) -> SinkPlan:
    raw = {"path": str(root), "keys": "id", "numBuckets": "4", "stateCacheDir": str(state)}
    options = DedupOptions.parse(raw)
    return SinkPlan(options, resolve(options, SCHEMA), SCHEMA, RUN)


def ids_batch(ids: range | list[int]) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(ids, pa.int64())})


def fill(root: Path) -> SinkPlan:
    """A store whose version 1 remembers ids ``0 .. STORED - 1`` (the task maps its copies in
    a state folder of its own, which no test damages)."""
    plan = make_plan(root, root.parent / f"{root.name}-fill-state")
    summary = run_task(plan, TaskIdentity(QUERY, RUN, 0, 0, 0), iter([ids_batch(range(STORED))]))
    report = commit_window(plan, [summary], 0)
    assert report is not None and report.version == 1
    return plan


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> SinkPlan:
    return fill(tmp_path_factory.mktemp("state-folder") / "out")


def latest(plan: SinkPlan) -> Manifest:
    manifest = plan.store.read()
    assert manifest is not None
    return manifest


def segments(plan: SinkPlan) -> list[Segment]:
    return [segment for found in latest(plan).buckets.values() for segment in found]


def classify(plan: SinkPlan, shared: SharedSegments | None) -> tuple[list[str], BucketManager]:
    """The ports of ``PROBE`` against the latest version, through a new manager (a process's
    first task) whose copies are in ``shared``."""
    manifest = latest(plan)
    settings = plan.settings.laid_out_as(manifest.settings)
    manager = BucketManager(plan.store, BucketCache(64), stamp_dtype(settings), shared)
    state = CommittedState(manifest.latest, manifest.category_ordinals())
    result = WindowClassifier(settings, state, manager.use(manifest)).classify(ids_batch(PROBE))
    return [PORTS[p] for p in result.ports.tolist()], manager


def shared_in(plan: SinkPlan, root: Path) -> SharedSegments:
    return SharedSegments(root, latest(plan).store_id)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "dedupsink" and r.levelno == logging.WARNING
    ]


def whole(path: Path) -> bool:
    """Whether a copy holds as many bytes as its header says (Basic Dedup: two lanes)."""
    data = path.read_bytes()
    return len(data) >= HEADER and len(data) == HEADER + 16 * int.from_bytes(data[8:16], "little")


def change_in_place(path: Path, change: Callable[[int], None]) -> None:
    """Change a copy in place, as its owner can: made writable first (copies are read-only;
    root needs no such step), ``change`` given a descriptor open for writing."""
    info = path.stat()
    path.chmod(0o644)
    fd = os.open(path, os.O_RDWR)
    try:
        change(fd)
    finally:
        os.close(fd)
    path.chmod(stat.S_IMODE(info.st_mode))


# -- a task's own segments ----------------------------------------------------------------------


def test_a_task_leaves_its_new_segments_as_the_machines_copies(tmp_path: Path) -> None:
    """The segments a task writes are the machine's shared copies as soon as its window
    commits: another process of the machine classifies the next window from them, reading
    nothing from the store (on an object store, a round trip a window saved)."""
    state = tmp_path / "state"
    plan = make_plan(tmp_path / "out", state)
    summary = run_task(plan, TaskIdentity(QUERY, RUN, 0, 0, 0), iter([ids_batch(range(STORED))]))
    assert commit_window(plan, [summary], 0) is not None
    shared = shared_in(plan, state)
    assert all(whole(Path(shared.path(segment))) for segment in segments(plan))
    ports, manager = classify(plan, shared)  # a new manager: another process's first task
    assert ports == EXPECTED
    assert manager.task_use().fetched == 0


# -- the folder is the user's alone -----------------------------------------------------------


@pytest.mark.parametrize("umask", [0o000, 0o277], ids=["umask-000", "umask-277"])
def test_a_new_state_folder_is_owner_only_and_its_copies_read_only(
    plan: SinkPlan, tmp_path: Path, umask: int
) -> None:
    """Whatever the umask (one that opens everything, one that takes the owner's write bit),
    both levels are 0o700, every copy 0o444, and the keys are mapped from the copies."""
    root = tmp_path / "local"
    root.mkdir()
    shared = shared_in(plan, root)
    previous = os.umask(umask)
    try:
        ports, manager = classify(plan, shared)
    finally:
        os.umask(previous)
    assert ports == EXPECTED
    for folder in (root / STATE_FOLDER, shared.folder):
        assert mode_of(folder) == 0o700, folder
        assert os.lstat(folder).st_uid == os.geteuid()
    copies = sorted(shared.folder.iterdir())
    assert [p.suffix for p in copies] == [".keys"] * len(segments(plan))  # no aside file left
    assert {mode_of(p) for p in copies} == {0o444}
    assert manager.cache.info().mapped > 0


def _owned_by_another_user(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a folder to another user (chown) needs root")
    os.chown(path, OTHER_UID, OTHER_UID)


REFUSALS: dict[str, tuple[str, Callable[[Path], None], str]] = {
    # name: (the level refused, what is done to it, what the warning says)
    "outer-of-another-user": ("outer", _owned_by_another_user, f"owner uid {OTHER_UID}"),
    "store-folder-of-another-user": ("store", _owned_by_another_user, f"owner uid {OTHER_UID}"),
    "group-writable": ("store", lambda p: p.chmod(0o775), "mode 0o775"),
    "world-writable-sticky": ("outer", lambda p: p.chmod(0o1777), "mode 0o1777"),
}


def plant_decoys(plan: SinkPlan, folder: Path, tmp_path: Path) -> dict[str, bytes]:
    """Copies with valid checksums and no keys, under every segment's name: read, they would
    answer "unique" for every remembered key; idle for long, a sweep would delete them."""
    maker = shared_in(plan, tmp_path / "decoys")
    for segment in segments(plan):
        maker.publish(segment, KeySet.empty(None))
    assert classify(plan, maker)[0] != EXPECTED, "the decoys would mislead if read"
    folder.mkdir(parents=True, exist_ok=True)
    planted = {p.name: p.read_bytes() for p in maker.folder.glob("*.keys")}
    idle = time.time() - 2 * IDLE_SECONDS
    for name, data in planted.items():
        (folder / name).write_bytes(data)
        os.utime(folder / name, (idle, idle))
    return planted


@pytest.mark.parametrize("refusal", sorted(REFUSALS))
def test_a_state_folder_not_the_users_alone_is_not_used(
    plan: SinkPlan, tmp_path: Path, refusal: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A folder of another user, or one others can write, holding copies that would mislead:
    one warning naming the folder and why, nothing in it read or written, and the answers of
    a good folder."""
    level, make_unsafe, detail = REFUSALS[refusal]
    root = tmp_path / "local"
    shared = shared_in(plan, root)
    planted = plant_decoys(plan, shared.folder, tmp_path)
    for folder in (root / STATE_FOLDER, shared.folder):
        folder.chmod(0o700)
    refused = root / STATE_FOLDER if level == "outer" else shared.folder
    make_unsafe(refused)
    good, _ = classify(plan, shared_in(plan, tmp_path / "good"))
    caplog.set_level(logging.WARNING, logger="dedupsink")
    caplog.clear()
    ports, manager = classify(plan, shared)
    assert ports == good == EXPECTED
    (warning,) = warnings_of(caplog)
    assert f"{refused} " in warning and detail in warning and warning.endswith("stay private")
    assert {p.name: p.read_bytes() for p in shared.folder.iterdir()} == planted
    assert manager.cache.info().mapped == 0 and manager.cache.info().nbytes > 0


def test_a_state_folder_that_is_a_link_is_not_used(
    plan: SinkPlan, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``dedupsink-state`` a symbolic link (to a folder of the user's, owner-only): not used."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    root = tmp_path / "local"
    root.mkdir()
    (root / STATE_FOLDER).symlink_to(elsewhere)
    shared = shared_in(plan, root)
    planted = plant_decoys(plan, shared.folder, tmp_path)
    caplog.set_level(logging.WARNING, logger="dedupsink")
    ports, manager = classify(plan, shared)
    assert ports == EXPECTED
    (warning,) = warnings_of(caplog)
    assert f"{root / STATE_FOLDER} is a symbolic link" in warning
    assert {p.name: p.read_bytes() for p in shared.folder.iterdir()} == planted
    assert manager.cache.info().mapped == 0


# -- a full disk while a copy is written ------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: room for one copy and part of a second."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    run = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if run.returncode != 0:
        pytest.skip(f"this machine allows no tmpfs mount: {run.stderr.strip()}")
    try:
        yield mount
    finally:
        gc.collect()  # the copies' maps
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_full_disk_while_a_copy_is_written_keeps_its_keys_private(
    plan: SinkPlan, small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dedupsink")
    shared = shared_in(plan, small_disk)
    ports, manager = classify(plan, shared)
    assert ports == EXPECTED
    full = [w for w in warnings_of(caplog) if "No space left on device" in w]
    assert full and all("keys stay private" in w for w in full)
    assert len(full) == len(warnings_of(caplog))
    left = sorted(shared.folder.iterdir())
    assert all(p.suffix == ".keys" and whole(p) and mode_of(p) == 0o444 for p in left), left
    assert 0 < len(left) < len(segments(plan))
    info = manager.cache.info()
    assert info.mapped > 0 and info.nbytes > 0  # the copy that fitted, and the private rest
    # The next process maps the copy that fitted and keeps the others private again.
    RUNTIME.reset("store.shared_checked")
    again, second = classify(plan, shared)
    assert again == EXPECTED
    assert second.task_use().fetched > 0
    del manager, second


FILE_SIZE_LIMIT_CHILD = """
import json, logging, resource, signal, sys
from pathlib import Path
import test_state_folder as t

# A write past the limit fails with EFBIG instead of killing the process.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024, 16 * 1024))
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
plan = t.make_plan(Path(sys.argv[1]), Path(sys.argv[2]))
ports, manager = t.classify(plan, t.shared_in(plan, Path(sys.argv[2])))
info = manager.cache.info()
print(json.dumps({"right": ports == t.EXPECTED, "mapped": info.mapped, "private": info.nbytes}))
"""


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(TESTS), "PYTHONDONTWRITEBYTECODE": "1"}


def test_a_file_size_limit_while_copies_are_written_keeps_their_keys_private(
    plan: SinkPlan, tmp_path: Path
) -> None:
    """The same without a mount: a process whose files may not exceed 16 KiB (every copy is
    about 40 KB) writes none, answers right, and leaves no partial file."""
    state = tmp_path / "local"
    run = subprocess.run(
        [sys.executable, "-c", FILE_SIZE_LIMIT_CHILD, plan.options.path, str(state)],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=tmp_path,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["right"] and result["mapped"] == 0 and result["private"] > 0
    warned = run.stderr.splitlines()
    assert len(warned) == len(segments(plan))
    assert all("File too large" in w and w.endswith("keys stay private") for w in warned)
    assert list(shared_in(plan, state).folder.iterdir()) == []


# -- a copy changed in place ------------------------------------------------------------------


def truncate_to_half(fd: int) -> None:
    os.ftruncate(fd, os.fstat(fd).st_size // 2)


def flip_last_word_keeping_size_and_mtime(fd: int) -> None:
    info = os.fstat(fd)
    word = os.pread(fd, 8, info.st_size - 8)
    os.pwrite(fd, bytes(b ^ 0xFF for b in word), info.st_size - 8)
    os.utime(fd, ns=(info.st_atime_ns, info.st_mtime_ns))  # only the ctime tells


@pytest.mark.parametrize(
    "change",
    [truncate_to_half, flip_last_word_keeping_size_and_mtime],
    ids=["truncated", "flipped"],
)
@pytest.mark.parametrize("checked_here", [True, False], ids=["checked-here", "new-process"])
def test_a_copy_changed_in_place_is_checked_again_and_rebuilt(
    plan: SinkPlan,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    change: Callable[[int], None],
    checked_here: bool,
) -> None:
    """A copy changed in place after this process checked it (or in a process that never mapped
    it) is checked again when next opened, deleted and rebuilt: the answers stay right."""
    shared = shared_in(plan, tmp_path / "local")
    ports, manager = classify(plan, shared)
    assert ports == EXPECTED
    del manager  # its maps are not read again (a live map of a truncated copy: the next test)
    copies = sorted(shared.folder.glob("*.keys"))
    assert len(copies) == len(segments(plan))
    if not checked_here:
        RUNTIME.reset("store.shared_checked")
    for path in copies:
        change_in_place(path, change)
    caplog.set_level(logging.WARNING, logger="dedupsink")
    ports, again = classify(plan, shared)
    assert ports == EXPECTED
    assert again.task_use().fetched > 0  # rebuilt from the store
    damaged = warnings_of(caplog)
    assert len(damaged) == len(copies) and all("is damaged" in w for w in damaged)
    assert sorted(shared.folder.iterdir()) == copies
    assert all(whole(p) and mode_of(p) == 0o444 for p in copies)
    caplog.clear()
    RUNTIME.reset("store.shared_checked")
    ports, third = classify(plan, shared)
    assert ports == EXPECTED and third.task_use().fetched == 0 and warnings_of(caplog) == []


WORKER_CHILD = """
import resource, sys
from pathlib import Path
from dedupsink.sink import task
from dedupsink.sink.plan import TaskIdentity
import test_state_folder as t

resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # dying of SIGBUS is expected: no core file
task.COALESCE_ROWS = 1  # each batch classified as it arrives


def batches():
    yield t.ids_batch(t.FIRST)
    print("mapped", flush=True)  # the first batch is classified: its buckets' copies mapped
    sys.stdin.readline()  # meanwhile the copies are truncated in place
    yield t.ids_batch(t.SECOND)


plan = t.make_plan(Path(sys.argv[1]), Path(sys.argv[2]))
task.run_task(plan, TaskIdentity(t.QUERY, t.RUN, 1, 0, 0), batches())
print("survived", flush=True)
"""
# The retried window: remembered ids first (mapping every copy), then remembered and new ones.
FIRST = range(STORED // 2, STORED)
SECOND = [*range(STORED // 2), *range(STORED, STORED + STORED // 2)]


def published_ids(root: Path, port: str, version: int) -> list[int]:
    found: list[int] = []
    for path in sorted((root / port).glob(f"part-{version:010d}-*.parquet")):
        found.extend(pq.read_table(path, columns=["id"]).column("id").to_pylist())
    return sorted(found)


def test_a_copy_truncated_under_a_live_map_kills_the_worker_and_its_retry_loses_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The hazard RELIABILITY.md names: a worker maps the copies, they are truncated in place
    under it, and its next read of a lost page kills it (SIGBUS: Python cannot catch it). Its
    task's retry, in a process that never mapped them, finds them damaged, rebuilds them and
    classifies the window as an undisturbed run would; the store and the ports had nothing
    of the dead attempt."""
    root, state = tmp_path / "out", tmp_path / "worker-state"
    plan = fill(root)
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER_CHILD, str(root), str(state)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
        cwd=tmp_path,
    )
    try:
        assert worker.stdout is not None and worker.stdin is not None
        assert worker.stdout.readline().strip() == "mapped", worker.stderr
        copies = sorted(shared_in(plan, state).folder.glob("*.keys"))
        assert len(copies) == len(segments(plan))
        for path in copies:  # the header kept: every page of keys lost
            change_in_place(path, lambda fd: os.ftruncate(fd, HEADER))
        worker.stdin.write("go\n")
        worker.stdin.flush()
        out, err = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == -signal.SIGBUS, (worker.returncode, out, err)
    assert "survived" not in out
    assert latest(plan).version == 1, "the dead attempt committed nothing"
    assert published_ids(root, "unique", 2) == published_ids(root, "duplicate", 2) == []
    # The retry, in a process that never mapped the copies (Spark starts a new Python worker),
    # over the same state folder.
    plan = make_plan(root, state)
    caplog.set_level(logging.WARNING, logger="dedupsink")
    retry = run_task(
        plan, TaskIdentity(QUERY, RUN, 1, 0, 1), iter([ids_batch(FIRST), ids_batch(SECOND)])
    )
    damaged = [w for w in warnings_of(caplog) if "is damaged" in w]
    assert len(damaged) == len(copies)
    assert all(whole(p) and mode_of(p) == 0o444 for p in copies)
    report = commit_window(plan, [retry], 1)
    assert report is not None and report.version == 2
    assert published_ids(root, "duplicate", 2) == list(range(STORED))
    assert published_ids(root, "unique", 2) == list(range(STORED, STORED + STORED // 2))
    assert published_ids(root, "expired", 2) == published_ids(root, "error", 2) == []
