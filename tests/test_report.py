"""``dedupsink report`` (``inspection/report.py``, ``inspection/page.py``): the store's history
as charts in one HTML page.

A real store is written through ``LocalSink`` (no Spark), reported by the command, and opened in
headless Chromium (Debian's ``chromium``, which ``make test`` installs): the DOM Chromium builds
holds one bar a window with a rectangle for each port that has rows, one dot a window on each
line, and the screenshot shows the port colours, one bar a window across the chart. The rest
are fast page tests: an empty history, one window, 10,000 windows (at most ``MAX_COLUMNS``
columns, well under 1 MB), a store without points, escaping, and the command's errors.
"""

from __future__ import annotations

import datetime as dt
import re
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import dedupsink
from dedupsink.cli.main import main
from dedupsink.engine.classify import PORTS
from dedupsink.inspection.page import COLOURS, page
from dedupsink.inspection.report import MAX_COLUMNS, columns_of, digest
from dedupsink.sink.local import LocalSink
from dedupsink.store.history import to_table
from dedupsink.store.records import StoreSettings

TIME_SCHEMA = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC"))])
T0 = dt.datetime(2024, 5, 1, 12, tzinfo=dt.UTC)
WINDOWS = 6
SETTINGS = StoreSettings(
    "tupleTime", ("id",), ("int64",), "t", "timestamp[us, tz=UTC]", "int", 3.6e9, None, 16
)


def time_window(batch: int) -> pa.Table:
    """Ten new ids 20 minutes after the last window's; three of those re-sent as they were
    (duplicates); from the third window one row three hours old (expired); a row without a
    time (error)."""
    moment = T0 + dt.timedelta(minutes=20 * batch)
    ids = list(range(10 * batch, 10 * batch + 10))
    times: list[dt.datetime | None] = [moment] * 10
    if batch:
        ids += [10 * batch - 10, 10 * batch - 9, 10 * batch - 8]
        times += [moment - dt.timedelta(minutes=20)] * 3
    if batch >= 2:
        ids.append(100_000 + batch)
        times.append(moment - dt.timedelta(hours=3))
    ids.append(200_000 + batch)
    times.append(None)
    return pa.table({"id": ids, "ts": times}, schema=TIME_SCHEMA)


@pytest.fixture(scope="module")
def time_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report") / "out"
    options = {"path": str(out), "keys": "id", "expiryKey": "ts", "expiryPeriod": "1 hour"}
    sink = LocalSink(options, TIME_SCHEMA)
    for batch in range(WINDOWS):
        sink.window(batch, time_window(batch), partitions=2)
    return out


def report(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["report", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- the DOM ---------------------------------------------------------------------------------


class Element:
    """An element of a parsed page: its tag, attributes, children and own text."""

    def __init__(self, tag: str, attrs: dict[str, str]) -> None:
        self.tag, self.attrs = tag, attrs
        self.children: list[Element] = []
        self.text = ""

    def iter(self, tag: str | None = None, **attrs: str) -> list[Element]:
        found = []
        for child in self.children:
            if (tag is None or child.tag == tag) and all(
                child.attrs.get(k.rstrip("_")) == v for k, v in attrs.items()
            ):
                found.append(child)
            found += child.iter(tag, **attrs)
        return found

    def all_text(self) -> str:
        return self.text + "".join(child.all_text() for child in self.children)


class Tree(HTMLParser):
    VOID = {"meta", "br", "img", "input", "link", "hr"}

    def __init__(self, text: str) -> None:
        super().__init__()
        self.root = Element("#document", {})
        self.stack = [self.root]
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(element)
        if tag not in self.VOID:
            self.stack.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Element(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        while len(self.stack) > 1:
            if self.stack.pop().tag == tag:
                break

    def handle_data(self, data: str) -> None:
        self.stack[-1].text += data


def chart(tree: Tree, name: str) -> Element:
    (svg,) = tree.root.iter("svg", **{"data-chart": name})
    return svg


# -- the browser -----------------------------------------------------------------------------


def chromium(profile: Path, *args: str) -> str:
    binary = shutil.which("chromium")
    if binary is None:
        pytest.fail("chromium is needed: `make test` installs it (Debian's package 'chromium')")
    command = [
        binary,
        "--headless",
        "--no-sandbox",  # as root in a container
        "--disable-gpu",
        "--hide-scrollbars",
        "--force-color-profile=srgb",  # colours as written, for the screenshot's pixels
        "--no-first-run",
        f"--user-data-dir={profile}",
        *args,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def decode_png(data: bytes) -> np.ndarray:
    """An 8-bit RGB or RGBA PNG (as Chromium writes its screenshots) as RGB pixels, rows by
    columns by 3."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, bytearray()
    width = height = colour = 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0
        elif kind == b"IDAT":
            idat += body
    channels = 3 if colour == 2 else 4
    stride = width * channels
    raw = np.frombuffer(zlib.decompress(bytes(idat)), np.uint8).reshape(height, stride + 1)
    image = np.zeros((height, stride), np.uint8)
    above = np.zeros(stride, np.uint8)
    for y in range(height):
        kind, line = int(raw[y, 0]), raw[y, 1:]
        if kind == 0:
            row = line.copy()
        elif kind == 1:  # Sub: a running sum along the row, per channel
            sums = np.cumsum(line.reshape(width, channels), axis=0, dtype=np.uint64)
            row = (sums % 256).astype(np.uint8).ravel()
        elif kind == 2:  # Up
            row = line + above
        else:
            row = unfilter_sequential(kind, line.tobytes(), above.tobytes(), channels)
        image[y] = row
        above = row
    return image.reshape(height, width, channels)[:, :, :3]


def unfilter_sequential(kind: int, line: bytes, above: bytes, channels: int) -> np.ndarray:
    """Average (3) and Paeth (4) rows, byte by byte: each byte depends on the one before."""
    out = bytearray(line)
    for i in range(len(out)):
        left = out[i - channels] if i >= channels else 0
        up = above[i]
        if kind == 3:
            out[i] = (out[i] + (left + up) // 2) & 255
            continue
        corner = above[i - channels] if i >= channels else 0
        guess = left + up - corner
        to_left, to_up, to_corner = abs(guess - left), abs(guess - up), abs(guess - corner)
        if to_left <= to_up and to_left <= to_corner:
            predicted = left
        elif to_up <= to_corner:
            predicted = up
        else:
            predicted = corner
        out[i] = (out[i] + predicted) & 255
    return np.frombuffer(bytes(out), np.uint8)


def rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def runs(flags: np.ndarray) -> int:
    """Runs of True in a row of pixels."""
    padded = np.concatenate([[False], flags, [False]]).astype(np.int8)
    return int((np.diff(padded) == 1).sum())


@pytest.mark.browser
def test_chromium_draws_a_bar_and_a_dot_a_window(
    time_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "report.html"
    code, out, err = report([str(time_store), "-o", str(target)], capsys)
    assert (code, err) == (0, "")
    assert out.startswith(f"wrote {target}: {WINDOWS} windows of store {time_store}/_store (")
    history = dedupsink.history(str(time_store)).to_pylist()
    assert len(history) == WINDOWS
    assert sum(row["expired"] for row in history) > 0  # every port has rows somewhere
    assert all(row["duplicate"] for row in history[1:]) and all(r["error"] for r in history)

    dom = Tree(chromium(tmp_path / "profile", "--dump-dom", target.as_uri()))
    assert f"{time_store}/_store" in dom.root.iter("h1")[0].all_text()
    bars = chart(dom, "rows").iter("g", class_="bar")
    assert [int(bar.attrs["data-version"]) for bar in bars] == [r["version"] for r in history]
    for bar, row in zip(bars, history, strict=True):
        drawn = [rect.attrs["class"] for rect in bar.iter("rect")]
        assert drawn == [port for port in PORTS if row[port]]  # stacked bottom up
        assert bar.iter("title")[0].all_text().endswith(f"error {row['error']}")
    # keys: remembered and expired awaiting fold; seconds: wall, commit and task time
    for name, lines in (("shares", 2), ("keys", 2), ("bytes", 1), ("points", 2), ("seconds", 3)):
        svg = chart(dom, name)
        assert len(svg.iter("circle")) == lines * WINDOWS, name
        assert len(svg.iter("polyline")) == lines, name
        (points,) = svg.iter("polyline")[:1]
        assert len(points.attrs["points"].split()) == WINDOWS
    ticks = [t.all_text() for t in chart(dom, "points").iter("g", class_="axis y")[0].iter("text")]
    assert "2024-05-01 12:00" in ticks  # a time axis, in UTC, dated with the year
    verdict_on_top(dom)
    # Wall time beside task time: a line and a dot a window each, wall and commit seconds.
    seconds = chart(dom, "seconds")
    for key in ("wall_seconds", "commit_seconds", "task_seconds"):
        (line,) = seconds.iter("g", class_=f"line {key}")
        assert len(line.iter("circle")) == WINDOWS, key
    every_axis_title_fits(target, tmp_path)

    shot = tmp_path / "report.png"
    chromium(
        tmp_path / "profile", f"--screenshot={shot}", "--window-size=1200,5000", target.as_uri()
    )
    pixels = decode_png(shot.read_bytes())
    assert pixels.shape == (5000, 1200, 3)
    white = (pixels == 255).all(axis=2)
    assert 0.03 < 1 - white.mean() < 0.6  # drawn, and not a page of one colour
    for name in (*PORTS, "keys_remembered", "store_bytes", "latest_point", "expiry_point"):
        found = (pixels == rgb(COLOURS[name])).all(axis=2)
        assert found.sum() > 150, f"{name}'s colour {COLOURS[name]} is not on screen"
    # The line of pixels that crosses the most of the unique port's colour is the bottom of
    # the bar chart: one run of it per window.
    unique = (pixels == rgb(COLOURS["unique"])).all(axis=2)
    assert runs(unique[int(unique.sum(axis=1).argmax())]) == WINDOWS


def verdict_on_top(dom: Tree) -> None:
    """The verdict is the page's first section: healthy, and the 2024 data named historical
    (its lag of years is said above the lag chart, not raised as an alarm)."""
    main = dom.root.iter("main")[0]
    assert [child.tag for child in main.children[:3]] == ["h1", "p", "section"]
    (verdict,) = main.iter("section", class_="verdict healthy")
    assert verdict.attrs["data-healthy"] == "true"
    assert verdict.iter("h2")[0].all_text() == "Healthy: none of the 6 rules raised an alarm"
    (note,) = verdict.iter("li", class_="note")
    assert note.attrs["data-rule"] == "historical-data"
    assert note.iter("b")[0].all_text() == "note historical-data"
    (above_lag,) = dom.root.iter("p", class_="note historical")
    assert above_lag.all_text().startswith("replayed or historical data: event times are ")
    assert f": {above_lag.all_text()}" in note.all_text()  # the same words, both places


# Measures, in the browser, each axis title's box against its chart's: the report itself runs
# no script (its Content-Security-Policy forbids it), so a copy of it without the policy does.
MEASURE = """<script>
for (const svg of document.querySelectorAll("svg.chart")) {
  const box = svg.getBoundingClientRect();
  for (const title of svg.querySelectorAll("text.title")) {
    const r = title.getBoundingClientRect();
    const fits = r.left >= box.left - 0.5 && r.right <= box.right + 0.5
      && r.top >= box.top - 0.5 && r.bottom <= box.bottom + 0.5;
    title.setAttribute("data-fits", fits ? "yes" : "no");
    title.setAttribute("data-box", [r.left - box.left, r.top - box.top, r.right - box.left,
      r.bottom - box.top].map(Math.round).join(","));
  }
}
</script>"""


def every_axis_title_fits(report_file: Path, tmp_path: Path) -> None:
    """Chromium lays each chart's axis titles out inside the chart: none is clipped (the lag's
    y title, "commit time minus latest point (days)", was, at one line)."""
    page_text = report_file.read_text(encoding="utf-8")
    measured = tmp_path / "measured.html"
    without_policy = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page_text)
    measured.write_text(without_policy.replace("</main>", "</main>" + MEASURE), encoding="utf-8")
    dom = Tree(
        chromium(
            tmp_path / "measure-profile",
            "--window-size=1200,5000",
            "--virtual-time-budget=2000",
            "--dump-dom",
            measured.as_uri(),
        )
    )
    titles = [t for svg in dom.root.iter("svg", class_="chart") for t in svg.iter("text")]
    titles = [t for t in titles if t.attrs.get("class") == "title"]
    assert len(titles) >= 2 * 9  # every chart with axes has two
    clipped = [(t.all_text(), t.attrs["data-box"]) for t in titles if t.attrs["data-fits"] != "yes"]
    assert clipped == []
    lag_title = next(t for t in chart(dom, "lag").iter("text") if t.attrs.get("class") == "title")
    assert lag_title.all_text() == "commit time minus latest point (days)"
    assert len(lag_title.iter("tspan")) == 2  # on two lines, to fit


QUERIES = ("first-query", "second-query")
WINDOWS_A_QUERY = 30
ARTIFACTS = Path(__file__).parent.parent / "build" / "test-artifacts"
NEW_CHARTS = ("seconds", "throughput", "churn", "lag")


@pytest.fixture(scope="module")
def two_queries(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 windows of two queries (the second after a release), error rows of two reasons."""
    out = tmp_path_factory.mktemp("two") / "out"
    options = {"path": str(out), "keys": "id", "expiryKey": "ts", "expiryPeriod": "1 hour"}
    for number, query in enumerate(QUERIES):
        sink = LocalSink(options, TIME_SCHEMA, query_id=query)
        for batch in range(WINDOWS_A_QUERY):
            rows = time_window(number * WINDOWS_A_QUERY + batch)
            if batch % 3 == 0:  # a row without an id: an error of another reason
                extra = pa.table({"id": [None], "ts": [T0]}, schema=TIME_SCHEMA)
                rows = pa.concat_tables([rows, extra])
            sink.window(batch, rows, partitions=2)
        dedupsink.release(str(out))
    return out


def tick_texts(svg: Element, axis: str) -> list[str]:
    (group,) = svg.iter("g", class_=f"axis {axis}")
    return [t.all_text() for t in group.iter("text") if t.attrs.get("class") != "title"]


@pytest.mark.browser
def test_chromium_shows_what_the_operator_asks_of_two_queries(
    two_queries: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Time, throughput, keys added against forgotten, the lag, where each query starts, the
    error rows' reasons and the numbers of every window, as Chromium lays the page out; the
    screenshot is kept in build/test-artifacts/."""
    target = tmp_path / "report.html"
    assert report([str(two_queries), "-o", str(target)], capsys)[0] == 0
    history = dedupsink.history(str(two_queries)).to_pylist()
    versions = [row["version"] for row in history]
    assert len(versions) == 2 * WINDOWS_A_QUERY
    assert versions[WINDOWS_A_QUERY] == versions[WINDOWS_A_QUERY - 1] + 2  # the release's

    dom = Tree(chromium(tmp_path / "profile", "--dump-dom", target.as_uri()))
    charts = dom.root.iter("svg", class_="chart")
    assert {c.attrs["data-chart"] for c in charts} >= {"rows", "points", *NEW_CHARTS}
    for svg in charts:
        name = svg.attrs["data-chart"]
        titles = [t.all_text() for t in svg.iter("text", class_="title")]
        assert len(titles) == 2 and all(titles), name  # a y title and an x title
        assert "(" in titles[0] and titles[1].endswith("(UTC)"), (name, titles)
        for axis in ("x", "y"):
            ticks = tick_texts(svg, axis)
            assert len(set(ticks)) == len(ticks), (name, axis, ticks)
        markers = [g.attrs["data-query"] for g in svg.iter("g", class_="marker")]
        assert markers == list(QUERIES), name
        assert len(svg.iter("circle")) in (0, *(n * len(versions) for n in (1, 2, 3))), name
    assert "query second-q starts" in chart(dom, "rows").all_text()
    lag_title = tick_texts(chart(dom, "lag"), "y")
    assert lag_title and "commit time minus latest point" in chart(dom, "lag").all_text()
    rows = dom.root.iter("table", class_="windows")[0].iter("tr")[1:]
    assert [int(r.attrs["data-version"]) for r in rows] == versions[::-1]
    first = [cell.all_text() for cell in rows[-1].iter("td")]
    assert first[:4] == [str(versions[0]), first[1], "first-qu", "0"]
    reasons = dom.root.iter("table", class_="reasons")[0].all_text()
    errors = sum(row["error"] for row in history)
    recorded = {e["reason"]: 0 for row in history for e in row["error_reasons"]}
    for row in history:
        for entry in row["error_reasons"]:
            recorded[entry["reason"]] += entry["rows"]
    assert len(recorded) == 2 and sum(recorded.values()) == errors
    for reason, count in recorded.items():
        assert reason in reasons and f"{count:,}" in reasons

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "report-two-queries.png"
    chromium(
        tmp_path / "profile", f"--screenshot={shot}", "--window-size=1200,6400", target.as_uri()
    )
    pixels = decode_png(shot.read_bytes())
    for name in (
        "task_seconds",
        "wall_seconds",
        "rows_per_second",
        "keys_added",
        "keys_forgotten",
        "lag",
    ):
        found = (pixels == rgb(COLOURS[name])).all(axis=2)
        assert found.sum() > 150, f"{name}'s colour {COLOURS[name]} is not on screen"
    marker = (pixels == rgb("#555555")).all(axis=2)
    assert marker.sum() > 500  # the dashed lines where the queries start


# -- the page --------------------------------------------------------------------------------


def synthetic(count: int, **columns: Any) -> pa.Table:
    """A history of ``count`` windows a minute apart: 1,000 rows each, some of every port."""
    rows = []
    for v in range(1, count + 1):
        moment = 1_714_564_800_000_000 + v * 60_000_000
        rows.append(
            {
                "version": v,
                "query_id": f"q{v // 1000}",
                "batch_id": v - 1,
                "committed_ms": moment // 1000,
                "unique": 900 + v % 7,
                "duplicate": 80,
                "expired": 15 + v % 3,
                "error": 5,
                "keys_added": 900,
                "keys_forgotten": 850,
                "keys_remembered": 1_000_000 + 50 * v,
                "latest_point": float(moment),
                "latest_point_text": f"latest {v}",
                "expiry_point": float(moment - 86_400_000_000),
                "expiry_point_text": f"expiry {v}",
                "store_files": 24,
                "store_bytes": 40_000_000 + v,
            }
            | columns
        )
    return to_table(rows)


def test_ten_thousand_windows_are_drawn_as_500_columns_well_under_a_megabyte() -> None:
    rows = synthetic(10_000)
    columns = columns_of(rows)
    assert len(columns) == MAX_COLUMNS == 500
    assert (columns[0].first_version, columns[0].last_version) == (1, 20)
    assert columns[0].counts == {
        port: sum(rows.column(port).to_pylist()[:20]) for port in PORTS
    }  # rows summed over the group ...
    assert columns[0].keys_remembered == 1_000_000 + 50 * 20  # ... the rest as of its last
    assert columns[0].latest_text == "latest 20"
    text = page(digest(rows, "/data/out/_store", SETTINGS))
    assert len(text.encode()) < 400_000
    tree = Tree(text)
    assert len(chart(tree, "rows").iter("g", class_="bar")) == 500
    assert chart(tree, "shares").iter("circle") == []  # bare lines past 100 columns
    assert "10,000 windows as 500 columns of 20 consecutive windows" in text
    total = sum(sum(rows.column(port).to_pylist()) for port in PORTS)
    assert f"<th>rows</th><td>{total:,}</td>" in text  # the summary counts every window
    # 501 windows: columns of 2, the last one alone.
    columns = columns_of(synthetic(501))
    assert len(columns) == 251 and columns[-1].first_version == columns[-1].last_version == 501


def test_one_window_is_a_bar_and_a_dot() -> None:
    rows = synthetic(1)
    tree = Tree(page(digest(rows, "/data/out/_store", SETTINGS)))
    assert len(chart(tree, "rows").iter("g", class_="bar")) == 1
    assert len(chart(tree, "points").iter("circle")) == 2
    assert len(chart(tree, "keys").iter("circle")) == 1


def test_an_empty_history_is_a_page_that_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    LocalSink({"path": str(out), "keys": "id"}, pa.schema([("id", pa.int64())])).start()
    target = tmp_path / "empty.html"
    code, printed, _ = report([str(out), "-o", str(target)], capsys)
    assert code == 0
    assert printed == f"wrote {target}: store {out}/_store has no window committed yet\n"
    text = target.read_text()
    assert "No window committed yet" in text and "<svg" not in text


def test_a_store_without_points_says_so_and_text_is_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / 'a<b>&"c' / "out"
    sink = LocalSink({"path": str(out), "keys": "id"}, pa.schema([("id", pa.int64())]))
    for batch in range(3):
        sink.window(batch, pa.table({"id": list(range(batch, batch + 5))}), partitions=2)
    target = tmp_path / "basic.html"
    assert report([str(out), "-o", str(target), "--last", "2"], capsys)[0] == 0
    text = target.read_text()
    assert "a&lt;b&gt;&amp;&quot;c" in text and "a<b>" not in text
    tree = Tree(text)
    points = chart(tree, "points")
    assert points.iter("polyline") == [] and points.iter("circle") == []
    assert "this store has no expiry (Basic Dedup)" in points.all_text()
    assert len(chart(tree, "rows").iter("g", class_="bar")) == 2  # --last 2
    # Self-contained: nothing to fetch, nothing to run.
    for needle in ("<script", "http:", "https:", "src=", "href=", "url("):
        assert needle not in text
    assert "default-src 'none'" in text


def test_the_python_function_and_the_commands_errors(
    time_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "api.html"
    written = dedupsink.report(str(time_store / "_store"), str(target), last=3)
    assert (written.windows, written.columns, written.store_url) == (3, 3, f"{time_store}/_store")
    assert written.nbytes == target.stat().st_size
    code, _, err = report([str(tmp_path / "nothing"), "-o", str(target)], capsys)
    assert code == 2 and err.count("\n") == 1 and "no dedup store" in err
    missing = tmp_path / "no" / "dir.html"
    code, out, err = report([str(time_store), "-o", str(missing)], capsys)
    assert (code, out) == (2, "")
    assert err == f"dedupsink: error: cannot write {missing}: no folder {missing.parent}\n"
    assert not missing.parent.exists()
