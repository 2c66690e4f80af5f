"""The code's shape holds (issue 31): no import cycle among Frenzy's modules, nothing new over
900 lines a file or 150 a function, and the known offenders never grow -- each is to be cut,
then struck from KNOWN (scripts/structure.py prints the numbers)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("structure", ROOT / "scripts" / "structure.py")
structure = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(structure)  # type: ignore[union-attr]

# Over the limits when the check came in (session 15), at most this long (lowered as they shrink);
# cut, then strike.
KNOWN_FILES: dict[str, int] = {}  # none left: every file is within the limit
KNOWN_FUNCTIONS: dict[str, int] = {}  # none left: every function is within the limit


def _over(found: dict[str, int], known: dict[str, int], what: str) -> list[str]:
    return [f"{name}: {n} lines ({what}; " + (f"known at {known[name]}" if name in known else "new") + ")"
            for name, n in found.items() if n > known.get(name, 0)]


def test_no_import_cycle() -> None:
    assert structure.cycles() == []


def test_no_file_or_function_grows_past_the_limits() -> None:
    problems = (_over(structure.long_files(), KNOWN_FILES, f"files: at most {structure.MAX_FILE_LINES}")
                + _over(structure.long_functions(), KNOWN_FUNCTIONS,
                        f"functions: at most {structure.MAX_FUNCTION_LINES}"))
    assert not problems, "cut these (or split the function):\n" + "\n".join(problems)


def test_the_cycle_finder_finds_a_cycle_through_a_package_init(tmp_path: Path, monkeypatch) -> None:
    # The check is only worth something if it can fail: a package whose __init__ imports a module
    # that imports the package's names back (marp and marp.perf were such a pair).
    pkg = tmp_path / "services" / "loop"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from frenzy.loop.a import x\n")
    (pkg / "a.py").write_text("from frenzy.loop import y\nx = 1\n")
    (tmp_path / "services" / "__init__.py").write_text("")
    monkeypatch.setattr(structure, "ROOT", tmp_path)
    monkeypatch.setattr(structure, "ROOTS", {"services": "frenzy"})
    assert structure.cycles() == [["frenzy.loop", "frenzy.loop.a"]]
