"""A Spark home for the Spark that ``dedupsink run`` starts, whose Python archives carry bytecode.

PySpark's wheel ships its archives as sources only, so every Python process Spark starts
compiles PySpark again (five of them before a query's first micro-batch). ``run`` points Spark
at a home in the user's cache that links to the installed one, but for copies of the archives
with hash-checked ``.pyc`` files; built on first use, once per PySpark and Python version.
``DEDUPSINK_SPARK_HOME=installed`` turns it off.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import sys
import warnings
import zipfile
from importlib._bootstrap_external import _code_to_hash_pyc  # type: ignore[attr-defined]
from pathlib import Path

log = logging.getLogger("dedupsink.cli")

SPARK_HOME_ENV = "SPARK_HOME"
CHOICE_ENV = "DEDUPSINK_SPARK_HOME"
INSTALLED = "installed"  # the value of CHOICE_ENV that keeps the installed home


def installed_spark_home() -> Path | None:
    """``$SPARK_HOME``, else the installed ``pyspark`` package (a pip install is its own home)."""
    if os.environ.get(SPARK_HOME_ENV):
        return Path(os.environ[SPARK_HOME_ENV])
    # find_spec locates the package without importing it (and so without starting anything).
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def compiled_spark_home(cache: Path | None = None) -> Path | None:
    """The home whose archives carry bytecode, built on first use; None where the installed one
    serves as well (already compiled, turned off) or none can be built (then Spark runs as
    installed, only slower to start)."""
    home = installed_spark_home()
    if os.environ.get(CHOICE_ENV) == INSTALLED or home is None:
        return None
    archives = sorted((home / "python" / "lib").glob("*.zip"))
    if not archives or all(carries_bytecode(a) for a in archives):
        return None
    target = (cache or cache_folder()) / _fingerprint(home, archives)
    if target.is_dir():
        return target
    try:
        _build(home, target)
    except (OSError, zipfile.BadZipFile) as exc:
        log.warning("Spark starts from its installed home (%s could not be built: %s)", target, exc)
        return None
    return target


def cache_folder() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root, "dedupsink", "spark-homes")


def carries_bytecode(path: Path) -> bool:
    """Whether the archive at ``path`` was compiled (a module that is not valid Python stays
    source in any case)."""
    with zipfile.ZipFile(path) as archive:
        return any(name.endswith(".pyc") for name in archive.namelist())


def modules_without_bytecode(path: Path) -> int:
    """How many modules of the archive at ``path`` have no ``.pyc`` beside them."""
    with zipfile.ZipFile(path) as archive:
        return len(_sources_without_bytecode(archive))


def write_with_bytecode(source: zipfile.ZipFile, target: Path) -> tuple[int, int]:
    """Write ``source``'s entries to a new archive at ``target``, each module that lacks one
    with a ``.pyc`` beside it (where zipimport looks): (modules compiled, modules left as
    source because they are not valid Python). On disk before it returns."""
    pending = set(_sources_without_bytecode(source))
    compiled = 0
    with open(target, "wb") as handle:
        with zipfile.ZipFile(handle, "w", zipfile.ZIP_DEFLATED) as out:
            for entry in source.infolist():
                data = source.read(entry)
                out.writestr(entry, data)
                pyc = _bytecode(data, entry.filename) if entry.filename in pending else None
                if pyc is not None:
                    out.writestr(zipfile.ZipInfo(entry.filename + "c", entry.date_time), pyc)
                    compiled += 1
        handle.flush()
        os.fsync(handle.fileno())
    return compiled, len(pending) - compiled


def _fingerprint(home: Path, archives: list[Path]) -> str:
    """A name for the compiled home: the installed home, its archives' sizes and times, and this
    Python's version (bytecode is per version)."""
    parts = [str(home.resolve()), f"{sys.version_info.major}.{sys.version_info.minor}"]
    for archive in archives:
        stat = archive.stat()
        parts.append(f"{archive.name}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _build(home: Path, target: Path) -> None:
    """Links to every entry of ``home`` but ``python/lib``'s archives, which are compiled
    copies; built beside ``target`` and renamed into place, so a home is whole or absent."""
    staged = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    try:
        _link_all_but(home, staged, "python")
        _link_all_but(home / "python", staged / "python", "lib")
        _link_all_but(home / "python" / "lib", staged / "python" / "lib", "*.zip")
        for archive in sorted((home / "python" / "lib").glob("*.zip")):
            with zipfile.ZipFile(archive) as source:
                write_with_bytecode(source, staged / "python" / "lib" / archive.name)
        try:
            os.rename(staged, target)
        except OSError:
            if not target.is_dir():  # else another run built it first
                raise
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def _link_all_but(source: Path, target: Path, left_out: str) -> None:
    target.mkdir(exist_ok=True)
    for entry in source.iterdir():
        if not entry.match(left_out):
            (target / entry.name).symlink_to(entry.resolve())


def _sources_without_bytecode(archive: zipfile.ZipFile) -> list[str]:
    names = archive.namelist()
    present = set(names)
    return [name for name in names if name.endswith(".py") and name + "c" not in present]


def _bytecode(source: bytes, filename: str) -> bytes | None:
    """A checked hash-based ``.pyc`` of ``source``, or None when it does not compile (left as
    source, as ``compileall`` leaves it)."""
    with warnings.catch_warnings():
        # PySpark's own tests carry a few SyntaxWarnings; compiling is not the place to show them.
        warnings.simplefilter("ignore")
        try:
            code = compile(source, filename, "exec", dont_inherit=True)
        except (SyntaxError, ValueError):
            return None
    # The helper py_compile uses for its hash-based invalidation mode.
    return bytes(_code_to_hash_pyc(code, importlib.util.source_hash(source), checked=True))
