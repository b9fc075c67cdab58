"""Paths and URLs as the storage takes them: '/'-joined names, whatever the filesystem."""

from __future__ import annotations

import os
import re


def join(*parts: str) -> str:
    """Join path or URL segments with '/', whatever the filesystem."""
    head, *rest = parts
    return "/".join([head.rstrip("/"), *(part.strip("/") for part in rest)])


def parent(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[0]


def basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


_URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def resolve_path(value: str) -> str:
    """A URL with a scheme stays as it is; a plain path becomes absolute (from the cwd)."""
    if _URL_SCHEME.match(value):
        return value
    return os.path.abspath(os.path.expanduser(value))
