"""The Lua templates render into whole scripts: includes filled, state names from JobState.

No Redis here: these read the packaged ``lua/`` files and the rendered text only
(tests/integration/state compiles the rendered scripts on a real server).
"""

from __future__ import annotations

import re

import pytest

from frenzy.state import scripts
from frenzy.state.job_states import ACTIVE, ALLOWED, TERMINAL, JobState

# Scripts that give GPUs or a port back; each must take the shared snippet, not its own loop.
RELEASERS = {"record_exit", "transition_job", "requeue_job", "release_stale"}
RELEASE_NAMES = ("release_gpu", "release_gpus", "release_port")
STATE_NAMES = ("JOB_STATE", "TERMINAL", "ACTIVE", "MAY_MOVE")
STATE_FUNCTIONS = ("may_move", "set_state")


def _uses(text: str, name: str) -> bool:
    return re.search(rf"\b{name}\b", text) is not None


def _code(text: str) -> str:
    """The text without its comment lines (what Lua runs)."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))


def _lua_set(rendered: str, name: str) -> set[str]:
    body = re.search(rf"^local {name} = \{{(.*)\}}$", rendered, re.MULTILINE)
    assert body is not None, f"no {name} table"
    return set(re.findall(r'\["([A-Z]+)"\] = true', body.group(1)))


def test_every_script_is_listed() -> None:
    assert {"submit_job", "place_jobs", "record_exit", "transition_job", "requeue_job"} <= set(
        scripts.names()
    )
    assert "release_gpus" not in scripts.names()  # a fragment under lib/, not a script


@pytest.mark.parametrize("name", scripts.names())
def test_script_renders_whole(name: str) -> None:
    rendered = scripts.script_source(name)
    assert "#include" not in rendered
    assert "{{" not in rendered and "}}" not in rendered
    # The header still opens the script, saying what it guarantees.
    assert rendered.startswith(f"-- {name}:")
    for fn in RELEASE_NAMES:
        assert len(re.findall(rf"^local function {fn}\(", rendered, re.MULTILINE)) <= 1


@pytest.mark.parametrize("name", scripts.names())
def test_no_state_name_written_in_a_template(name: str) -> None:
    template = scripts.template(name)
    for state in JobState:
        assert re.search(rf"\b{state.value}\b", template) is None, f"{name}.lua writes {state.value}"


@pytest.mark.parametrize("name", scripts.names())
def test_what_a_script_uses_is_included(name: str) -> None:
    template = _code(scripts.template(name))
    rendered = scripts.script_source(name)
    for table in STATE_NAMES:
        if _uses(template, table):
            assert f"local {table} = " in rendered
    for fn in RELEASE_NAMES + STATE_FUNCTIONS:
        if _uses(template, fn):
            assert f"local function {fn}(" in rendered


def test_state_tables_come_from_job_states() -> None:
    prelude = scripts.job_states_lua()
    pairs = dict(re.findall(r'(\w+) = "([A-Z]+)"', prelude.splitlines()[1]))
    assert pairs == {s.name.lower(): s.value for s in JobState}
    assert _lua_set(prelude, "TERMINAL") == {s.value for s in TERMINAL}
    assert _lua_set(prelude, "ACTIVE") == {s.value for s in ACTIVE}


def test_release_snippet_is_where_gpus_are_released() -> None:
    for name in scripts.names():
        template = scripts.template(name)
        rendered = scripts.script_source(name)
        if name in RELEASERS:
            assert "--#include release_gpus" in template
            assert "local function release_gpus(" in rendered
        # Only the snippet clears an owner: no script keeps a release loop of its own.
        assert re.search(r'"HSET", [^\n]*"owner", ""', template) is None, name
    snippet = scripts.fragment("release_gpus")
    assert len(re.findall(r'"HSET", [^\n]*"owner", ""', snippet)) == 1


def test_unknown_include_is_refused() -> None:
    with pytest.raises(ValueError, match="no_such_fragment"):
        scripts.fragment("no_such_fragment")


def test_package_data_ships_every_lua_file() -> None:
    """pyproject's package-data globs cover every .lua file, the lib/ fragments too."""
    import tomllib
    from fnmatch import fnmatch
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "frenzy.state"
    ]
    state_dir = root / "services" / "state"
    for path in state_dir.rglob("*.lua"):
        rel = path.relative_to(state_dir).as_posix()
        assert any(fnmatch(rel, g) and rel.count("/") == g.count("/") for g in globs), rel


def test_the_moves_come_from_allowed() -> None:
    body = re.search(r"^local MAY_MOVE = \{(.*)\}$", scripts.job_states_lua(), re.MULTILINE)
    assert body is not None
    moves = {src: set(re.findall(r'\["([A-Z]+)"\] = true', dests))
             for src, dests in re.findall(r'\["([A-Z]+)"\] = \{([^{}]*)\}', body.group(1))}
    assert moves == {s.value: {t.value for t in ALLOWED[s]} for s in JobState}
