"""``make test-compat``: the compatibility suite, run against each PySpark release the package
accepts, each in a venv of its own, and against the newest 4.0 release, which it refuses.

The releases and what is run against each are listed in ``tests/compat/versions.txt``. For each,
``.venv-compat/<version>/`` is created with that ``pyspark`` (plus its ``connect`` extra where
the Connect test runs), the package with its ``delta`` extra, and pytest, all at the versions of
``constraints.txt`` but PySpark's; pip's cache makes a re-creation quick. A stamp in the venv
records what it was built from (the release, its roles, ``pyproject.toml``, ``constraints.txt``
and ``RECIPE``), so a venv is re-created only when one of those changed; the package alone is
reinstalled when a source file changed. The pytest modules of each release's roles then run in
that venv, with Spark's Python workers on the venv's interpreter, one release after the other.

Each release's set-up and test times are printed as it ends, and a summary at the end; the exit
status is 1 if any release failed.

Usage: ``python tools/compat.py [VERSION ...]`` (default: every release of the file);
``--setup-only`` builds the venvs and runs nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VERSIONS = ROOT / "tests" / "compat" / "versions.txt"
VENVS = ROOT / ".venv-compat"
SOURCES = [
    "pyspark_dedup.py",
    *(str(p.relative_to(ROOT)) for p in (ROOT / "dedupsink").rglob("*.py")),
]
# Raise it when set_up installs otherwise: every venv is then re-created.
RECIPE = 1
# The pytest modules each role runs.
MODULES = {
    "smoke": "tests/compat/test_smoke.py",
    "connect": "tests/compat/test_connect.py",
    "refused": "tests/compat/test_refused.py",
}


@dataclass(frozen=True)
class Release:
    version: str
    roles: tuple[str, ...]

    @property
    def venv(self) -> Path:
        return VENVS / self.version

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


def releases(path: Path = VERSIONS) -> list[Release]:
    found = []
    for line in path.read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        version, *roles = words
        unknown = set(roles) - set(MODULES)
        if unknown or not roles:
            raise SystemExit(f"{path}: {line!r}: roles are {', '.join(MODULES)}")
        found.append(Release(version, tuple(roles)))
    return found


def digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def run(*command: str | Path) -> None:
    subprocess.run([str(c) for c in command], cwd=ROOT, check=True)


def dependencies_key(release: Release) -> str:
    return digest(
        repr(release).encode(),
        (ROOT / "pyproject.toml").read_bytes(),
        (ROOT / "constraints.txt").read_bytes(),
        str(RECIPE).encode(),
    )


def sources_key() -> str:
    return digest(*(name.encode() + (ROOT / name).read_bytes() for name in sorted(SOURCES)))


def constraints_but_pyspark() -> Path:
    """constraints.txt without its PySpark pin: each venv has its own release."""
    lines = [
        line
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if not line.lower().startswith("pyspark==")
    ]
    target = VENVS / "constraints.txt"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join(lines) + "\n")
    return target


def install_package(release: Release) -> None:
    """The package as built (not editable: Spark's workers list the modules on their path)."""
    for stale in (ROOT / "build").glob("lib"), (ROOT / "build").glob("bdist.*"):
        for path in stale:
            shutil.rmtree(path)
    run(release.python, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", ".")
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    shutil.rmtree(ROOT / "dedupsink.egg-info", ignore_errors=True)


def set_up(release: Release, python: str) -> None:
    """Create or refresh the release's venv (see the module's docstring)."""
    deps_stamp = release.venv / ".dependencies"
    package_stamp = release.venv / ".installed"
    key, sources = dependencies_key(release), sources_key()
    if not deps_stamp.is_file() or deps_stamp.read_text() != key:
        shutil.rmtree(release.venv, ignore_errors=True)
        run(python, "-m", "venv", release.venv)
        pip = (release.python, "-m", "pip", "install", "--quiet", "-c", constraints_but_pyspark())
        extra = "[connect]" if "connect" in release.roles else ""
        spark = f"pyspark{extra}=={release.version}"
        if "refused" in release.roles:
            # As where PySpark comes with the cluster, not from pip: the package's own
            # dependencies but PySpark, then the package without them.
            project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
            others = [d for d in project["dependencies"] if not d.startswith("pyspark")]
            run(*pip, spark, "pytest", *others)
            package_stamp.unlink(missing_ok=True)
        else:
            run(*pip, spark, ".[delta]", "pytest")
            shutil.rmtree(ROOT / "build", ignore_errors=True)
            shutil.rmtree(ROOT / "dedupsink.egg-info", ignore_errors=True)
            package_stamp.write_text(sources)
            # Bytecode in PySpark's archives, as `make install` does for .venv.
            run(release.python, "tools/precompile_pyspark.py")
        deps_stamp.write_text(key)
    if not package_stamp.is_file() or package_stamp.read_text() != sources:
        install_package(release)
        package_stamp.write_text(sources)


def test(release: Release, pytest_args: list[str]) -> bool:
    """Run the release's modules, one pytest process each (a Connect server and a local
    session never run at once)."""
    env = dict(os.environ)
    env.pop("SPARK_HOME", None)  # the venv's PySpark, not a Spark installed elsewhere
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = str(release.python)
    env["DEDUPSINK_COMPAT_PYSPARK"] = release.version
    ok = True
    for role in release.roles:
        command = [str(release.python), "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        done = subprocess.run([*command, *pytest_args, MODULES[role]], cwd=ROOT, env=env)
        ok = ok and done.returncode == 0
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("versions", nargs="*", help="only these releases of versions.txt")
    parser.add_argument("--setup-only", action="store_true", help="build the venvs, run nothing")
    parser.add_argument("--python", default=os.environ.get("PYTHON", "python3.11"))
    parser.add_argument("--pytest-args", default="", help="more arguments for pytest")
    args = parser.parse_args(argv)
    chosen = [r for r in releases() if not args.versions or r.version in args.versions]
    if args.versions and len(chosen) != len(args.versions):
        parser.error(f"{VERSIONS.relative_to(ROOT)} lists {[r.version for r in releases()]}")
    summary = []
    failed = False
    started = time.monotonic()
    for release in chosen:
        print(f"== compat: pyspark {release.version} ({', '.join(release.roles)})", flush=True)
        began = time.monotonic()
        set_up(release, args.python)
        installed = time.monotonic()
        ok = args.setup_only or test(release, args.pytest_args.split())
        ended = time.monotonic()
        failed = failed or not ok
        line = (
            f"pyspark {release.version}: set-up {installed - began:.0f} s, "
            f"tests {ended - installed:.0f} s, {'passed' if ok else 'FAILED'}"
        )
        print(f"== compat: {line}", flush=True)
        summary.append(line)
    summary.append(f"all {len(chosen)} releases: {time.monotonic() - started:.0f} s")
    print("== compat: " + "\n== compat: ".join(summary))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
