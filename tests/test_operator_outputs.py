"""The operator commands print, on the shipped demo's store, exactly what they printed when the
outputs were recorded (``tests/operator_outputs.py``): a move of their logic changes no byte."""

from __future__ import annotations

from pathlib import Path

import pytest
from operator_outputs import COMMANDS, RECORDED, copy_store, output_of


@pytest.fixture(scope="module")
def demo_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_store(tmp_path_factory.mktemp("demo"))


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_output_is_as_recorded(name: str, demo_output: Path, tmp_path: Path) -> None:
    recorded = (RECORDED / name).read_text(encoding="utf-8")
    assert output_of(name, demo_output, tmp_path) == recorded
