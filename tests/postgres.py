"""A throwaway PostgreSQL server for the tests: Debian's binaries, a cluster in a temporary folder.

``Postgres.start`` makes a cluster with ``initdb`` (trust authentication: no password anywhere),
starts it with ``pg_ctl`` listening only on 127.0.0.1 at a free port (its Unix socket in the
cluster's folder, nothing under /var/run), creates one database and gives its SQLAlchemy URL;
``stop`` stops the server and deletes the folder. initdb refuses to run as root, so as root
every server command runs as the ``postgres`` user the package creates (``runuser``), which
then owns the folder.

Where the binaries are missing, ``missing_reason`` says what to install: Debian's
``postgresql`` package (``make test`` and ``.ci/run`` install it where they can).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from servers import free_port

PACKAGE = "postgresql"
BINARIES = Path("/usr/lib/postgresql")
SERVER_USER = "postgres"
DATABASE = "dedup"
# A cluster for tests only: nothing of it must survive a crash of the machine, so it skips the
# flushes that make a commit durable (they cost most of a catalog commit's time).
FAST_SETTINGS = ("fsync=off", "synchronous_commit=off", "full_page_writes=off")


def server_binaries() -> Path | None:
    """The newest installed version's folder of server binaries, or None."""
    if not BINARIES.is_dir():
        return None
    found = [
        folder / "bin"
        for folder in BINARIES.iterdir()
        if (folder / "bin" / "initdb").is_file() and (folder / "bin" / "pg_ctl").is_file()
    ]
    return max(found, key=lambda bin_dir: _version(bin_dir.parent.name), default=None)


def _version(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split(".") if part.isdigit())


def missing_reason() -> str | None:
    """Why no server can be started here, naming what to install; None if one can."""
    if server_binaries() is None:
        return (
            f"PostgreSQL's server binaries (initdb, pg_ctl under {BINARIES}/<version>/bin) are "
            f"not installed: install Debian's '{PACKAGE}' package (apt-get install {PACKAGE})"
        )
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return f"no '{SERVER_USER}' user to run the server as (Debian's '{PACKAGE}' makes it)"
        if shutil.which("runuser") is None:
            return "runuser (util-linux) is needed to run PostgreSQL as its user when root"
    return None


class Postgres:
    """One cluster in a temporary folder, its server on 127.0.0.1 at a free port."""

    def __init__(self) -> None:
        binaries = server_binaries()
        assert binaries is not None, missing_reason()
        self.binaries = binaries
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="dedup-postgres-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"

    @property
    def url(self) -> str:
        """The SQLAlchemy URL of the test database (trust authentication: no password)."""
        return f"postgresql+psycopg2://{SERVER_USER}@127.0.0.1:{self.port}/{DATABASE}"

    def start(self) -> Postgres:
        if os.geteuid() == 0:  # initdb refuses root: the folder is the server user's
            user = pwd.getpwnam(SERVER_USER)
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", SERVER_USER, "-A", "trust",
                  "-E", "UTF8", "--no-sync", "--no-instructions")  # fmt: skip
        settings = [
            f"-c listen_addresses=127.0.0.1 -c port={self.port}",
            f"-c unix_socket_directories={self.root}",
            *(f"-c {setting}" for setting in FAST_SETTINGS),
        ]
        try:
            self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                      "-o", " ".join(settings), "start")  # fmt: skip
            self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", SERVER_USER,
                      DATABASE)  # fmt: skip
        except subprocess.CalledProcessError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.CalledProcessError):
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def _run(self, program: str, *args: str) -> None:
        """A server binary, as the server's user when root; its output in the error."""
        command = [str(self.binaries / program), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", SERVER_USER, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise subprocess.CalledProcessError(
                done.returncode, command, done.stdout, f"{done.stderr}\n{log}"
            )
