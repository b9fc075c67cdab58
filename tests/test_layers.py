"""The folders are the layers: each imports only the layers below it, and the command line only
parses and prints the answers of ``dedupsink.inspection``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "dedupsink"
# Lowest first: a module may import its own layer and those before it, never one after.
LAYERS = ("top", "engine", "store", "ports", "sink", "inspection", "cli")
TOP_LEVEL = ("options", "errors", "units", "masking", "runtime", "version")
# The questions' layer holds what the command line once did of its own.
NOT_FOR_THE_CLI = (
    "dedupsink.store.cache",
    "dedupsink.engine.fingerprint",
    "dedupsink.engine.keyset",
)


def modules(folder: str) -> list[Path]:
    """The modules of a layer, those of its subpackages (``store/storage/``) included."""
    return sorted((PACKAGE / folder).rglob("*.py"))


def imported(path: Path) -> set[str]:
    """Every dedupsink module ``path`` imports, at its top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name == "dedupsink" or name.startswith("dedupsink.")}


def module_name(path: Path) -> str:
    """``dedupsink/store/storage/__init__.py`` -> ``dedupsink.store.storage``."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """The dedupsink modules each dedupsink module imports, at its top, inside a function or
    under ``TYPE_CHECKING`` alike: a circle dodged by a late import is still a circle.
    ``from a import b`` imports the module ``a.b`` when there is one, else ``a``."""
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                module = absolute(node, package)
                for alias in node.names:
                    submodule = f"{module}.{alias.name}"
                    targets.add(submodule if submodule in paths else module)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[name] = {target for target in targets if target in paths and target != name}
    return graph


def absolute(node: ast.ImportFrom, package: str) -> str:
    """The module ``from ... import`` names, a relative one resolved from ``package``."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = parts[: len(parts) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    pending = [start]
    while pending:
        for target in graph[pending.pop()] - seen:
            seen.add(target)
            pending.append(target)
    return seen


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in TOP_LEVEL:
        return "top"
    return parts[1]


@pytest.mark.parametrize("folder", LAYERS[1:])
def test_each_layer_imports_only_the_layers_below_it(folder: str) -> None:
    rank = LAYERS.index(folder)
    upward = {
        f"{path.name}: {module}"
        for path in modules(folder)
        for module in imported(path)
        if module != "dedupsink" and LAYERS.index(layer_of(module)) > rank
    }
    # The sink and the questions are siblings: neither needs the other.
    if folder == "inspection":
        upward |= {
            f"{path.name}: {m}"
            for path in modules(folder)
            for m in imported(path)
            if layer_of(m) == "sink"
        }
    assert upward == set()


def test_the_cli_reads_no_buckets_and_fingerprints_no_keys() -> None:
    found = {
        f"{path.name}: {module}"
        for path in modules("cli")
        for module in imported(path)
        if module in NOT_FOR_THE_CLI
    }
    assert found == set()


def test_no_cli_function_takes_or_returns_a_loose_dictionary() -> None:
    loose = []
    for path in modules("cli"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef):
                continue
            annotations = [arg.annotation for arg in node.args.args] + [node.returns]
            if any(a is not None and "dict[str, Any]" in ast.unparse(a) for a in annotations):
                loose.append(f"{path.name}: {node.name}")
    assert loose == []


def test_the_public_api_imports_nothing_from_the_cli() -> None:
    assert {m for m in imported(PACKAGE / "__init__.py") if m.startswith("dedupsink.cli")} == set()


def test_no_modules_import_each_other_in_a_circle() -> None:
    """Dependencies go one way, inside a layer too: the store imports nothing of the ownership
    rules that act on it (the clock they share is the records'), and no module below the
    command line imports the package root, whose functions reach up to the sink."""
    graph = import_graph()
    reach = {module: reachable(graph, module) for module in graph}
    circles = {
        tuple(sorted(other for other in reach[module] if module in reach[other]))
        for module in graph
        if module in reach[module]
    }
    assert circles == set()


def test_only_the_command_line_imports_the_package_root() -> None:
    """The root is the public API, above every layer: what a module needs of it has a home
    below it (the version is ``dedupsink.version``'s)."""
    importers = {
        module
        for module, targets in import_graph().items()
        if "dedupsink" in targets and layer_of(module) not in ("cli", "__main__")
    }
    assert importers == set()


def test_the_installed_distribution_takes_its_version_from_the_package() -> None:
    """pyproject.toml names no version of its own: the one in ``dedupsink/version.py`` (Delta's
    ``engineInfo``, the report's page, ``--version``) is the installed distribution's."""
    from importlib.metadata import version

    from dedupsink.version import __version__

    assert version("dedupsink") == __version__
