"""The ``dedupsink`` command: ``run``, ``validate``, ``inspect``, ``history``, ``lookup``,
``report``, ``release``, ``repair`` and ``compact``.

Exit codes: 0 success, 1 a runtime failure (store owned by another query, a corrupt file, a
failed query), 2 a usage, config or option error, 130 interrupted. Errors are one line on
stderr; ``--verbose`` adds the traceback and Spark's warnings.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Sequence

from dedupsink.cli import compact
from dedupsink.cli.config import SPARK_PREFIX, load_config
from dedupsink.cli.history import render as render_history
from dedupsink.cli.inspect import render, settings_text, to_json
from dedupsink.cli.job import PreparedJob, checkpoint_for, prepare
from dedupsink.cli.lookup import parse_pairs
from dedupsink.cli.lookup import render as render_lookup
from dedupsink.cli.lookup import to_json as lookup_json
from dedupsink.cli.run import run, spark_master
from dedupsink.cli.sparkhome import compiled_spark_home, installed_spark_home
from dedupsink.errors import ConfigError, DedupError, DedupOptionError
from dedupsink.inspection import history, inspect_store, locate, lookup
from dedupsink.inspection.history import history_json_lines
from dedupsink.inspection.page import write_report
from dedupsink.options import parse_storage_options
from dedupsink.store.ownership import describe_owner, release
from dedupsink.store.records import StoreSettings, now_ms
from dedupsink.store.storage import parent
from dedupsink.units import human_bytes
from dedupsink.version import __version__

log = logging.getLogger("dedupsink.cli")

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dedupsink",
        description="Run and inspect deduplicating Spark streaming jobs (the 'dedup' sink).",
    )
    parser.add_argument("--version", action="version", version=f"dedupsink {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="tracebacks on errors, Spark warnings"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_job_commands(commands)
    _add_store_commands(commands)
    commands.add_parser(
        "spark-home",
        help="print a Spark home whose Python archives carry bytecode (built once), for "
        "SPARK_HOME: Spark's Python processes then start about a second sooner each",
    )
    return parser


def _add_job_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = commands.add_parser("run", help="run a job config until its trigger ends (or Ctrl-C)")
    run.add_argument("job", metavar="JOB.conf", help="job config file")
    _add_set(run)
    validate = commands.add_parser("validate", help="check a job config without running it")
    validate.add_argument("job", metavar="JOB.conf", help="job config file")
    _add_set(validate)


def _add_store_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The commands that read or mend a store, without Spark."""
    inspect = _store_command(commands, "inspect", "show a store and its ports (no Spark)")
    inspect.add_argument("--json", action="store_true", help="print JSON for machines")
    compact.add_catalog_arguments(inspect)
    history = _store_command(
        commands, "history", "one line per committed window of a store, kept long (no Spark)"
    )
    history.add_argument("--last", metavar="N", type=int, help="only the last N windows")
    history.add_argument("--json", action="store_true", help="print JSON lines, one a window")
    lookup = _store_command(
        commands, "lookup", "whether the store remembers a key, since when, until when (no Spark)"
    )
    lookup.add_argument(
        "pairs", metavar="COLUMN=VALUE", nargs="+", help="the value of each key column"
    )
    lookup.add_argument(
        "--expiry",
        metavar="VALUE",
        help="the key's expiry value, when it is no key column: only its time bucket is read "
        "(tupleTime, ordered); without it every bucket is searched",
    )
    lookup.add_argument("--json", action="store_true", help="print one JSON object")
    report = _store_command(
        commands,
        "report",
        "the store's history as charts in one self-contained HTML page (no Spark)",
    )
    report.add_argument(
        "-o", "--output", metavar="FILE", required=True, help="the HTML file to write"
    )
    report.add_argument("--last", metavar="N", type=int, help="only the last N windows")
    _store_command(commands, "release", "give up a store's owner lease")
    repair = _store_command(
        commands,
        "repair",
        "rewrite damaged or lost Spark sink-log entries of the ports from the store",
    )
    repair.add_argument("--dry-run", action="store_true", help="report, change nothing")
    compaction = _store_command(
        commands,
        "compact",
        "rewrite the small files of Delta or Iceberg ports into fewer, larger ones (no Spark)",
        compact.DESCRIPTION,
    )
    compact.add_arguments(compaction)


def _store_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    summary: str,
    description: str | None = None,
) -> argparse.ArgumentParser:
    """A command about one store: its PATH, ``--store`` and the ``--fs`` storage options;
    ``description`` heads its ``--help`` where the summary says too little."""
    parser = commands.add_parser(name, help=summary, description=description)
    parser.add_argument("path", metavar="PATH", help="an output path or a store path")
    parser.add_argument("--store", metavar="URL", help="the store, when not at PATH/_store")
    _add_storage(parser)
    return parser


def _add_storage(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fs",
        dest="storage",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an fsspec storage option (repeatable), as the sink's fs.<name> options, "
        "e.g. --fs endpoint_url=http://127.0.0.1:9000",
    )


def _storage_options(args: argparse.Namespace) -> dict[str, object]:
    pairs = {}
    for item in args.storage:
        name, separator, value = item.partition("=")
        if not separator or not name.strip():
            raise DedupOptionError("--fs", item.split("=")[0], "NAME=VALUE, e.g. key=AKIA...")
        name = name.strip()
        pairs[name if name.startswith("fs.") else "fs." + name] = value  # either spelling
    return parse_storage_options(pairs)


def _add_set(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set or override a config key (repeatable), e.g. --set path=/tmp/out",
    )


# -- commands --------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    job = prepare(load_config(args.job, args.overrides))
    for note in job.notes:
        log.warning("%s", note)
    return run(job, sys.stdout, "WARN" if args.verbose else "ERROR")


def cmd_validate(args: argparse.Namespace) -> int:
    job = prepare(load_config(args.job, args.overrides))
    print("\n".join(describe(job)))
    return 0


def describe(job: PreparedJob) -> list[str]:
    """What ``validate`` prints: the job as the CLI understood it."""
    config = job.config
    source = config.get("source.path") or "(no path)"
    files = "" if job.source_files is None else f" ({job.source_files} files)"
    options = ", ".join(f"{k}={v}" for k, v in sorted(config.source_options.items()))
    lines = [f"{config.origin}: OK", f"  source      {job.source_format} {source}{files}"]
    if options:
        lines.append(f"  options     {options}")
    if job.schema is not None:
        schema = ", ".join(f"{f.name} {f.dataType.simpleString().upper()}" for f in job.schema)
        lines.append(f"  schema      {schema}")
    if job.settings is not None:
        lines.append(f"  dedup       {settings_text(StoreSettings.of(job.settings))}")
    store = (
        "new"
        if job.manifest is None
        else f"existing, version {job.manifest.version}, settings match"
    )
    checkpoint, fresh = checkpoint_for(job)
    where = f"fresh for each run, under {parent(checkpoint)}" if fresh else checkpoint
    if job.trigger.kind == "batch":
        where = "none (a batch job)"
    spark = ", ".join(
        f"{k}={v}" for k, v in sorted(config.spark_conf.items()) if k != SPARK_PREFIX + "master"
    )
    lines += [
        f"  output      {job.options.path}",
        f"  store       {job.options.store_path} ({store})",
        f"  trigger     {job.trigger.describe()}",
        f"  checkpoint  {where}",
        f"  spark       {spark_master(job)}{'; ' + spark if spark else ''}",
    ]
    lines += [f"  note        {note}" for note in job.notes]
    return lines


def cmd_inspect(args: argparse.Namespace) -> int:
    location = locate(args.path, args.store, _storage_options(args), compact.tables_of(args))
    inspection = inspect_store(location)
    print(to_json(inspection) if args.json else render(inspection))
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    location = locate(args.path, args.store, _storage_options(args))
    rows = history(location, args.last)
    if args.json:
        for line in history_json_lines(location, rows):
            print(line)
    else:
        print(render_history(rows, location.store_url))
    return 0


def cmd_lookup(args: argparse.Namespace) -> int:
    pairs = parse_pairs(args.pairs)
    result = lookup(locate(args.path, args.store, _storage_options(args)), pairs, args.expiry)
    print(lookup_json(result) if args.json else render_lookup(result))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    location = locate(args.path, args.store, _storage_options(args))
    written = write_report(location, args.output, args.last)
    if written.windows == 0:
        print(f"wrote {written.path}: store {written.store_url} has no window committed yet")
        return 0
    windows = "window" if written.windows == 1 else "windows"
    drawn = "" if written.columns == written.windows else f" in {written.columns} columns"
    print(
        f"wrote {written.path}: {written.windows} {windows} of store {written.store_url}"
        f"{drawn} ({human_bytes(written.nbytes)})"
    )
    return 0


def cmd_spark_home(args: argparse.Namespace) -> int:
    home = compiled_spark_home() or installed_spark_home()
    if home is None:
        raise ConfigError(None, "pyspark is not installed here, and SPARK_HOME is not set")
    print(home)
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    store = locate(args.path, args.store, _storage_options(args)).store()
    before = store.read()
    owner = before.owner if before is not None else None
    if owner is None:
        print(f"store {store.url} has no owner: nothing to release")
        return 0
    release(store)
    print(f"released store {store.url} (it was owned by query {owner.query})")
    return 0


def cmd_repair(args: argparse.Namespace) -> int:
    location = locate(args.path, args.store, _storage_options(args))
    store = location.store()
    manifest = store.read()
    ports = location.ports(manifest)
    if ports is None:
        raise ConfigError("PATH", f"store {location.store_url} records no output path to repair")
    owner = manifest.owner if manifest is not None else None
    if owner is not None and owner.lapses_at_ms() > now_ms():
        # A window being published would look damaged; the repair itself is idempotent.
        log.warning("store %s is held by %s: stop it first", store.url, describe_owner(owner))
    found = ports.repair(store, dry_run=args.dry_run)
    verb = "would rewrite" if args.dry_run else "rewrote"
    for item in found:
        print(f"{verb} {item.port} log entry {item.log_id}: {item.path}")
    if not found:
        print(f"every sink-log entry the store {store.url} records is intact")
        if ports.name != "parquet":
            print(f"(the {ports.name} tables keep their own log, which repair leaves alone)")
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    location = locate(args.path, args.store, _storage_options(args))
    print(compact.render(compact.compact(location, args), location.output_url))
    return 0


COMMANDS = {
    "run": cmd_run,
    "validate": cmd_validate,
    "inspect": cmd_inspect,
    "history": cmd_history,
    "lookup": cmd_lookup,
    "report": cmd_report,
    "release": cmd_release,
    "repair": cmd_repair,
    "compact": cmd_compact,
    "spark-home": cmd_spark_home,
}


# -- entry point -----------------------------------------------------------------------------


def _fail(exc: BaseException, code: int, verbose: bool) -> int:
    if verbose:
        traceback.print_exception(exc, file=sys.stderr)
    message = " ".join(str(exc).split()) or type(exc).__name__
    print(f"dedupsink: error: {message}", file=sys.stderr, flush=True)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="dedupsink: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return COMMANDS[args.command](args)
    except (ConfigError, DedupOptionError) as exc:
        return _fail(exc, EXIT_USAGE, args.verbose)
    except DedupError as exc:
        return _fail(exc, int(getattr(exc, "exit_code", EXIT_FAILURE)), args.verbose)
    except BrokenPipeError:
        # The reader of our output went away (``dedupsink inspect ... | head``): not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE
    except OSError as exc:
        return _fail(exc, EXIT_FAILURE, args.verbose)
    except KeyboardInterrupt:
        print("dedupsink: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
