"""The operator commands' printed outputs on the shipped demo's store, with the place the store
was copied to written as ``<OUTPUT>``: ``tests/data/demo_output/`` holds them as recorded.

``python tests/operator_outputs.py`` records them again (after a change to the printed text
made on purpose); ``test_operator_outputs.py`` compares the commands' outputs with them.
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import sys
from pathlib import Path

from dedupsink.cli.main import main

DEMO = Path(__file__).parent / "data" / "demo_output"
STORE_COPY = DEMO / "system-logs"  # two runs of `make run` (conf/system-logs.conf)
RECORDED = DEMO / "recorded"
PLACEHOLDER = "<OUTPUT>"
# name -> the command's arguments after PATH ("{report}": the report's file)
COMMANDS: dict[str, list[str]] = {
    "inspect.txt": ["inspect"],
    "inspect.json": ["inspect", "--json"],
    "history.txt": ["history"],
    "history.jsonl": ["history", "--json"],
    "history-last-2.txt": ["history", "--last", "2"],
    "lookup-remembered.txt": ["lookup", "serial=290"],
    "lookup-remembered.json": ["lookup", "--json", "serial=290"],
    "lookup-forgotten.txt": ["lookup", "serial=2"],
    "lookup-forgotten.json": ["lookup", "--json", "serial=2"],
    "lookup-expiry.txt": ["lookup", "serial=290", "--expiry", "2014-12-31T07:52:00"],
    "lookup-unknown.txt": ["lookup", "serial=999999"],
    "lookup-unknown.json": ["lookup", "--json", "serial=999999"],
    "report.html": ["report", "-o", "{report}"],
}
# The report's footer says when it was written, the verdict when it was judged.
_WRITTEN_AT = re.compile(r"Written by dedupsink [^ ]+ at [0-9: -]+ UTC\.")
_JUDGED_AT = re.compile(r"Judged at [0-9: -]+ UTC")
_JUDGED_AT_JSON = re.compile(r'"judged_at": "[^"]+"')


def copy_store(where: Path) -> Path:
    """A copy of the demo's output folder (its store in ``_store``) under ``where``."""
    target = where / "system-logs"
    shutil.copytree(STORE_COPY, target)
    return target


def output_of(name: str, output: Path, scratch: Path) -> str:
    """What the command ``name`` prints (for the report: the page it writes) on ``output``."""
    args = [a.replace("{report}", str(scratch / "report.html")) for a in COMMANDS[name]]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main([args[0], str(output), *args[1:]])
    if code != 0:
        raise RuntimeError(f"dedupsink {' '.join(args)} exited with {code}")
    text = printed.getvalue()
    if name == "report.html":
        page = (scratch / "report.html").read_text(encoding="utf-8")
        text = _WRITTEN_AT.sub("Written by dedupsink at (time).", page)
    text = _JUDGED_AT.sub("Judged at (time)", text)
    text = _JUDGED_AT_JSON.sub('"judged_at": "(time)"', text)
    return text.replace(str(output), PLACEHOLDER)


def record(scratch: Path) -> None:
    output = copy_store(scratch)
    RECORDED.mkdir(exist_ok=True)
    for name in COMMANDS:
        (RECORDED / name).write_text(output_of(name, output, scratch), encoding="utf-8")


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        record(Path(folder))
    sys.stdout.write(f"recorded {len(COMMANDS)} outputs in {RECORDED}\n")
