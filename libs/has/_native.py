"""Which build of HAS's scheduling pass runs: the mypyc-compiled modules or their sources.

setup.py may compile ``NATIVE_MODULES`` (the scheduling pass and what it reads: one mypyc
group) and records the SHA-256 of each source it compiled in ``_native.json`` beside them. Python's import system
prefers an extension module to a ``.py`` of the same name, so a compiled module built from
an older source would silently shadow an edit; ``load`` prevents that: unless every
compiled module exists and was built from the source that is here now (and
``FRENZY_PURE_PYTHON`` is not ``1``), it executes the sources themselves under those module
names. All of them switch together: compiled modules of one group call each other
directly, so a compiled ``queue_pass`` with a source ``pass_state`` would not be the source.

Runs from ``has/__init__.py`` before anything imports those modules. No I/O beyond
reading their sources and the record (~1 ms).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import types
from pathlib import Path

NATIVE_MODULES = (  # in import order (each imports only those before it)
    "cluster", "placement", "pass_state", "policy", "queued", "queue_order", "releases", "drain", "preemption",
    "queue_pass",
)  # fmt: skip
RECORD = "_native.json"


def compiled_is_current(package_dir: Path) -> bool:
    """True when every module of ``NATIVE_MODULES`` has a compiled build here that was made
    from the source now beside it (the record setup.py wrote matches each source's hash)."""
    try:
        recorded = json.loads((package_dir / RECORD).read_text())["sources"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    for name in NATIVE_MODULES:
        if not any((package_dir / (name + s)).exists() for s in importlib.machinery.EXTENSION_SUFFIXES):
            return False
        source = package_dir / f"{name}.py"
        try:
            digest = hashlib.sha256(source.read_bytes()).hexdigest()
        except OSError:
            return False
        if recorded.get(f"has.{name}") != digest:
            return False
    return True


def load(package_dir: Path | None = None) -> bool:
    """Make the ``NATIVE_MODULES`` the compiled build when it is current and allowed, else
    their sources; returns True for the compiled build."""
    here = package_dir or Path(__file__).resolve().parent
    if os.environ.get("FRENZY_PURE_PYTHON") != "1" and compiled_is_current(here):
        return True
    for name in NATIVE_MODULES:
        full = f"has.{name}"
        if full in sys.modules:  # already imported (a re-import of the package): keep it
            continue
        loader = importlib.machinery.SourceFileLoader(full, str(here / f"{name}.py"))
        spec = importlib.util.spec_from_file_location(full, here / f"{name}.py", loader=loader)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        try:
            loader.exec_module(module)
        except BaseException:
            del sys.modules[full]
            raise
        package = sys.modules.get("has")
        if package is not None:  # what the import system does for a submodule it loads
            setattr(package, name, module)
    return False


def load_sources(alias: str) -> dict[str, types.ModuleType]:
    """A second, independent copy of the ``NATIVE_MODULES`` executed from their sources as
    ``alias.<name>``, beside whatever ``has.<name>`` is (compiled or not), with their imports
    of each other redirected to the copies: for comparing the two builds in one process (the
    equivalence test, the decision-time bench). Not for production use."""
    here = Path(__file__).resolve().parent
    if alias not in sys.modules:
        package = types.ModuleType(alias)
        package.__path__ = []
        sys.modules[alias] = package
    out: dict[str, types.ModuleType] = {}
    for name in NATIVE_MODULES:
        full = f"{alias}.{name}"
        if full not in sys.modules:
            source = (here / f"{name}.py").read_text()
            for other in NATIVE_MODULES:
                source = source.replace(f"from has.{other} import", f"from {alias}.{other} import")
            module = types.ModuleType(full)
            module.__file__ = str(here / f"{name}.py")
            sys.modules[full] = module
            exec(compile(source, module.__file__, "exec"), module.__dict__)  # noqa: S102
            setattr(sys.modules[alias], name, module)
        out[name] = sys.modules[full]
    return out
