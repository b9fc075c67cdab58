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

from dedupsink import __version__
from dedupsink.engine.classify import PORTS
from dedupsink.errors import ConfigError
from dedupsink.inspection.location import Location
from dedupsink.inspection.report import Column, ReportData, ReportSummary, report_data
from dedupsink.units import human_bytes, number_text, utc_text

__all__ = ["COLOURS", "ReportFile", "page", "write_report"]

# Tableau's colour-blind-safe palette; the port colours are those the tests look for on screen.
COLOURS = {
    "unique": "#4e79a7",
    "duplicate": "#f28e2b",
    "expired": "#76b7b2",
    "error": "#e15759",
    "keys_remembered": "#af7aa1",
    "store_bytes": "#9c755f",
    "latest_point": "#59a14f",
    "expiry_point": "#edc948",
}
LABELS = {
    "unique": "unique",
    "duplicate": "duplicate",
    "expired": "expired",
    "error": "error",
    "keys_remembered": "remembered keys",
    "store_bytes": "store bytes",
    "latest_point": "latest point",
    "expiry_point": "expiry point",
}
MARKERS_UP_TO = 100  # columns: a dot on each value below this, a bare line above
WIDTH, LEFT, RIGHT, TOP, BOTTOM = 1100, 90, 48, 34, 46  # an SVG's viewBox and plot margins
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
    data = report_data(location, last)
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
        mode = None if data.settings is None else data.settings.mode
        body = [
            *_heading(data.summary, data.store_url),
            *_summary(data.summary, data),
            *_charts(data.columns, mode),
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


def _charts(columns: Sequence[Column], mode: str | None) -> list[str]:
    count_axis = Axis(_count_ticks, _count_text)
    stacked = _stacked_bars(columns)
    shares = _line_chart(
        "shares",
        columns,
        {port: [c.share(port) for c in columns] for port in ("duplicate", "expired")},
        Axis(lambda low, high: _nice(0.0, max(high, 1.0)), lambda v: f"{number_text(v)}%"),
        lambda v: f"{v:.1f}%",
    )
    keys = _line_chart(
        "keys",
        columns,
        {"keys_remembered": [float(c.keys_remembered) for c in columns]},
        count_axis,
        lambda v: f"{int(v):,}",
    )
    size = _line_chart(
        "bytes",
        columns,
        {"store_bytes": [float(c.store_bytes) for c in columns]},
        Axis(_count_ticks, lambda v: human_bytes(int(v))),
        lambda v: human_bytes(int(v)),
    )
    return [
        "<h2>Rows per port and window</h2>",
        stacked,
        "<h2>Duplicate and expired share of each window's rows</h2>",
        shares,
        "<h2>Remembered keys after each window</h2>",
        keys,
        "<h2>The store's size: bytes of its live window files</h2>",
        size,
        "<h2>Latest and expiry points</h2>",
        _points_chart(columns, mode),
    ]


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


def _count_text(value: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.3g}{unit}"
    return number_text(round(value, 6))


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
    step = (ticks[1] - ticks[0]) / MICRO if len(ticks) > 1 else 86400
    pattern = "%Y-%m-%d" if step >= 86400 else "%m-%d %H:%M" if step >= 60 else "%H:%M:%S"

    def text(value: float) -> str:
        try:
            return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=value)).strftime(
                pattern
            )
        except OverflowError:
            return utc_text(value)

    return text


def _point_axis(columns: Sequence[Column], mode: str | None) -> Axis:
    """Times in the time modes, category names in categorical mode, numbers in ordered mode."""
    if mode in ("systemTime", "tupleTime"):
        present = [v for c in columns for v in (c.latest_point, c.expiry_point) if v is not None]
        ticks = _time_ticks(min(present), max(present))
        return Axis(lambda low, high: ticks, _time_tick_text(ticks))
    if mode == "categorical":
        names: dict[float, str] = {}
        for c in columns:
            for value, text in ((c.latest_point, c.latest_text), (c.expiry_point, c.expiry_text)):
                if value is not None and text is not None:
                    names[value] = "(none)" if value < 0 else text
        return Axis(_category_ticks, lambda v: _short(names.get(v, number_text(v))))
    return Axis(_nice, number_text)


def _category_ticks(low: float, high: float) -> list[float]:
    """Every category's ordinal when there are few (below 0, only the axis' end: no category),
    else round ones."""
    first = math.floor(low)
    last = max(math.ceil(high), first + 1)
    if last - first <= 12:
        return [float(first), *(float(v) for v in range(max(first + 1, 0), max(last, 0) + 1))]
    return sorted({float(round(t)) for t in _nice(first, last)})


def _short(text: str, most: int = 13) -> str:
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


def _axes(plot: Plot, columns: Sequence[Column], text: Callable[[float], str]) -> Iterator[str]:
    """Grid lines and y ticks, the x ticks (version over commit time) and the axis lines."""
    bottom = plot.height - BOTTOM
    yield '<g class="grid">'
    for tick in plot.ticks:
        y = plot.y(tick)
        yield f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
    yield '</g><g class="axis y">'
    for tick in plot.ticks:
        y = plot.y(tick)
        yield f'<text x="{LEFT - 8}" y="{y + 4:.1f}" text-anchor="end">{esc(text(tick))}</text>'
    yield f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{bottom}"/></g><g class="axis x">'
    yield f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{bottom}" y2="{bottom}"/>'
    for index in _x_ticks(len(columns)):
        x = plot.x(index)
        column = columns[index]
        yield (
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{bottom}" y2="{bottom + 4}"/>'
            f'<text x="{x:.1f}" y="{bottom + 17}" text-anchor="middle">'
            f'<tspan>v{column.last_version}</tspan><tspan x="{x:.1f}" dy="14">'
            f"{esc(column.committed_at.strftime('%m-%d %H:%M'))}</tspan></text>"
        )
    yield "</g>"


def _x_ticks(count: int, most: int = 8) -> list[int]:
    if count <= most:
        return list(range(count))
    return sorted({round(i * (count - 1) / (most - 1)) for i in range(most)})


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


def _stacked_bars(columns: Sequence[Column], height: int = 320) -> str:
    """Rows per port, one bar a column: unique at the bottom, then duplicate, expired, error.
    Each bar's tooltip gives its numbers."""
    plot = Plot(len(columns), _count_ticks(0.0, max(c.rows for c in columns)), height)
    width = plot.band * 0.8 if plot.band >= 3 else plot.band
    out = [_svg_open("rows", plot, "rows per port and window"), *_legend(PORTS)]
    out += _axes(plot, columns, _count_text)
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
    height: int = 240,
    texts: Mapping[str, Sequence[str | None]] | None = None,
) -> str:
    """One line a series (broken where a value is None), with a dot a value when few; a dot's
    tooltip is its ``texts`` entry, else ``value_text`` of its value."""
    present = [v for values in series.values() for v in values if v is not None]
    ticks = axis.ticks(min(present, default=0.0), max(present, default=1.0))
    plot = Plot(len(columns), ticks, height)
    out = [_svg_open(name, plot, name), *_legend(list(series))]
    out += _axes(plot, columns, axis.text)
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
        return _no_points(columns, mode)
    # The tooltips show each point as the history writes it (a UTC time, a category name).
    texts = {
        "latest_point": [c.latest_text for c in columns],
        "expiry_point": [c.expiry_text for c in columns],
    }
    axis = _point_axis(columns, mode)
    return _line_chart(
        "points",
        columns,
        {"latest_point": latest, "expiry_point": expiry},
        axis,
        axis.text,
        texts=texts,
    )


def _no_points(columns: Sequence[Column], mode: str | None) -> str:
    if mode == "basic":
        why = "No latest or expiry point: this store has no expiry (Basic Dedup), nothing expires."
    else:
        why = "No latest or expiry point yet: no window has carried a value of the expiry key."
    plot = Plot(len(columns), [0.0, 1.0], 80)
    return (
        f'{_svg_open("points", plot, why)}<text class="missing" x="{LEFT}" y="45">'
        f"{esc(why)}</text></svg>"
    )
