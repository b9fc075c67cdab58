"""The report's page: a ``ReportData`` drawn as inline SVG charts in one self-contained HTML
page, and ``write_report``, which writes it (``dedupsink report`` and ``dedupsink.report``).

The page fetches nothing (its Content-Security-Policy forbids every request), so it opens from
a CI artifact as written. It is the one rendering the library itself offers, so it lives
beside the answer it draws; it reads no store and computes no series of its own.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from dedupsink.engine.classify import PORTS
from dedupsink.errors import ConfigError
from dedupsink.inspection.location import Location
from dedupsink.inspection.report import Column, ReportData, ReportSummary, report_data
from dedupsink.inspection.verdict import Verdict
from dedupsink.units import human_bytes, number_text, utc_text
from dedupsink.version import __version__

__all__ = ["COLOURS", "ReportFile", "page", "write_report"]

# Tableau's colour-blind-safe palette; the port colours are those the tests look for on screen.
COLOURS = {
    "task_seconds": "#ff9da7",
    "wall_seconds": "#2b5c8a",
    "commit_seconds": "#c9a227",
    "rows_per_second": "#bab0ac",
    "keys_added": "#2f6f3e",
    "keys_forgotten": "#b5452f",
    "lag": "#6b4c9a",
    "store_retries": "#d37295",
    "unique": "#4e79a7",
    "duplicate": "#f28e2b",
    "expired": "#76b7b2",
    "error": "#e15759",
    "keys_remembered": "#af7aa1",
    "keys_expired_unfolded": "#8cd17d",
    "store_bytes": "#9c755f",
    "latest_point": "#59a14f",
    "expiry_point": "#edc948",
}
LABELS = {
    "task_seconds": "task seconds (summed)",
    "wall_seconds": "wall seconds (first task to commit)",
    "commit_seconds": "commit seconds",
    "rows_per_second": "rows per task-second",
    "keys_added": "keys added",
    "keys_forgotten": "keys forgotten",
    "lag": "behind by",
    "store_retries": "store retries",
    "unique": "unique",
    "duplicate": "duplicate",
    "expired": "expired",
    "error": "error",
    "keys_remembered": "remembered keys",
    "keys_expired_unfolded": "expired keys awaiting fold",
    "store_bytes": "store bytes",
    "latest_point": "latest point",
    "expiry_point": "expiry point",
}
MARKERS_UP_TO = 100  # columns: a dot on each value below this, a bare line above
X_TICK_SPACING = 180  # px between x ticks: a tick dated to the millisecond is 160 px wide
# An SVG's viewBox and plot margins: room on the left for a y title and dated ticks, below
# for two lines of x ticks and the x title.
WIDTH, LEFT, RIGHT, TOP, BOTTOM = 1100, 160, 40, 34, 64
MICRO = 1_000_000
# Steps of a time axis, in seconds: the first that gives at most six ticks.
TIME_STEPS: tuple[int, ...] = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200)
TIME_STEPS += (10800, 21600, 43200, 86400, 172800, 604800, 2592000, 7776000, 31536000)


def esc(text: object) -> str:
    """Text put into the page, as element content or inside a double-quoted attribute."""
    return html.escape(str(text), quote=True)


@dataclass(frozen=True)
class ReportFile:
    """A report written: where, how many windows it draws, in how many columns, its bytes."""

    path: str
    store_url: str
    windows: int
    columns: int
    nbytes: int


def write_report(
    location: Location, output: str, last: int | None = None, now: datetime | None = None
) -> ReportFile:
    """Write the page of the located store's history (its last ``last`` windows when given)
    to the local file ``output``."""
    target = Path(output)
    if not target.parent.is_dir():  # before the history is read: nothing done for nothing
        raise ConfigError("--output", f"cannot write {output}: no folder {target.parent}")
    data = report_data(location, last, now)
    encoded = page(data, now).encode("utf-8")
    try:
        target.write_bytes(encoded)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError("--output", f"cannot write {output}: {reason}") from exc
    return ReportFile(output, location.store_url, data.windows, len(data.columns), len(encoded))


# -- the page ------------------------------------------------------------------------------------

STYLE = """
body{margin:0;background:#fff;color:#222;font:14px/1.45 system-ui,-apple-system,"Segoe UI",
Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1140px;margin:0 auto;padding:16px 20px 40px}
h1{font-size:22px;margin:8px 0 2px;word-break:break-all}
h2{font-size:16px;margin:28px 0 4px}
p.range,p.note,footer{color:#555;margin:2px 0}
table{border-collapse:collapse;margin:12px 0}
th,td{padding:3px 12px 3px 0;text-align:left;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.swatch{display:inline-block;width:10px;height:10px;margin-right:6px;border-radius:2px}
.empty{font-size:18px;padding:40px 0}
svg{display:block;width:100%;height:auto;font-size:12px}
svg text{fill:#333}
.axis line,.axis path{stroke:#888;stroke-width:1}
.grid line{stroke:#e6e6e6;stroke-width:1}
.series{fill:none;stroke-width:2}
text.missing{font-size:15px;fill:#555}
text.title{font-size:13px;fill:#444}
.marker line{stroke:#555;stroke-width:1.5;stroke-dasharray:5 3}
.marker text{font-size:11px;fill:#333}
table.windows{font-size:12px}
table.windows th{border-bottom:1px solid #ccc}
table.windows td{padding:1px 10px 1px 0}
section.verdict{border-left:6px solid #59a14f;background:#f3f8f1;padding:8px 14px;margin:14px 0}
section.verdict.unhealthy{border-color:#e15759;background:#fcf0f0}
section.verdict h2{margin:2px 0 4px}
section.verdict li{margin:2px 0}
"""


def page(data: ReportData, now: datetime | None = None) -> str:
    """The whole HTML page of a report's answer."""
    now = now or datetime.now(UTC)
    title = f"dedupsink report: {data.store_url}"
    if data.summary is None:
        body = [
            f"<h1>Store history of <code>{esc(data.store_url)}</code></h1>",
            '<p class="empty">No window committed yet: the store\'s history is empty, so '
            "there is nothing to draw. Run a query into the store, then write the report "
            "again.</p>",
        ]
    else:
        body = [
            *_heading(data.summary, data.store_url),
            *_verdict(data.verdict),
            *_summary(data.summary, data),
            *_reasons_table(data.summary),
            *_charts(data),
            *_recent_table(data),
        ]
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            # Nothing to fetch, ever: a page that opens offline as it was written.
            '<meta http-equiv="Content-Security-Policy" '
            "content=\"default-src 'none'; style-src 'unsafe-inline'\">",
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{esc(title)}</title>",
            f"<style>{STYLE}</style>",
            "</head><body><main>",
            *body,
            f"<footer>Written by dedupsink {esc(__version__)} at "
            f"{esc(now.strftime('%Y-%m-%d %H:%M:%S'))} UTC.</footer>",
            "</main></body></html>",
            "",
        ]
    )


def _time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _heading(summary: ReportSummary, store_url: str) -> list[str]:
    windows = "window" if summary.windows == 1 else "windows"
    return [
        f"<h1>Store history of <code>{esc(store_url)}</code></h1>",
        f'<p class="range">{summary.windows} {windows} committed from '
        f"{esc(_time(summary.first_commit))} to {esc(_time(summary.last_commit))} UTC</p>",
    ]


def _verdict(verdict: Verdict | None) -> list[str]:
    """Healthy or not at the top of the page, with the findings that decide it and the notes
    that explain what could look like an alarm (README, "Is it healthy?")."""
    if verdict is None:
        return []
    state = "healthy" if verdict.healthy else "unhealthy"
    out = [
        f'<section class="verdict {state}" data-healthy="{str(verdict.healthy).lower()}">',
        f"<h2>{esc(verdict.headline()[:1].upper() + verdict.headline()[1:])}</h2>",
    ]
    if verdict.findings:
        out.append("<ul>")
        out += [
            f'<li class="{f.kind}" data-rule="{esc(f.rule)}"><b>{esc(f.kind)} {esc(f.rule)}</b>: '
            f"{esc(f.message)}</li>"
            for f in verdict.findings
        ]
        out.append("</ul>")
    out.append(
        f'<p class="note">Judged at {esc(_time(verdict.judged_at))} UTC over the history\'s '
        'last windows by the rules of the README\'s "Is it healthy?" section.</p></section>'
    )
    return out


def _summary(summary: ReportSummary, data: ReportData) -> list[str]:
    """The table of totals over every window, and how the charts draw them."""
    everything = summary.rows
    windows = summary.windows
    facts: list[tuple[str, str]] = [
        (
            "windows",
            f"{windows:,} (versions {summary.first_version:,} to {summary.last_version:,})",
        ),
        ("queries", f"{summary.queries:,}"),
        ("first commit", _time(summary.first_commit) + " UTC"),
        ("last commit", _time(summary.last_commit) + " UTC"),
        ("rows", f"{everything:,}"),
        ("remembered keys", f"{summary.keys_remembered:,} (after the last window)"),
        ("expired keys awaiting fold", _unfolded_text(summary.keys_expired_unfolded)),
        ("store", human_bytes(summary.store_bytes) + " in live window files"),
        ("latest point", summary.latest_text or "none"),
        ("expiry point", summary.expiry_text or "none"),
    ]
    out = ['<table class="summary"><tbody>']
    out += [f"<tr><th>{esc(name)}</th><td>{esc(value)}</td></tr>" for name, value in facts]
    out.append('</tbody></table><table class="ports"><thead><tr><th>port</th>')
    out.append('<th class="n">rows</th><th class="n">share</th></tr></thead><tbody>')
    for port in PORTS:
        count = summary.totals[port]
        share = 100.0 * count / everything if everything else 0.0
        out.append(
            f'<tr><td><span class="swatch" style="background:{COLOURS[port]}"></span>{port}</td>'
            f'<td class="n">{count:,}</td><td class="n">{share:.1f}%</td></tr>'
        )
    out.append("</tbody></table>")
    size = data.group_size
    if size > 1:
        out.append(
            f'<p class="note">The charts draw {windows:,} windows as {len(data.columns):,} '
            f"columns of {size:,} consecutive windows each: rows summed, shares of the sums, "
            "keys, bytes and points as of each group's last window.</p>"
        )
    return out


def _unfolded_text(keys: int | None) -> str:
    if keys is None:
        return "not counted (the last window was committed before they were)"
    return f"{keys:,} (at or below the expiry point: a re-send of them is no duplicate)"


def _seconds_text(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.3f}"


def _charts(data: ReportData) -> list[str]:
    """Every chart of ``CHARTS``, under its heading, in order."""
    out: list[str] = []
    for spec in CHARTS:
        out += [f"<h2>{esc(spec.heading)}</h2>", spec.draw(data)]
    return out


def _reasons_table(summary: ReportSummary) -> list[str]:
    """The error rows' most frequent reasons over the windows drawn."""
    if not summary.totals["error"]:
        return ["<h2>Error rows by reason</h2>", '<p class="note">No error rows.</p>']
    out = ['<h2>Error rows by reason</h2><table class="reasons"><thead><tr>']
    out.append('<th>reason</th><th class="n">rows</th></tr></thead><tbody>')
    entries = list(summary.error_reasons)
    if summary.error_rows_without_reason:
        unrecorded = "(not recorded: committed before reasons were)"
        entries.append((unrecorded, summary.error_rows_without_reason))
    for reason, rows in entries:
        out.append(f'<tr><td>{esc(reason)}</td><td class="n">{rows:,}</td></tr>')
    out.append("</tbody></table>")
    return out


RECENT_HEADINGS = (
    "window",
    "committed (UTC)",
    "query",
    "batch",
    "rows",
    "unique",
    "duplicate",
    "expired",
    "error",
    "keys +",
    "keys -",
    "remembered",
    "awaiting fold",
    "wall s",
    "commit s",
    "task s",
    "rows/s",
    "behind",
    "store retries",
)


def _recent_table(data: ReportData) -> list[str]:
    """The numbers of the last windows, one row each: what the charts say, in text that a
    printout or a screenshot keeps."""
    recent = data.recent
    if not recent:
        return []
    out = [
        f"<h2>The last {len(recent)} windows, newest first</h2>",
        '<table class="windows"><thead><tr>',
        *(
            f'<th class="n">{esc(h)}</th>' if i > 2 else f"<th>{esc(h)}</th>"
            for i, h in enumerate(RECENT_HEADINGS)
        ),
        "</tr></thead><tbody>",
    ]
    for column in reversed(recent):
        cells = [
            column.last_version,
            _time(column.committed_at),
            column.query_id[:8],
            column.batch_id,
            f"{column.rows:,}",
            *(f"{column.counts[port]:,}" for port in PORTS),
            f"{column.keys_added:,}",
            f"{column.keys_forgotten:,}",
            f"{column.keys_remembered:,}",
            "-" if column.keys_expired_unfolded is None else f"{column.keys_expired_unfolded:,}",
            _seconds_text(column.wall_seconds),
            _seconds_text(column.commit_seconds),
            f"{column.task_seconds:.3f}",
            "-" if column.rows_per_second is None else f"{column.rows_per_second:,.0f}",
            "-" if column.lag_seconds is None else _span_text(column.lag_seconds),
            f"{column.store_retries:,} ({column.store_wait_seconds:.1f} s)",
        ]
        row = "".join(
            f'<td class="n">{esc(c)}</td>' if i > 2 else f"<td>{esc(c)}</td>"
            for i, c in enumerate(cells)
        )
        out.append(f'<tr data-version="{column.last_version}">{row}</tr>')
    out.append("</tbody></table>")
    return out


def _span_text(seconds: float) -> str:
    """A lag as a person reads it: ``45 s``, ``12.5 min``, ``3.2 h``, ``2.1 d``."""
    size = abs(seconds)
    if size < 120:
        return f"{seconds:.0f} s"
    if size < 7200:
        return f"{seconds / 60:.1f} min"
    if size < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


# -- axes ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Axis:
    """A y axis: its ticks over the data's range (the first and last are the axis' ends), and
    the text of a tick."""

    ticks: Callable[[float, float], list[float]]
    text: Callable[[float], str]


def _nice(low: float, high: float, most: int = 6) -> list[float]:
    """Ticks at a step of 1, 2, 2.5 or 5 times a power of ten, covering ``low..high``."""
    if high <= low:
        high = low + (abs(low) * 0.01 or 1.0)
    raw = (high - low) / (most - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = float(math.floor(low / step) * step)
    ticks = [first]
    while ticks[-1] < high - step * 1e-9:
        ticks.append(first + len(ticks) * step)
    return ticks


def _count_ticks(low: float, high: float) -> list[float]:
    ticks = _nice(0.0, max(high, 1.0))
    # Whole numbers only: a count axis of 0 to 3 is ticked 0, 1, 2, 3, not 0.5 apart.
    return sorted({float(math.ceil(t)) for t in ticks}) if ticks[1] < 1 else ticks


def _count_text(value: float, digits: int = 3) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.{digits}g}{unit}"
    return number_text(round(value, 6))


def _tick_texts(ticks: Sequence[float], text: Callable[[float], str]) -> list[str]:
    """Each tick's text; a count axis whose ticks would read alike (1.00M and 1.0005M both as
    1M) is written with as many digits as tell them apart."""
    texts = [text(tick) for tick in ticks]
    if text is not _count_text:
        return texts
    digits = 3
    while len(set(texts)) < len(texts) and digits < 12:
        digits += 1
        texts = [_count_text(tick, digits) for tick in ticks]
    return texts


def _time_ticks(low: float, high: float) -> list[float]:
    """Ticks at whole seconds, minutes, hours or days (UTC) covering ``low..high`` µs."""
    span = max(high - low, 0.0) / MICRO
    step = next((s for s in TIME_STEPS if span / s <= 5), TIME_STEPS[-1]) * MICRO
    if high <= low:
        low, high = low - step, high + step
    first = float(math.floor(low / step) * step)
    ticks = [first]
    while ticks[-1] < high:
        ticks.append(first + len(ticks) * step)
    return ticks


def _time_tick_text(ticks: Sequence[float]) -> Callable[[float], str]:
    """Dates with their year always; the time of day to the minute, or to the second when
    the ticks are less than a minute apart."""
    step = (ticks[1] - ticks[0]) / MICRO if len(ticks) > 1 else 86400
    pattern = (
        "%Y-%m-%d" if step >= 86400 else "%Y-%m-%d %H:%M" if step >= 60 else "%Y-%m-%d %H:%M:%S"
    )

    def text(value: float) -> str:
        try:
            return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=value)).strftime(
                pattern
            )
        except OverflowError:
            return utc_text(value)

    return text


def _point_axis(columns: Sequence[Column], mode: str | None) -> tuple[Axis, str]:
    """Times in the time modes, category names in categorical mode, numbers in ordered mode;
    with the axis' title."""
    if mode in ("systemTime", "tupleTime"):
        present = [v for c in columns for v in (c.latest_point, c.expiry_point) if v is not None]
        ticks = _time_ticks(min(present), max(present))
        return Axis(lambda low, high: ticks, _time_tick_text(ticks)), "expiry key time (UTC)"
    if mode == "categorical":
        names: dict[float, str] = {}
        for c in columns:
            for value, text in ((c.latest_point, c.latest_text), (c.expiry_point, c.expiry_text)):
                if value is not None and text is not None:
                    names[value] = "(none)" if value < 0 else text
        axis = Axis(_category_ticks, lambda v: _short(names.get(v, number_text(v))))
        return axis, "category (ordinal)"
    return Axis(_nice, number_text), "expiry key value"


def _category_ticks(low: float, high: float) -> list[float]:
    """Every category's ordinal when there are few (below 0, only the axis' end: no category),
    else round ones."""
    first = math.floor(low)
    last = max(math.ceil(high), first + 1)
    if last - first <= 12:
        return [float(first), *(float(v) for v in range(max(first + 1, 0), max(last, 0) + 1))]
    return sorted({float(round(t)) for t in _nice(first, last)})


def _short(text: str, most: int = 20) -> str:
    """A y tick's text, cut to fit the left margin."""
    return text if len(text) <= most else text[: most - 1] + "…"


# -- charts --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plot:
    """A chart's plot area: columns left to right, ``ticks[0]..ticks[-1]`` bottom to top."""

    columns: int
    ticks: list[float]
    height: int

    @property
    def band(self) -> float:
        return (WIDTH - LEFT - RIGHT) / self.columns

    def x(self, index: int) -> float:
        return LEFT + (index + 0.5) * self.band

    def y(self, value: float) -> float:
        low, high = self.ticks[0], self.ticks[-1]
        return TOP + (self.height - TOP - BOTTOM) * (1 - (value - low) / (high - low or 1))


def _svg_open(name: str, plot: Plot, label: str) -> str:
    return (
        f'<svg class="chart" data-chart="{name}" data-columns="{plot.columns}" '
        f'viewBox="0 0 {WIDTH} {plot.height}" role="img" aria-label="{esc(label)}">'
    )


def _axes(
    plot: Plot, columns: Sequence[Column], text: Callable[[float], str], title: str
) -> Iterator[str]:
    """Grid lines, y ticks and the y title, the x ticks (version over commit time) and the x
    title, the axis lines, and a marker where a query starts."""
    bottom = plot.height - BOTTOM
    yield '<g class="grid">'
    for tick in plot.ticks:
        y = plot.y(tick)
        yield f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
    yield '</g><g class="axis y">'
    for tick, label in zip(plot.ticks, _tick_texts(plot.ticks, text), strict=True):
        y = plot.y(tick)
        yield f'<text x="{LEFT - 8}" y="{y + 4:.1f}" text-anchor="end">{esc(label)}</text>'
    middle = (TOP + bottom) / 2
    lines = _title_lines(title, 2 * min(middle, plot.height - middle) - 12)
    title_x = 16  # a second line, if any, 15 px to the right of it
    # Rotated a quarter turn: a tspan's y moves it across the text, to the right.
    spans = "".join(
        f'<tspan x="{title_x}" y="{middle + 15 * i:.1f}">{esc(line)}</tspan>'
        for i, line in enumerate(lines)
    )
    yield (
        f'<text class="title" x="{title_x}" y="{middle:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 {title_x} {middle:.1f})">{spans}</text>'
    )
    yield f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{bottom}"/></g><g class="axis x">'
    yield f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{bottom}" y2="{bottom}"/>'
    shown = _x_ticks(len(columns), plot.band)
    moments = _moment_texts([columns[i].committed_at for i in shown])
    for index, moment in zip(shown, moments, strict=True):
        x = plot.x(index)
        yield (
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{bottom}" y2="{bottom + 4}"/>'
            f'<text class="tick" x="{x:.1f}" y="{bottom + 17}" text-anchor="middle">'
            f'<tspan>window {columns[index].last_version}</tspan><tspan x="{x:.1f}" dy="14">'
            f"{esc(moment)}</tspan></text>"
        )
    yield (
        f'<text class="title" x="{(LEFT + WIDTH - RIGHT) / 2:.1f}" y="{plot.height - 6}" '
        'text-anchor="middle">window, and when it was committed (UTC)</text></g>'
    )
    yield from _markers(plot, columns)


TITLE_CHAR_PX = 7.2  # the widest a title's character is drawn, on average, at 13 px


def _title_lines(title: str, room: float) -> list[str]:
    """A y title as the lines that fit ``room`` px (rotated, it runs along the plot's height):
    one if it fits, else two split at a space, the first ending in it (so the title's text
    reads whole). A line keeps at least one word."""
    if len(title) * TITLE_CHAR_PX <= room:
        return [title]
    words = title.split(" ")
    first = words[0]
    for word in words[1:]:
        if (len(first) + 1 + len(word)) * TITLE_CHAR_PX > room:
            break
        first += " " + word
    return [first + " ", title[len(first) + 1 :]]


def _moment_texts(moments: Sequence[datetime]) -> list[str]:
    """The commit times of the x ticks to the minute, or to the second or the millisecond
    where two shown would read alike (a fast history's windows share a minute)."""
    texts: list[str] = []
    for digits in (16, 19, 23):  # 2026-11-28 19:51, :48, .120
        texts = [
            m.astimezone(UTC).isoformat(sep=" ", timespec="milliseconds")[:digits] for m in moments
        ]
        if len(set(texts)) == len(texts):
            break
    return texts


def _markers(plot: Plot, columns: Sequence[Column]) -> Iterator[str]:
    """A dashed line before each column where a query's first window is, labelled."""
    bottom = plot.height - BOTTOM
    for index, column in enumerate(columns):
        for query in column.query_starts:
            x = plot.x(index) - plot.band / 2
            yield (
                f'<g class="marker" data-query="{esc(query)}"><line x1="{x:.1f}" x2="{x:.1f}" '
                f'y1="{TOP}" y2="{bottom}"/><text x="{x + 4:.1f}" y="{TOP + 12}">'
                f"query {esc(query[:8])} starts</text></g>"
            )


def _x_ticks(count: int, band: float) -> list[int]:
    """Columns at an even step, at least ``X_TICK_SPACING`` px apart, the first included."""
    step = max(1, math.ceil(X_TICK_SPACING / band))
    return list(range(0, count, step))


def _legend(names: Sequence[str]) -> Iterator[str]:
    """Swatches in the top margin, left to right."""
    yield '<g class="legend">'
    x = LEFT
    for name in names:
        yield (
            f'<rect x="{x}" y="8" width="12" height="12" fill="{COLOURS[name]}"/>'
            f'<text x="{x + 17}" y="18">{esc(LABELS[name])}</text>'
        )
        x += 30 + 8 * len(LABELS[name])
    yield "</g>"


def _stacked_bars(columns: Sequence[Column], height: int = 340) -> str:
    """Rows per port, one bar a column: unique at the bottom, then duplicate, expired, error.
    Each bar's tooltip gives its numbers."""
    plot = Plot(len(columns), _count_ticks(0.0, max(c.rows for c in columns)), height)
    width = plot.band * 0.8 if plot.band >= 3 else plot.band
    out = [_svg_open("rows", plot, "rows per port and window"), *_legend(PORTS)]
    out += _axes(plot, columns, _count_text, "rows of the window (count)")
    out.append('<g class="bars" shape-rendering="crispEdges">')
    for index, column in enumerate(columns):
        counts = ", ".join(f"{port} {column.counts[port]:,}" for port in PORTS)
        tip = f"{column.label}, committed {_time(column.committed_at)} UTC: {counts}"
        out.append(f'<g class="bar" data-version="{column.last_version}"><title>{esc(tip)}</title>')
        x, base = plot.x(index) - width / 2, 0
        for port in PORTS:
            count = column.counts[port]
            if count:
                top, bottom = plot.y(base + count), plot.y(base)
                out.append(
                    f'<rect class="{port}" x="{x:.1f}" y="{top:.1f}" width="{width:.1f}" '
                    f'height="{bottom - top:.1f}" fill="{COLOURS[port]}"/>'
                )
                base += count
        out.append("</g>")
    out.append("</g></svg>")
    return "".join(out)


def _line_chart(
    name: str,
    columns: Sequence[Column],
    series: Mapping[str, Sequence[float | None]],
    axis: Axis,
    value_text: Callable[[float], str],
    title: str,
    height: int = 260,
    texts: Mapping[str, Sequence[str | None]] | None = None,
) -> str:
    """One line a series (broken where a value is None), with a dot a value when few; a dot's
    tooltip is its ``texts`` entry, else ``value_text`` of its value."""
    present = [v for values in series.values() for v in values if v is not None]
    ticks = axis.ticks(min(present, default=0.0), max(present, default=1.0))
    plot = Plot(len(columns), ticks, height)
    out = [_svg_open(name, plot, title), *_legend(list(series))]
    out += _axes(plot, columns, axis.text, title)
    for key, values in series.items():
        shown = (texts or {}).get(key) or [None] * len(values)
        tips = [
            t or (None if v is None else value_text(v)) for v, t in zip(values, shown, strict=True)
        ]
        out += _series(plot, columns, key, values, tips)
    out.append("</svg>")
    return "".join(out)


def _series(
    plot: Plot,
    columns: Sequence[Column],
    key: str,
    values: Sequence[float | None],
    tips: Sequence[str | None],
) -> Iterator[str]:
    colour = COLOURS[key]
    yield f'<g class="line {key}">'
    run: list[str] = []
    for index, value in enumerate([*values, None]):
        if value is not None:
            run.append(f"{plot.x(index):.1f},{plot.y(value):.1f}")
        elif run:
            yield f'<polyline class="series" stroke="{colour}" points="{" ".join(run)}"/>'
            run = []
    if len(columns) <= MARKERS_UP_TO:
        for index, value in enumerate(values):
            if value is not None:
                tip = f"{columns[index].label}: {LABELS[key]} {tips[index]}"
                yield (
                    f'<circle class="point" cx="{plot.x(index):.1f}" cy="{plot.y(value):.1f}" '
                    f'r="3.5" fill="{colour}"><title>{esc(tip)}</title></circle>'
                )
    yield "</g>"


def _points_chart(columns: Sequence[Column], mode: str | None) -> str:
    """The latest and expiry points, on the expiry key's own scale; a sentence instead where
    the store keeps none (Basic Dedup, or no window has set one yet)."""
    latest = [c.latest_point for c in columns]
    expiry = [c.expiry_point for c in columns]
    if all(v is None for v in latest + expiry):
        if mode == "basic":
            why = "No latest or expiry point: this store has no expiry (Basic Dedup), nothing "
            why += "expires."
        else:
            why = "No latest or expiry point yet: no window has carried a value of the expiry key."
        return _sentence("points", columns, why)
    # The tooltips show each point as the history writes it (a UTC time, a category name).
    texts = {
        "latest_point": [c.latest_text for c in columns],
        "expiry_point": [c.expiry_text for c in columns],
    }
    axis, title = _point_axis(columns, mode)
    return _line_chart(
        "points",
        columns,
        {"latest_point": latest, "expiry_point": expiry},
        axis,
        axis.text,
        title,
        texts=texts,
    )


def _lag_chart(data: ReportData) -> str:
    """Commit time minus the latest point, in the unit that suits the largest lag."""
    columns = data.columns
    lags = [c.lag_seconds for c in columns]
    present = [abs(v) for v in lags if v is not None]
    if not data.time_points or not present:
        why = "No lag to draw: the expiry key is no time (Basic Dedup, categorical, ordered or "
        why += "sequence dedup), or no window has carried one yet."
        return _sentence("lag", columns, why)
    unit, size = next(
        (
            (u, s)
            for u, s in (("days", 86400), ("hours", 3600), ("minutes", 60))
            if max(present) >= 2 * s
        ),
        ("seconds", 1),
    )
    chart = _line_chart(
        "lag",
        columns,
        {"lag": [None if v is None else v / size for v in lags]},
        Axis(lambda low, high: _nice(min(low, 0.0), max(high, 1.0)), number_text),
        lambda v: f"{v:,.1f} {unit}",
        f"commit time minus latest point ({unit})",
    )
    return _historical_note(data) + chart


def _historical_note(data: ReportData) -> str:
    """Above the lag chart, the verdict's word that the data is replayed or historical: a lag
    of years, steady, is the data's age, not a stream falling behind."""
    notes = [] if data.verdict is None else data.verdict.notes
    found = [note for note in notes if note.rule == "historical-data"]
    if not found:
        return ""
    return f'<p class="note historical" data-rule="historical-data">{esc(found[0].message)}</p>'


def _sentence(name: str, columns: Sequence[Column], why: str) -> str:
    plot = Plot(len(columns), [0.0, 1.0], 80)
    return (
        f'{_svg_open(name, plot, why)}<text class="missing" x="{LEFT}" y="45">'
        f"{esc(why)}</text></svg>"
    )


# -- the charts, as data ---------------------------------------------------------------------


@dataclass(frozen=True)
class LineChart:
    """A chart of lines, one a series: its ``data-chart`` name, its heading, each series' key
    (its colour and label) with the value it takes of a column (None: a gap), the y axis, a
    value's tooltip text and the y axis' title."""

    name: str
    heading: str
    series: tuple[tuple[str, Callable[[Column], float | None]], ...]
    axis: Axis
    value_text: Callable[[float], str]
    y_title: str

    def draw(self, data: ReportData) -> str:
        columns = data.columns
        values = {key: [value(column) for column in columns] for key, value in self.series}
        return _line_chart(self.name, columns, values, self.axis, self.value_text, self.y_title)


@dataclass(frozen=True)
class DrawnChart:
    """A chart with a drawing of its own (bars, points on the expiry key's scale, the lag)."""

    heading: str
    drawing: Callable[[ReportData], str]

    def draw(self, data: ReportData) -> str:
        return self.drawing(data)


def _optional(value: int | None) -> float | None:
    return None if value is None else float(value)


def _mode(data: ReportData) -> str | None:
    return None if data.settings is None else data.settings.mode


COUNT_AXIS = Axis(_count_ticks, _count_text)
PERCENT_AXIS = Axis(lambda low, high: _nice(0.0, max(high, 1.0)), lambda v: f"{number_text(v)}%")
SECONDS_AXIS = Axis(lambda low, high: _nice(0.0, max(high, 0.001)), number_text)
RETRIES_AXIS = Axis(lambda low, high: _nice(0.0, max(high, 1.0)), number_text)
BYTES_AXIS = Axis(_count_ticks, lambda v: human_bytes(int(v)))

# The report's charts, top to bottom.
CHARTS: tuple[LineChart | DrawnChart, ...] = (
    DrawnChart("Rows per port and window", lambda data: _stacked_bars(data.columns)),
    LineChart(
        "shares",
        "Duplicate and expired share of each window's rows",
        (("duplicate", lambda c: c.share("duplicate")), ("expired", lambda c: c.share("expired"))),
        PERCENT_AXIS,
        lambda v: f"{v:.1f}%",
        "share of the window's rows (%)",
    ),
    LineChart(
        "seconds",
        "Time each window took: wall time from its first task's start to its commit, the "
        "commit's own, and its tasks' seconds summed",
        (
            ("wall_seconds", lambda c: c.wall_seconds),
            ("commit_seconds", lambda c: c.commit_seconds),
            ("task_seconds", lambda c: c.task_seconds),
        ),
        SECONDS_AXIS,
        lambda v: f"{v:.3f} s",
        "time (seconds)",
    ),
    LineChart(
        "throughput",
        "Throughput: rows per second of task time",
        (("rows_per_second", lambda c: c.rows_per_second),),
        COUNT_AXIS,
        lambda v: f"{v:,.0f} rows/s",
        "throughput (rows per second)",
    ),
    LineChart(
        "churn",
        "Keys added and forgotten by each window",
        (
            ("keys_added", lambda c: float(c.keys_added)),
            ("keys_forgotten", lambda c: float(c.keys_forgotten)),
        ),
        COUNT_AXIS,
        lambda v: f"{int(v):,}",
        "keys (count)",
    ),
    LineChart(
        "keys",
        "Remembered keys, and expired keys awaiting fold, after each window",
        (
            ("keys_remembered", lambda c: float(c.keys_remembered)),
            ("keys_expired_unfolded", lambda c: _optional(c.keys_expired_unfolded)),
        ),
        COUNT_AXIS,
        lambda v: f"{int(v):,}",
        "remembered keys (count)",
    ),
    LineChart(
        "bytes",
        "The store's size: bytes of its live window files",
        (("store_bytes", lambda c: float(c.store_bytes)),),
        BYTES_AXIS,
        lambda v: human_bytes(int(v)),
        "store size (bytes)",
    ),
    LineChart(
        "retries",
        "Store retries: requests the storage throttled, dropped or left unanswered",
        (("store_retries", lambda c: float(c.store_retries)),),
        RETRIES_AXIS,
        lambda v: f"{int(v):,}",
        "requests retried (count)",
    ),
    DrawnChart("Latest and expiry points", lambda data: _points_chart(data.columns, _mode(data))),
    DrawnChart("How far behind the data is: commit time minus the latest point", _lag_chart),
)
