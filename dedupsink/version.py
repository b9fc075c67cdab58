"""The package's version, a module of its own at the bottom of the layers: the ports (Delta's
``engineInfo``), the report's page and the command line name it without importing the package
root, which reaches up to the sink and the questions."""

from __future__ import annotations

__version__ = "0.1.0"
