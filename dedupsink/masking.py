"""Secrets kept out of text: which option values are secret, and how text is masked.

Storage options (``fs.<name>``) and Iceberg catalog properties carry keys, tokens and
passwords. Errors, logs and the CLI show the options, so each of them masks those values here:
every storage option's but those that say where the storage is, and the catalog properties
whose names say they are secret.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from contextlib import suppress
from urllib.parse import urlsplit

MASK = "***"
# Storage options that say where, not who: their values are shown in errors (an endpoint is what
# a person needs to see when it cannot be reached); every other storage option's value is masked.
SHOWN_STORAGE_OPTIONS = frozenset(
    {"endpoint_url", "endpoint", "region_name", "region", "anon", "use_ssl", "account_name"}
)
# Catalog properties whose values are secrets: masked wherever options are shown.
_SECRET_PROPERTY = re.compile(r"secret|password|token|credential|key", re.IGNORECASE)


def is_secret_property(name: str) -> bool:
    """Whether a catalog property's name says its value is a secret."""
    return _SECRET_PROPERTY.search(name) is not None


def catalog_secrets(properties: Mapping[str, str]) -> list[str]:
    """The values of the catalog properties that are secrets."""
    return [value for name, value in properties.items() if is_secret_property(name)]


def storage_secrets(storage_options: Mapping[str, object]) -> list[object]:
    """The values of ``storage_options`` that errors and logs must not show: all but those of
    ``SHOWN_STORAGE_OPTIONS`` (or names close to one), and of those the password of a URL's
    user part."""
    secrets: list[object] = []
    for name, value in storage_options.items():
        # A misspelt endpoint (fs.endpont_url) is shown as the endpoint would be.
        if not difflib.get_close_matches(name.lower(), SHOWN_STORAGE_OPTIONS, n=1, cutoff=0.8):
            secrets.append(value)
        elif isinstance(value, str) and url_password(value):
            secrets.append(url_password(value))
    return secrets


def url_password(value: str) -> str:
    """The password of a URL's user part (``scheme://user:password@host``); "" for any other
    value."""
    if "@" not in value:
        return ""
    with suppress(ValueError):  # not a URL (an unbalanced '[' in its host part)
        return urlsplit(value).password or ""
    return ""


def mask_values(text: str, values: Iterable[object]) -> str:
    """Replace each of ``values`` (as text, three characters or more) in ``text`` by ``***``."""
    for value in sorted((str(v) for v in values if not isinstance(v, bool)), key=len, reverse=True):
        if len(value) >= 3:
            text = text.replace(value, MASK)
    return text
