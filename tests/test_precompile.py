"""``tools/precompile_pyspark.py``: bytecode added to a Spark home's Python archives, used by a
fresh Python process that imports from them, and never used for a module whose source changed."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

from precompile_pyspark import main, modules_without_bytecode

MODULES = {
    "pkgx/__init__.py": "",
    "pkgx/mod.py": "VALUE = 'compiled'\n",
    "pkgx/broken.py": "def (:\n",
}


def make_spark_home(root: Path) -> Path:
    """A Spark home holding one Python archive, as ``<home>/python/lib/pyspark.zip``."""
    archive = root / "python" / "lib" / "pyspark.zip"
    archive.parent.mkdir(parents=True)
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as out:
        for name, text in MODULES.items():
            out.writestr(name, text)
    return archive


def imported_from(archive: Path, module: str) -> tuple[str, str]:
    """``(__file__, VALUE)`` of ``module`` imported by a fresh Python with only ``archive``
    on its path, as Spark's workers import PySpark."""
    code = f"import {module} as m; print(m.__file__); print(m.VALUE)"
    env = {**os.environ, "PYTHONPATH": str(archive)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    file, value = done.stdout.split()
    return file, value


def test_adds_bytecode_that_a_fresh_process_imports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = make_spark_home(tmp_path)
    assert modules_without_bytecode(archive) == 3
    assert main(["--spark-home", str(tmp_path)]) == 0
    assert "2 modules compiled" in capsys.readouterr().out
    assert modules_without_bytecode(archive) == 1  # broken.py, left as source
    with zipfile.ZipFile(archive) as compiled:
        names = set(compiled.namelist())
    assert set(MODULES) <= names  # the sources stay, for tracebacks
    assert {"pkgx/__init__.pyc", "pkgx/mod.pyc"} <= names
    assert "pkgx/broken.pyc" not in names
    file, value = imported_from(archive, "pkgx.mod")
    assert file.endswith("pkgx/mod.pyc")
    assert value == "compiled"


def test_a_second_run_leaves_the_archive_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = make_spark_home(tmp_path)
    main(["--spark-home", str(tmp_path)])
    before = archive.read_bytes()
    assert main(["--spark-home", str(tmp_path)]) == 0
    assert "already compiled" in capsys.readouterr().out.splitlines()[-1]
    assert archive.read_bytes() == before


def test_bytecode_is_never_used_for_a_changed_source(tmp_path: Path) -> None:
    archive = make_spark_home(tmp_path)
    main(["--spark-home", str(tmp_path)])
    edited = tmp_path / "edited.zip"
    with zipfile.ZipFile(archive) as old, zipfile.ZipFile(edited, "w") as new:
        for entry in old.infolist():
            changed = entry.filename == "pkgx/mod.py"
            new.writestr(entry, "VALUE = 'edited'\n" if changed else old.read(entry))
    assert imported_from(edited, "pkgx.mod")[1] == "edited"


def test_spark_home_without_archives_names_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--spark-home", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert f"Spark home {tmp_path} (from --spark-home)" in error
    assert str(tmp_path / "python" / "lib") in error


def test_an_unreadable_archive_is_a_one_line_error_and_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = make_spark_home(tmp_path)
    archive.write_bytes(b"not a zip")
    assert main(["--spark-home", str(tmp_path)]) == 1
    assert f"{archive} is not a readable zip archive" in capsys.readouterr().err
    assert archive.read_bytes() == b"not a zip"
