"""A job's ``source.option.<name>`` checked against the options Spark's source reads: a typo is
one line with a did-you-mean at ``validate``, before a JVM starts; a reader option of the format,
a Hadoop setting, a Kafka client property and any option of a source named by its class pass;
two spellings of one option (Spark reads them without case) are one option. The lists are
compared with the ones Spark's own classes give.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dedupsink.cli.main import main
from dedupsink.cli.source_options import FILE_INDEX_OPTIONS, FORMAT_OPTIONS

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "conf" / "system-logs.conf"

Validate = Callable[..., tuple[int, str, str]]


@pytest.fixture
def validate(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> Validate:
    """``dedupsink validate`` of a config (the demo's by default) with ``--set`` overrides,
    writing nothing beside the test's folder."""

    def call(*overrides: str, config: Path = DEMO) -> tuple[int, str, str]:
        sets = [f"--set=path={tmp_path / 'out'}"]
        sets += [f"--set={item}" for item in overrides]
        code = main(["validate", str(config), *sets])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return call


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.conf"
    path.write_text(text + f"path = {tmp_path / 'out'}\nkeys = value\n", encoding="utf-8")
    return path


def test_a_misspelt_file_source_option_is_one_line_with_what_it_meant(
    validate: Validate, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # the demo's relative paths
    code, out, err = validate("source.option.maxFilesPerTriger=1")
    assert (code, out) == (2, "")
    assert err == (
        "dedupsink: error: --set source.option.maxFilesPerTriger: source.option."
        "maxFilesPerTriger is not an option of Spark's json source (did you mean "
        "source.option.maxFilesPerTrigger?)\n"
    )


def test_an_option_far_from_every_name_says_where_the_names_are(
    validate: Validate, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    code, _, err = validate("source.option.frobnicate=1")
    assert code == 2 and err.count("\n") == 1
    assert err.endswith(
        "source.option.frobnicate is not an option of Spark's json source (it reads the file "
        "sources' options and the json reader's, as Spark's data source options page lists "
        "them; a Hadoop setting for the read is a dotted name)\n"
    )


def test_one_option_in_another_case_replaces_it_and_spark_gets_one(
    validate: Validate, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    code, out, err = validate("source.option.MAXFILESPERTRIGGER=2")
    assert (code, err) == (0, "")
    assert "  options     MAXFILESPERTRIGGER=2\n" in out


def test_a_repeated_option_in_another_case_in_one_file_is_refused(
    validate: Validate, tmp_path: Path
) -> None:
    config = write(
        tmp_path,
        "source.format = rate\nsource.option.rowsPerSecond = 5\nsource.option.rowspersecond = 6\n",
    )
    code, _, err = validate(config=config)
    assert code == 2
    assert err == (
        f"dedupsink: error: {config}:3: source.option.rowsPerSecond is set twice (first at "
        f"{config}:2)\n"
    )


def test_reader_options_hadoop_settings_and_streaming_options_of_a_file_source_pass(
    validate: Validate, tmp_path: Path
) -> None:
    data = tmp_path / "in"
    data.mkdir()
    (data / "a.csv").write_text("value\n1\n", encoding="utf-8")
    config = write(
        tmp_path,
        f"source.format = csv\nsource.path = {data}\nsource.schema = value BIGINT\n"
        "source.option.header = true\nsource.option.INFERSCHEMA = false\nsource.option.sep = ,\n"
        "source.option.pathGlobFilter = *.csv\nsource.option.latestFirst = true\n"
        "source.option.fs.s3a.endpoint = http://127.0.0.1:9000\n",
    )
    code, out, err = validate(config=config)
    assert (code, err) == (0, "")
    assert "INFERSCHEMA=false, fs.s3a.endpoint=http://127.0.0.1:9000, header=true" in out
    # A csv reader option is no option of another format.
    code, _, err = validate("source.format=parquet", config=config)
    assert code == 2
    assert err.startswith(
        f"dedupsink: error: {config}:4: source.option.header is not an option of Spark's "
        "parquet source (it reads the file sources' options and the parquet reader's"
    )


KAFKA = ["kafka.bootstrap.servers=127.0.0.1:9", "subscribe=events"]


@pytest.mark.parametrize(
    ("source", "options", "wrong", "meant"),
    [
        ("kafka", KAFKA, "subscibe", "subscribe"),
        ("kafka", KAFKA, "startingOffset", "startingOffsets"),
        ("rate", ["rowsPerSecond=5", "rampUpTime=1s"], "numPartition", "numPartitions"),
        ("rate-micro-batch", ["rowsPerBatch=5"], "advanceMillisPerBach", "advanceMillisPerBatch"),
    ],
)
def test_streaming_sources_options_are_checked(
    validate: Validate,
    tmp_path: Path,
    source: str,
    options: list[str],
    wrong: str,
    meant: str,
) -> None:
    lines = "".join(f"source.option.{item.replace('=', ' = ', 1)}\n" for item in options)
    config = write(tmp_path, f"source.format = {source}\n{lines}")
    code, _, err = validate(config=config)
    assert (code, err) == (0, "")
    code, _, err = validate(f"source.option.{wrong}=1", config=config)
    assert code == 2
    assert err == (
        f"dedupsink: error: --set source.option.{wrong}: source.option.{wrong} is not an option "
        f"of Spark's {source} source (did you mean source.option.{meant}?)\n"
    )


def test_a_rate_option_far_from_every_name_lists_them(validate: Validate, tmp_path: Path) -> None:
    config = write(tmp_path, "source.format = rate\n")
    code, _, err = validate("source.option.speed=1", config=config)
    assert code == 2
    assert err.endswith(
        "source.option.speed is not an option of Spark's rate source (it reads numPartitions, "
        "rampUpTime, rowsPerSecond)\n"
    )


def test_a_source_named_by_its_class_passes_its_options_unchanged(
    validate: Validate, tmp_path: Path
) -> None:
    config = write(
        tmp_path,
        "source.format = com.example.MySource\nsource.schema = value BIGINT\n"
        "source.option.anyThing = 1\n",
    )
    code, out, err = validate(config=config)
    assert (code, err) == (0, "")
    assert "  options     anyThing=1\n" in out


def test_the_lists_are_sparks_own(spark: Any) -> None:
    """Each format's reader options and the file listing's, as Spark's option classes list
    them (their dotted names are Hadoop settings, which pass as every dotted name does)."""
    classes = {
        "csv": "org.apache.spark.sql.catalyst.csv.CSVOptions",
        "json": "org.apache.spark.sql.catalyst.json.JSONOptions",
        "xml": "org.apache.spark.sql.catalyst.xml.XmlOptions",
        "parquet": "org.apache.spark.sql.execution.datasources.parquet.ParquetOptions",
        "orc": "org.apache.spark.sql.execution.datasources.orc.OrcOptions",
        "text": "org.apache.spark.sql.execution.datasources.text.TextOptions",
        "index": "org.apache.spark.sql.execution.datasources.FileIndexOptions",
    }
    jvm = spark._jvm  # type: ignore[attr-defined]

    def spark_options(name: str) -> set[str]:
        module = jvm.java.lang.Class.forName(name + "$").getField("MODULE$").get(None)
        found = module.getAllOptions().iterator()
        names = set()
        while found.hasNext():
            names.add(str(found.next()).lower())
        return {n for n in names if "." not in n}

    for source, name in classes.items():
        ours = FORMAT_OPTIONS.get(source, FILE_INDEX_OPTIONS)
        expected = spark_options(name)
        if source == "index":  # FileSourceOptions, which lists none, adds ignoreCorruptFiles
            expected.add("ignorecorruptfiles")
        assert {n.lower() for n in ours} == expected, source
