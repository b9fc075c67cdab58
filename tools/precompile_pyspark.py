"""Add bytecode to the PySpark archives Spark's Python workers import: an image-build step.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first on the path of every
Python process it starts (task workers, and the short-lived processes that plan and commit a
Python data source's writes). The pip wheel ships those archives with sources only, and Python
never writes bytecode into an archive, so each of those processes compiles every PySpark module
it imports: about 0.3 s a process on a 2-core machine. A streaming query's first micro-batch
starts four of them, one after the other.

This command adds a ``.pyc`` next to each module of the archives, the way installing a wheel
compiles ``site-packages``. The sources stay, so tracebacks are unchanged. The bytecode is
hash-checked against the source in the archive, so it can never be used for a changed
module, and a Python of another version ignores it and compiles the source as before.
Run it when no Spark application uses the installation (at install or image-build time): a
running Python process reads modules from the archive at the offsets it indexed when it
started. It is not part of dedupsink: it speeds the start of every PySpark Python worker,
whatever the job (``make install`` runs it on the development venv).

Usage: ``python tools/precompile_pyspark.py [--spark-home DIR]``; exit status 2 for a Spark
home without archives, 1 for an archive it cannot read (left as it is).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from dedupsink.cli.sparkhome import modules_without_bytecode, write_with_bytecode


class UsageError(Exception):
    """No archives where Spark's home should have them (exit status 2)."""


class ArchiveError(Exception):
    """An archive that cannot be read (exit status 1)."""


SPARK_HOME_ENV = "SPARK_HOME"


@dataclass(frozen=True)
class ArchiveReport:
    """What ``precompile_archive`` did to one archive."""

    path: Path
    compiled: int
    uncompilable: int

    def describe(self) -> str:
        if self.compiled == 0:
            return f"{self.path}: already compiled"
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        text = f"{self.path}: {self.compiled:,} modules compiled for Python {version}"
        if self.uncompilable:
            text += f" ({self.uncompilable} left as source: not valid Python)"
        return text


def spark_python_archives(spark_home: str | None = None) -> list[Path]:
    """The archives Spark adds to its Python workers' path: ``<SPARK_HOME>/python/lib/*.zip``.

    Spark's home is ``spark_home``, else ``$SPARK_HOME``, else the installed ``pyspark``
    package (a pip install is its own Spark home)."""
    if spark_home:
        home, origin = spark_home, "--spark-home"
    elif os.environ.get(SPARK_HOME_ENV):
        home, origin = os.environ[SPARK_HOME_ENV], f"${SPARK_HOME_ENV}"
    else:
        home, origin = _pyspark_package_dir(), "the installed pyspark"
    lib = Path(home, "python", "lib")
    archives = sorted(lib.glob("*.zip"))
    if not archives:
        raise UsageError(
            f"Spark home {home} (from {origin}) has no Python archives in {lib}: "
            "expected pyspark.zip; give --spark-home",
        )
    return archives


def _pyspark_package_dir() -> str:
    # find_spec locates the package without importing it (and so without starting anything).
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("pyspark is not installed here: give --spark-home")
    return str(spec.submodule_search_locations[0])


def precompile_archive(path: Path) -> ArchiveReport:
    """Rewrite the archive at ``path`` with a ``.pyc`` beside each ``.py`` that lacks one.

    The new archive is written next to the old one and renamed over it, so a crash leaves
    either archive whole. An archive with nothing to compile is left untouched."""
    staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with zipfile.ZipFile(path) as archive:
            if not modules_without_bytecode(path):
                return ArchiveReport(path, 0, 0)
            compiled, uncompilable = write_with_bytecode(archive, staged)
        staged.chmod(path.stat().st_mode & 0o7777)
        os.replace(staged, path)
    except zipfile.BadZipFile as exc:
        raise ArchiveError(f"{path} is not a readable zip archive ({exc}); left as it is") from exc
    finally:
        staged.unlink(missing_ok=True)
    return ArchiveReport(path, compiled, uncompilable)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--spark-home", metavar="DIR", help="Spark's home (default: $SPARK_HOME, else pyspark's)"
    )
    args = parser.parse_args(argv)
    try:
        for archive in spark_python_archives(args.spark_home):
            print(precompile_archive(archive).describe())
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ArchiveError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
