"""The README, run as a new user would run it (issue 30): every code block meant to run does,
as written, from another shell after a bare `frenzy up`.

Each ```bash and ```python block of README.md carries a marker on the line before its fence:
``<!-- readme-test: run -->`` or ``<!-- readme-test: skip: <why> -->``; a block without one
fails this test, so a new block is run or consciously left out, never forgotten. Run blocks go
in document order through one shell state (the directory after a ``cd``, exported variables),
each command in its own ``bash``; a line starting ``frenzy up`` is started in the background
as "the first shell" and stopped with Ctrl-C at the end, which must leave no credentials behind.

What a reader fills in, the test fills in the same way (PLACEHOLDERS): ``JOB_ID`` is the last
job id a command printed, ``frz_...`` the last token ``frenzy token create`` printed and
``3f2a9c1e0b7d`` its id. Nothing else is rewritten. The test runs in a network namespace of its
own when it can (root, ``ip``), so the README's fixed port 8080 is free whatever the machine
runs, and in a fresh $HOME, so it neither reads nor writes the user's credentials.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from support.processes import interrupt_group

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MARKER = re.compile(r"<!--\s*readme-test:\s*(run|skip:\s*(.+?))\s*-->")
FENCE = re.compile(r"^```(\w*)\s*$")
# A reader's fill-ins: (placeholder, the pattern in earlier output whose last match replaces it).
PLACEHOLDERS = (("JOB_ID", re.compile(r"\bjob-[0-9a-f]{12}\b")),
                ("frz_...", re.compile(r"\bfrz_[0-9a-f]{12}_[A-Za-z0-9_-]+")),
                ("3f2a9c1e0b7d", re.compile(r"\bid ([0-9a-f]{12})\b")))
# Commands whose documented outcome is not 0 (README's exit codes): cancelling a job that has
# already SUCCEEDED exits 5.
EXPECTED_EXIT = {"frenzy cancel": 5}
TRAIN_PY = "import os\nprint('train.py ran on', os.environ.get('FRENZY_GPU_TYPE'), 'tp', os.environ.get('FRENZY_TP'))\n"


@dataclass
class Block:
    lang: str
    line: int  # 1-based line of the opening fence
    text: str
    run: bool
    why: str = ""


def readme_blocks(text: str) -> list[Block]:
    """Every fenced block with its marker (``run`` None when the block has none)."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        marker = MARKER.search(lines[i - 1]) if i else None
        run = marker is not None and marker.group(1) == "run"
        why = (marker.group(2) or "") if marker else ""
        block = Block(m.group(1), i + 1, "\n".join(lines[i + 1:j]) + "\n", run, why)
        block.marked = marker is not None  # type: ignore[attr-defined]
        blocks.append(block)
        i = j + 1
    return blocks


def _strip_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` (one outside quotes, after a blank)."""
    quote = ""
    for k, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (k == 0 or line[k - 1] in " \t"):
            return line[:k].rstrip()
    return line.rstrip()


def bash_commands(text: str) -> list[str]:
    """The commands of a bash block: continuation lines joined, comments and blank lines gone."""
    commands, pending = [], ""
    for raw in text.splitlines():
        line = _strip_comment(raw)
        if not line.strip():
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        commands.append((pending + line).strip())
        pending = ""
    return commands


def test_every_code_block_is_marked() -> None:
    unmarked = [f"README.md:{b.line} ```{b.lang}" for b in readme_blocks(README.read_text())
                if b.lang in ("bash", "python", "sh", "console") and not b.marked]  # type: ignore[attr-defined]
    assert not unmarked, ("every runnable-looking block needs <!-- readme-test: run --> or "
                          f"<!-- readme-test: skip: why --> on the line before its fence: {unmarked}")


@dataclass
class Shell:
    """One user's shell: a working directory and exported variables carried from command to command."""

    cwd: Path
    env_file: Path
    prefix: list[str]  # `ip netns exec NS` or nothing
    base_env: dict[str, str]
    outputs: list[str] = field(default_factory=list)

    def run(self, command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        state = self.env_file.with_suffix(".cwd")
        script = (f"cd {shlex.quote(str(self.cwd))} && source {shlex.quote(str(self.env_file))}\n{command}\n"
                  f"rc=$?; pwd > {shlex.quote(str(state))}; export -p > {shlex.quote(str(self.env_file))}; exit $rc\n")
        done = subprocess.run([*self.prefix, "bash", "-c", script], capture_output=True, text=True, timeout=timeout,
                              env=self.base_env, stdin=subprocess.DEVNULL)
        if state.exists():
            self.cwd = Path(state.read_text().strip())
        self.outputs.append(done.stdout + done.stderr)
        return done

    def fill_in(self, command: str) -> str:
        seen = "\n".join(self.outputs)
        for placeholder, pattern in PLACEHOLDERS:
            if placeholder in command:
                found = pattern.findall(seen)
                assert found, f"nothing printed so far fills in {placeholder} of: {command}"
                command = command.replace(placeholder, found[-1])
        return command


@pytest.fixture
def netns() -> Iterator[list[str]]:
    """A network namespace of the test's own (its loopback only), or none where one cannot be made."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        yield []
        return
    name = f"frz-readme-{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        yield []
        return
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        yield ["ip", "netns", "exec", name]
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_the_readme_runs_as_written(tmp_path: Path, netns: list[str]) -> None:
    if not netns:
        import socket

        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", 8080))
            except OSError:
                pytest.skip("no network namespace (not root, or no `ip`) and 127.0.0.1:8080 is taken here: the "
                            "README's curl line names that port")
    home = tmp_path / "home"
    work = tmp_path / "work"
    (home / ".config").mkdir(parents=True)
    work.mkdir()
    for shared in ("examples", "data"):  # the README's paths are relative to a checkout
        (work / shared).symlink_to(ROOT / shared)
    (work / "my-project").mkdir()
    (work / "my-project" / "train.py").write_text(TRAIN_PY)
    venv_bin = str(Path(sys.executable).parent)
    base_env = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "PATH": f"{venv_bin}:/usr/bin:/bin",
                "LANG": "C.UTF-8", "TERM": "dumb", "COLUMNS": "200"}
    env_file = tmp_path / "shell.env"
    env_file.write_text("")
    shell = Shell(work, env_file, netns, base_env)
    up: subprocess.Popen[bytes] | None = None
    ran: list[str] = []
    try:
        for block in readme_blocks(README.read_text()):
            if not block.run:
                continue
            if block.lang == "python":
                commands = [f"python - <<'README_PY'\n{block.text}README_PY"]
            else:
                commands = bash_commands(block.text)
            for command in commands:
                if command.split()[:2] == ["frenzy", "up"]:
                    assert up is None, "the README starts `frenzy up` twice"
                    up = _start_up(command, shell)
                    continue
                command = shell.fill_in(command)
                done = shell.run(command)
                expected = next((code for prefix, code in EXPECTED_EXIT.items() if command.startswith(prefix)), 0)
                assert done.returncode == expected, (
                    f"README.md:{block.line}: `{command}` exited {done.returncode} (expected {expected})\n"
                    f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}")
                assert "Traceback (most recent call last)" not in done.stderr, (command, done.stderr[-3000:])
                ran.append(command)
        assert up is not None, "no `frenzy up` in the README's run blocks"
        for must in ("frenzy submit", "frenzy batch submit", "curl", "frenzy token create", "frenzy jobs"):
            assert any(c.startswith(must) for c in ran), f"the README no longer runs `{must}`"
    finally:
        if up is not None:
            _stop_up(up)
    assert up.returncode == 0, (tmp_path / "up.log").read_text()
    assert not (home / ".config" / "frenzy" / "credentials.json").exists()


def _start_up(command: str, shell: Shell) -> subprocess.Popen[bytes]:
    """`frenzy up` as the first shell runs it; returns once it says Ctrl-C stops it. Its output
    goes to a file, so a pipe nobody reads can never stall it."""
    log = shell.env_file.with_name("up.log")
    with log.open("wb") as out:
        proc = subprocess.Popen([*shell.prefix, "bash", "-c", f"cd {shlex.quote(str(shell.cwd))} && exec {command}"],
                                stdout=out, stderr=subprocess.STDOUT, env=shell.base_env, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if "Ctrl-C stops everything" in log.read_text(errors="replace"):
            return proc
        time.sleep(0.2)
    text = log.read_text(errors="replace")
    _stop_up(proc)
    raise AssertionError(f"`{command}` did not come up:\n{text[-4000:]}")


def _stop_up(proc: subprocess.Popen[bytes]) -> None:
    interrupt_group(proc, timeout=60)
