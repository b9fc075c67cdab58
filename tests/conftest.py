"""Shared fixtures: one local[2] SparkSession for the whole session, and stream helpers."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

# Spark's Python workers must run this interpreter (the venv's), not whatever python3 is first.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# gcsfs otherwise probes every bucket's type over gRPC first (a minute against an emulator); set
# before gcsfs is imported, here and in every process Spark starts.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
# S3 clients give up after two attempts with short back-offs: the fault tests fail requests on
# purpose (a 500, persistently), and the default five attempts take seconds each time.
os.environ.setdefault("AWS_RETRY_MODE", "standard")
os.environ.setdefault("AWS_MAX_ATTEMPTS", "2")

from servers import Azurite, FakeGcs, Remote, S3Server

ROOT = Path(__file__).parent.parent

# The compatibility suite runs in a venv of each PySpark release (`make test-compat`, which sets
# this variable), never in this venv's runs.
if "DEDUPSINK_COMPAT_PYSPARK" not in os.environ:
    collect_ignore = ["compat"]


def pytest_sessionstart(session: pytest.Session) -> None:
    """Stop at once when the installed package is not the sources: this process imports the
    sources, Spark's Python workers the installed copy (``make test`` installs it first)."""
    import sysconfig
    from importlib.metadata import distributions

    # Not distribution("dedupsink"): from the repository's root, that finds the build's
    # metadata beside the sources.
    found = distributions(name="dedupsink", path=[sysconfig.get_paths()["purelib"]])
    installed = next(iter(found), None)
    if installed is None:
        pytest.exit("dedupsink is not installed in this interpreter: run `make install`", 2)
    sources = {p.relative_to(ROOT).as_posix() for p in ROOT.glob("dedupsink/**/*.py")}
    sources.add("pyspark_dedup.py")
    stale = sorted(
        name
        for name in sources
        if not (copy := Path(str(installed.locate_file(name)))).is_file()
        or copy.read_bytes() != (ROOT / name).read_bytes()
    )
    if stale:
        pytest.exit(
            f"the installed dedupsink differs from the sources in {', '.join(stale[:5])}: "
            "run `make install` (Spark's workers would run the installed copy)",
            2,
        )


def _interrupted(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    """A SIGTERM (a CI's time-out, ``kill``) ends the session as Ctrl-C does: pytest then tears
    the fixtures down, so the servers they started (PostgreSQL's, Azurite, fake-gcs-server)
    stop and their folders go, instead of outliving the run."""
    signal.signal(signal.SIGTERM, _interrupted)


@pytest.fixture(scope="session", autouse=True)
def local_dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The machine-local folders of every process the session starts (the state folder's
    default root, ``store/shared.default_root``; Spark's scratch space), under the session's
    temporary folder rather than the system's: what the tests leave there goes with it."""
    folder = tmp_path_factory.mktemp("local-dirs")
    previous = os.environ.get("SPARK_LOCAL_DIRS")
    os.environ["SPARK_LOCAL_DIRS"] = str(folder)
    yield folder
    if previous is None:
        os.environ.pop("SPARK_LOCAL_DIRS", None)
    else:
        os.environ["SPARK_LOCAL_DIRS"] = previous


def build_session(master: str, app: str):  # type: ignore[no-untyped-def]
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    session = build_session("local[2]", "dedupsink-tests")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 API server on 127.0.0.1, for the whole session."""
    server = S3Server().start()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server: S3Server) -> Iterator[S3Server]:
    """The S3 server with its request counts reset and no fault left armed."""
    s3_server.reset_counts()
    s3_server.clear_faults()
    yield s3_server
    s3_server.clear_faults()


@pytest.fixture(params=["local", "s3"])
def place(request: pytest.FixtureRequest, workdir: Path) -> Path | Remote:
    """Where a Spark test's sink writes: a local directory, or a prefix on the S3 server (the
    store and the ports; Spark's own checkpoint stays local)."""
    if request.param == "local":
        return workdir / "out"
    server: S3Server = request.getfixturevalue("s3")
    return server.remote("sink")


@pytest.fixture(scope="session")
def azure() -> Iterator[Azurite]:
    """Azurite, Microsoft's Azure Blob emulator, on 127.0.0.1 (installed by make install)."""
    server = Azurite().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gcs() -> Iterator[FakeGcs]:
    """fake-gcs-server on 127.0.0.1."""
    server = FakeGcs().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[str]:
    """A throwaway PostgreSQL server on 127.0.0.1 (Debian's binaries, a cluster in a temporary
    folder) for the whole session: the SQLAlchemy URL of its database. Skipped, naming the
    package, where the binaries are not installed."""
    from postgres import Postgres, missing_reason

    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    server = Postgres().start()
    yield server.url
    server.stop()
