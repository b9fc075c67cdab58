"""``cli/sparkhome.py``: the Spark home ``dedupsink run`` gives its Spark, linked to the installed
one but for Python archives with bytecode, built once, and used by Spark's Python workers."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dedupsink.cli import sparkhome
from dedupsink.cli.main import main
from dedupsink.cli.sparkhome import (
    CHOICE_ENV,
    INSTALLED,
    SPARK_HOME_ENV,
    _build,
    compiled_spark_home,
    modules_without_bytecode,
)


def installed_home(root: Path) -> Path:
    """A Spark home as a pip install lays it out: jars, scripts, the archives."""
    home = root / "pyspark"
    (home / "jars").mkdir(parents=True)
    (home / "jars" / "spark-core.jar").write_bytes(b"jar")
    (home / "bin").mkdir()
    (home / "python" / "lib").mkdir(parents=True)
    (home / "python" / "pyspark").mkdir()
    with zipfile.ZipFile(home / "python" / "lib" / "pyspark.zip", "w") as out:
        out.writestr("pkgx/__init__.py", "")
        out.writestr("pkgx/mod.py", "VALUE = 'compiled'\n")
        out.writestr("pkgx/broken.py", "def (:\n")
    with zipfile.ZipFile(home / "python" / "lib" / "py4j-src.zip", "w") as out:
        out.writestr("py4jx.py", "VALUE = 1\n")
    return home


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = installed_home(tmp_path)
    monkeypatch.setenv(SPARK_HOME_ENV, str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(CHOICE_ENV, raising=False)
    return home


def test_a_home_with_compiled_archives_is_built_once_and_links_the_rest(home: Path) -> None:
    built = compiled_spark_home()
    assert built is not None and built.parent == sparkhome.cache_folder()
    archive = built / "python" / "lib" / "pyspark.zip"
    names = set(zipfile.ZipFile(archive).namelist())
    assert {"pkgx/mod.pyc", "pkgx/__init__.pyc"} <= names
    assert "pkgx/broken.pyc" not in names  # not Python: left as source
    assert modules_without_bytecode(built / "python" / "lib" / "py4j-src.zip") == 0
    assert (built / "jars").resolve() == (home / "jars").resolve()
    assert (built / "python" / "pyspark").is_symlink()
    assert modules_without_bytecode(home / "python" / "lib" / "pyspark.zip") == 3  # untouched
    assert compiled_spark_home() == built  # built once
    assert [p.name for p in sparkhome.cache_folder().iterdir()] == [built.name]


def test_a_fresh_process_imports_the_bytecode_of_the_compiled_archive(home: Path) -> None:
    built = compiled_spark_home()
    assert built is not None
    archive = built / "python" / "lib" / "pyspark.zip"
    done = subprocess.run(
        [sys.executable, "-c", "import pkgx.mod as m; print(m.__file__, m.VALUE)"],
        env={**os.environ, "PYTHONPATH": str(archive)},
        capture_output=True,
        text=True,
        check=True,
    )
    file, value = done.stdout.split()
    assert file == f"{archive}/pkgx/mod.pyc"  # zipimport names the bytecode it loaded
    assert value == "compiled"


def test_nothing_is_built_when_off_or_when_the_installed_archives_are_compiled(
    home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(CHOICE_ENV, INSTALLED)
    assert compiled_spark_home() is None
    monkeypatch.delenv(CHOICE_ENV)
    built = compiled_spark_home()
    assert built is not None
    monkeypatch.setenv(SPARK_HOME_ENV, str(built))  # an image whose archives carry bytecode
    assert compiled_spark_home() is None
    assert not (tmp_path / "cache" / "dedupsink" / "spark-homes" / built.name / "x").exists()


def test_a_home_that_cannot_be_built_leaves_spark_as_installed(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    assert compiled_spark_home() is None


def test_the_spark_home_command_prints_the_compiled_home(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["spark-home"]) == 0
    assert Path(capsys.readouterr().out.strip()) == compiled_spark_home()


SPARK_FROM_HOME = """
import os, sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
where = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("pyspark").__file__)
print(where.collect()[0])
spark.stop()
"""


@pytest.mark.slow  # a whole Spark in a process of its own
@pytest.mark.spark
def test_spark_starts_from_a_linked_home_and_its_workers_import_its_archive(
    tmp_path: Path,
) -> None:
    """A real Spark, launched with SPARK_HOME at a linked home: its JVM starts from the linked
    scripts and jars, and its Python workers import PySpark from the home's own archive."""
    installed = sparkhome.installed_spark_home()
    assert installed is not None
    linked = tmp_path / "home"
    _build(installed, linked)
    env = {**os.environ, SPARK_HOME_ENV: str(linked)}
    done = subprocess.run(
        [sys.executable, "-c", SPARK_FROM_HOME],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    worker_file = done.stdout.strip().splitlines()[-1]
    assert worker_file.startswith(str(linked / "python" / "lib" / "pyspark.zip")), worker_file
