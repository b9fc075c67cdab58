"""Job config files: ``key = value`` lines read into a ``JobConfig``.

``#`` starts a comment (at a line's start or after whitespace), a trailing ``\\`` continues a
line. Keys: ``source.*``, the sink options (case-insensitive), ``checkpointLocation``,
``trigger`` and ``spark.<name>``; ``--set key=value`` overrides. An unknown or repeated key is
an error naming it; relative paths resolve against the current directory.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from dedupsink.errors import ConfigError, DedupOptionError
from dedupsink.options import (
    ICEBERG_CATALOG_PREFIX,
    PATH,
    SINK_OPTIONS,
    STORAGE_OPTION_PREFIX,
    STORE_PATH,
)
from dedupsink.store.storage import resolve_path
from dedupsink.units import parse_duration

__all__ = [
    "CHECKPOINT",
    "JOB_KEYS",
    "SOURCE_FORMAT",
    "SOURCE_OPTION",
    "SOURCE_PATH",
    "SOURCE_SCHEMA",
    "SPARK_PREFIX",
    "TRIGGER",
    "JobConfig",
    "Setting",
    "Trigger",
    "load_config",
    "parse_config",
    "parse_trigger",
]

SOURCE_FORMAT = "source.format"
SOURCE_PATH = "source.path"
SOURCE_SCHEMA = "source.schema"
SOURCE_OPTION = "source.option."
CHECKPOINT = "checkpointLocation"
TRIGGER = "trigger"
SPARK_PREFIX = "spark."
JOB_KEYS = (SOURCE_FORMAT, SOURCE_PATH, SOURCE_SCHEMA, CHECKPOINT, TRIGGER, *SINK_OPTIONS)
PATH_KEYS = (SOURCE_PATH, PATH, STORE_PATH, CHECKPOINT)
TRIGGER_DEFAULT = "availableNow"
TRIGGER_ACCEPTED = "availableNow, once, batch, or a processing-time interval such as '10 seconds'"

_KNOWN = {key.lower(): key for key in JOB_KEYS}
_INLINE_COMMENT = re.compile(r"\s+#.*$")


@dataclass(frozen=True)
class Setting:
    """One key's value and where it came from (``file:line`` or ``--set``)."""

    key: str
    value: str
    origin: str


@dataclass(frozen=True)
class Trigger:
    """How the query is triggered: ``availableNow``, ``once`` or every ``interval_ms``."""

    kind: Literal["availableNow", "once", "batch", "processingTime"]
    text: str
    interval_ms: int = 0

    def describe(self) -> str:
        if self.kind == "batch":
            return "batch (the source read once and written as one window)"
        return self.kind if self.kind != "processingTime" else f"every {self.text}"


@dataclass
class JobConfig:
    """A job: the config file's settings with the command line's ``--set`` applied."""

    name: str
    origin: str
    settings: dict[str, Setting] = field(default_factory=dict)

    def get(self, key: str) -> str | None:
        setting = self.settings.get(key)
        return setting.value if setting else None

    def where(self, key: str) -> str:
        """Where a key was set (for messages), or the config file when it was not."""
        if key in self.settings:
            return self.settings[key].origin
        lowered = {name.lower(): name for name in self.settings}
        name = lowered.get(key.lower())
        return self.settings[name].origin if name else self.origin

    def prefixed(self, prefix: str, strip: bool) -> dict[str, str]:
        return {
            (key[len(prefix) :] if strip else key): setting.value
            for key, setting in self.settings.items()
            if key.startswith(prefix)
        }

    @property
    def source_options(self) -> dict[str, str]:
        return self.prefixed(SOURCE_OPTION, strip=True)

    @property
    def spark_conf(self) -> dict[str, str]:
        return self.prefixed(SPARK_PREFIX, strip=False)

    @property
    def sink_options(self) -> dict[str, str]:
        """The sink's options: the named ones, every ``fs.<name>`` storage option and every
        ``iceberg.catalog.<property>``."""
        named = {key: self.settings[key].value for key in SINK_OPTIONS if key in self.settings}
        storage = self.prefixed(STORAGE_OPTION_PREFIX, strip=False)
        return {**named, **storage, **self.prefixed(ICEBERG_CATALOG_PREFIX, strip=False)}


def canonical_key(key: str, where: str) -> str:
    """The key as the CLI knows it; unknown keys are refused with a did-you-mean hint."""
    if key.lower() in _KNOWN:
        return _KNOWN[key.lower()]
    if key.startswith(SOURCE_OPTION) and len(key) > len(SOURCE_OPTION):
        return key
    if key.startswith(SPARK_PREFIX) and len(key) > len(SPARK_PREFIX):
        return key
    for prefix in (STORAGE_OPTION_PREFIX, ICEBERG_CATALOG_PREFIX):
        if key.startswith(prefix) and len(key) > len(prefix):
            return key
    raise ConfigError(key, f"unknown key {key!r}{_hint(key)}", where)


def _hint(key: str) -> str:
    parts = key.split(".")
    candidates = list(_KNOWN)
    if len(parts) >= 3:
        candidates.append(SOURCE_OPTION.lower() + ".".join(parts[2:]).lower())
    if len(parts) >= 2:
        candidates.append(SPARK_PREFIX + ".".join(parts[1:]).lower())
    close = difflib.get_close_matches(key.lower(), candidates, n=1, cutoff=0.75)
    if close:
        match = close[0]
        if match in _KNOWN:
            return f" (did you mean {_KNOWN[match]}?)"
        suffix = key.split(".", 2)[-1] if match.startswith(SOURCE_OPTION) else key.split(".", 1)[-1]
        prefix = SOURCE_OPTION if match.startswith(SOURCE_OPTION) else SPARK_PREFIX
        return f" (did you mean {prefix}{suffix}?)"
    return "; known keys: " + ", ".join(JOB_KEYS) + f", {SOURCE_OPTION}<name>, {SPARK_PREFIX}<name>"


def _logical_lines(text: str) -> Iterable[tuple[int, str]]:
    """(line number, line) with comments removed and ``\\`` continuations joined."""
    pending = ""
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        line = _INLINE_COMMENT.sub("", line)
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        yield start, pending + line
        pending = ""
    if pending:
        yield start, pending.rstrip()


def parse_config(text: str, origin: str, name: str = "job") -> JobConfig:
    """Parse config text; ``origin`` (a file name) prefixes every message."""
    config = JobConfig(name, origin)
    for number, line in _logical_lines(text):
        where = f"{origin}:{number}"
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ConfigError(None, f"expected 'key = value', found {line!r}", where)
        _set(config, key.strip(), value.strip(), where, replace=False)
    return config


def _set(config: JobConfig, key: str, value: str, where: str, replace: bool) -> None:
    canonical = canonical_key(key, where)
    if not value:
        raise ConfigError(canonical, f"{canonical} has no value", where)
    if canonical.startswith(SOURCE_OPTION):
        # Spark reads a source's options without case: two spellings would be one option.
        spelt = _source_option_as_set(config, canonical)
        if spelt is not None and replace:
            del config.settings[spelt]
        elif spelt is not None:
            canonical = spelt
    if canonical in config.settings and not replace:
        first = config.settings[canonical].origin
        raise ConfigError(canonical, f"{canonical} is set twice (first at {first})", where)
    config.settings[canonical] = Setting(canonical, value, where)


def _source_option_as_set(config: JobConfig, key: str) -> str | None:
    """The key a source option is already set under, in whatever case; None if it is not."""
    lowered = key.lower()
    return next((name for name in config.settings if name.lower() == lowered), None)


def apply_overrides(config: JobConfig, overrides: Iterable[str]) -> None:
    """Apply ``--set key=value`` arguments (they win over the file)."""
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(None, f"--set expects key=value, found {item!r}")
        _set(config, key.strip(), value.strip(), f"--set {key.strip()}", replace=True)


def load_config(path: str, overrides: Iterable[str] = ()) -> JobConfig:
    """Read a config file, apply ``--set`` overrides and resolve relative paths."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(None, f"cannot read job config {path}: {exc.strerror or exc}") from exc
    config = parse_config(text, path, file.stem)
    apply_overrides(config, overrides)
    resolve_paths(config)
    return config


def resolve_paths(config: JobConfig) -> None:
    for key in PATH_KEYS:
        setting = config.settings.get(key)
        if setting is not None:
            config.settings[key] = Setting(key, resolve_path(setting.value), setting.origin)


def parse_trigger(text: str | None, where: str | None = None) -> Trigger:
    """``availableNow`` (the default), ``once``, ``batch`` (a batch job: ``spark.read`` once,
    written as one window), or a processing-time interval."""
    if text is None:
        return Trigger("availableNow", TRIGGER_DEFAULT)
    lowered = text.strip().lower()
    if lowered == "availablenow":
        return Trigger("availableNow", text)
    if lowered == "once":
        return Trigger("once", text)
    if lowered == "batch":
        return Trigger("batch", text)
    try:
        span = parse_duration(TRIGGER, text)
    except DedupOptionError as exc:
        raise ConfigError(
            TRIGGER, f"trigger={text!r} is invalid: expected {TRIGGER_ACCEPTED}", where
        ) from exc
    return Trigger("processingTime", text, max(1, span.micros // 1000))
