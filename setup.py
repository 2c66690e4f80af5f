"""Build hook: compile HAS's scheduling pass with mypyc, falling back to pure Python.

Everything else about the package is in pyproject.toml. This file exists for one reason:
the modules of HAS's scheduling pass (the queue walk and its parts — ``has.queue_pass``,
``has.queue_order``, ``has.queued``, ``has.releases``, ``has.drain``, ``has.preemption``,
``has.policy`` — its free-GPU index ``has.pass_state``, plan matching ``has.placement`` and the
cluster snapshot ``has.cluster``) run every scheduler tick and every
simulator event, and a pass over 1,000 queued jobs costs ~5 µs per job in CPython. mypyc (part
of mypy, pinned in ``[build-system]``) compiles the *same* annotated Python source to a C
extension, 2.5–3.5x faster (docs/has-policy.md, "The compiled build"). There is no second implementation: the source files are the policy, and
``has/__init__.py`` loads them as plain Python when

* the build could not compile them (no C compiler, e.g. a slim container image): the
  extensions are optional, the install still succeeds;
* ``FRENZY_PURE_PYTHON=1`` is set at build time (nothing is compiled) or at run time;
* a source changed since the build (``_native.json`` records each source's SHA-256), so an
  edit is never shadowed by a stale compiled module.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
# Modules compiled together (one mypyc group); has/__init__.py lists the same in _NATIVE.
COMPILED = tuple(
    f"libs/has/{name}.py"
    for name in ("cluster", "placement", "pass_state", "policy", "queued", "queue_order", "releases", "drain",
                 "preemption", "queue_pass")
)  # fmt: skip
RECORD = "_native.json"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class _BuildExt(build_ext):
    """Build the extensions if possible and record which sources they were built from, next
    to them. One failure drops them all (the modules of a mypyc group need each other), so
    the install goes on without any, rather than failing or shipping half a group."""

    def run(self) -> None:
        self._failed: list[str] = []
        super().run()
        if not self.extensions:
            return
        out = Path(self.get_ext_fullpath("has.queue_pass")).parent
        record = out / RECORD
        if not self._failed:
            sources = {f"has.{Path(s).stem}": _sha256(ROOT / s) for s in COMPILED}
            record.write_text(json.dumps({"sources": sources}, indent=1, sort_keys=True) + "\n")
            print(f"frenzy: compiled {', '.join(sorted(sources))} with mypyc", file=sys.stderr)
            return
        for ext in self.extensions:  # nothing of the group is installed
            Path(self.get_ext_fullpath(ext.name)).unlink(missing_ok=True)
        self.extensions = []
        record.unlink(missing_ok=True)
        print("frenzy: mypyc build failed, HAS runs as pure Python (slower, same decisions)", file=sys.stderr)

    def copy_extensions_to_source(self) -> None:  # an editable install copies them into libs/
        if not self._failed:
            super().copy_extensions_to_source()

    def build_extension(self, ext) -> None:  # type: ignore[no-untyped-def]
        try:
            super().build_extension(ext)
        except Exception as err:  # no compiler, missing headers: pure Python instead
            self._failed.append(ext.name)
            print(f"frenzy: could not build {ext.name}: {str(err)[:200]}", file=sys.stderr)


# The import name of each source root (pyproject's package-dir says the same).
PACKAGE_ROOTS = {"marp": "libs/marp", "has": "libs/has", "frenzy": "services"}


def find_packages_under_roots() -> list[str]:
    """Every package of the three roots: each directory holding an ``__init__.py``, by import name.

    Listed by hand in pyproject.toml before, a new subpackage (frenzy.auth) was left out of the
    wheel while the editable install, which reads the source tree, hid it."""
    found = []
    for name, root in PACKAGE_ROOTS.items():
        base = ROOT / root
        for init in sorted(base.rglob("__init__.py")):
            rel = init.parent.relative_to(base)
            if any(part.startswith((".", "__pycache__")) or part == "build" for part in rel.parts):
                continue
            found.append(".".join((name, *rel.parts)))
    return found


def _extensions() -> list:
    if os.environ.get("FRENZY_PURE_PYTHON") == "1":
        return []
    try:
        from mypyc.build import mypycify

        return mypycify(list(COMPILED), opt_level="3")
    except (Exception, SystemExit) as err:  # mypy missing or failing (it exits): pure Python
        print(f"frenzy: mypyc unavailable ({err}); HAS runs as pure Python", file=sys.stderr)
        return []


setup(packages=find_packages_under_roots(), ext_modules=_extensions(), cmdclass={"build_ext": _BuildExt})
