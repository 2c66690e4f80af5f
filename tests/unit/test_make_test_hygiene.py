"""`make test` leaves the tree as it found it, and asks before it installs system packages (issue 30).

The real Makefile runs in a scratch git repository with a fake ``.venv/bin/python`` standing in for
pytest (it changes what the test asks, then exits with a given code) and fake ``apt-get`` / ``id``
for the browser target, so nothing here installs anything or touches this checkout."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None or shutil.which("git") is None, reason="needs make and git")

FAKE_PYTEST = """#!/bin/sh
# stands in for `python -m pytest`: writes FAKE_WRITE (if set), exits FAKE_RC
if [ -n "${FAKE_WRITE:-}" ]; then echo "written by a test" >> "$FAKE_WRITE"; fi
exit "${FAKE_RC:-0}"
"""


def _compiled() -> list[str]:
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    return re.search(r"^COMPILED := (.*)$", text, re.M).group(1).split()  # type: ignore[union-attr]


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A git work tree with the real Makefile, its prerequisites older than an up-to-date stamp."""
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(ROOT / "Makefile", repo / "Makefile")
    for rel in ["pyproject.toml", "setup.py", *_compiled(), "docs/guide.md", "docs/img/dashboard.png"]:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(f"{rel}\n")
        os.utime(repo / rel, (1_000_000_000, 1_000_000_000))
    bin_dir = repo / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(FAKE_PYTEST)
    (bin_dir / "python").chmod(0o755)
    (repo / ".venv" / ".installed").touch()
    (repo / ".gitignore").write_text(".venv/\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "scratch"]):
        subprocess.run([*git, *cmd], cwd=repo, check=True, env=_env(tmp_path))
    return repo


def _env(tmp_path: Path, path: str | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRENZY_", "MAKE", "GIT_"))}
    env.update(HOME=str(tmp_path), GIT_CONFIG_NOSYSTEM="1", **extra)
    if path is not None:
        env["PATH"] = path
    return env


def _make_test(repo: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    """`make test` with a chromium on PATH (the browser target then installs nothing)."""
    fake = repo.parent / "with-chromium"
    fake.mkdir(exist_ok=True)
    (fake / "chromium").write_text("#!/bin/sh\n")
    (fake / "chromium").chmod(0o755)
    env = _env(repo.parent, path=f"{fake}:{os.environ['PATH']}", FRENZY_NO_SYSTEM_PACKAGES="1", **extra)
    return subprocess.run([MAKE, "-s", "test"], cwd=repo, env=env, capture_output=True, text=True, timeout=120)


def test_a_test_that_changes_a_tracked_file_fails_make_test_naming_it(scratch: Path) -> None:
    res = _make_test(scratch, FAKE_WRITE=str(scratch / "docs" / "guide.md"))
    assert res.returncode != 0, res.stdout + res.stderr
    assert "make test: the tests changed tracked files" in res.stdout
    assert "  docs/guide.md" in res.stdout.splitlines()


def test_a_clean_run_passes_and_a_failing_one_keeps_its_code(scratch: Path) -> None:
    res = _make_test(scratch)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "changed tracked files" not in res.stdout
    assert _make_test(scratch, FAKE_RC="3").returncode != 0
    none = _make_test(scratch, FAKE_RC="5")
    assert none.returncode != 0 and "pytest collected no tests" in none.stdout


def test_a_file_already_modified_before_the_run_is_caught_when_the_tests_change_it_again(scratch: Path) -> None:
    (scratch / "setup.py").write_text("an edit in progress\n")  # dirty before: not the tests' doing
    os.utime(scratch / "setup.py", (1_000_000_000, 1_000_000_000))  # the stamp stays newer
    assert _make_test(scratch).returncode == 0
    res = _make_test(scratch, FAKE_WRITE=str(scratch / "setup.py"))
    assert res.returncode != 0 and "  setup.py" in res.stdout.splitlines(), res.stdout


def test_an_untracked_file_or_no_git_work_tree_is_not_checked(scratch: Path) -> None:
    assert _make_test(scratch, FAKE_WRITE=str(scratch / "docs" / "new.txt")).returncode == 0
    shutil.rmtree(scratch / ".git")
    assert _make_test(scratch, FAKE_WRITE=str(scratch / "docs" / "guide.md")).returncode == 0


def test_the_screenshot_may_change_only_when_asked(scratch: Path) -> None:
    shot = str(scratch / "docs" / "img" / "dashboard.png")
    res = _make_test(scratch, FAKE_WRITE=shot)
    assert res.returncode != 0 and "  docs/img/dashboard.png" in res.stdout.splitlines()
    subprocess.run(["git", "checkout", "-q", "--", "docs/img/dashboard.png"], cwd=scratch, check=True,
                   env=_env(scratch.parent))  # fmt: skip
    assert _make_test(scratch, FAKE_WRITE=shot, FRENZY_UPDATE_SCREENSHOTS="1").returncode == 0


def _tools(tmp_path: Path, uid: int, apt_log: Path, out: Path) -> Path:
    """A PATH with no chromium: the few tools the recipe uses, a fake `id` and a fake `apt-get`
    that records its calls and, asked to install, notes it in make's own output file."""
    bin_dir = tmp_path / "tools"
    bin_dir.mkdir()
    for tool in ("awk", "wc", "xargs", "echo", "tail", "cat"):
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    (bin_dir / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    (bin_dir / "apt-get").write_text(f"""#!/bin/sh
echo "$*" >> {apt_log}
case "$*" in
  -s\\ install*) echo "Inst libfoo1 (1.0 Debian:12)"; echo "Inst chromium (156 Debian:12)";
                 echo "Inst fonts-liberation (1.07 Debian:12)";;
  *install\\ -y*) echo "APT-GET INSTALL RAN" >> {out};;
esac
""")
    for name in ("id", "apt-get"):
        (bin_dir / name).chmod(0o755)
    return bin_dir


def _make_browser(tmp_path: Path, uid: int, **extra: str) -> tuple[int, str, list[str]]:
    apt_log, out = tmp_path / "apt.log", tmp_path / "make.out"
    bin_dir = _tools(tmp_path, uid, apt_log, out)
    with out.open("w") as fh:
        rc = subprocess.run([MAKE, "-s", "-f", str(ROOT / "Makefile"), "browser", f"BROWSER_LOG={tmp_path / 'b.log'}"],
                            cwd=tmp_path, env=_env(tmp_path, path=str(bin_dir), **extra), stdout=fh,
                            stderr=subprocess.STDOUT, timeout=60).returncode  # fmt: skip
    calls = apt_log.read_text().splitlines() if apt_log.exists() else []
    return rc, out.read_text(), calls


def test_the_browser_install_is_announced_with_its_packages_before_it_runs(tmp_path: Path) -> None:
    rc, out, calls = _make_browser(tmp_path, uid=0)
    assert rc == 0, out
    assert calls[0].startswith("update") and calls[1].startswith("-s install")
    assert calls[2].startswith("install -y") and calls[2].endswith("chromium fonts-liberation")
    said, ran = out.index("installing 3 packages"), out.index("APT-GET INSTALL RAN")
    assert said < ran, out
    before = out[:ran]
    for needle in ("installing Debian's chromium fonts-liberation system-wide with apt-get",
                   "dashboard's browser test", "About a", "FRENZY_NO_SYSTEM_PACKAGES=1 make test",
                   "libfoo1 chromium fonts-liberation"):  # fmt: skip
        assert needle in before, needle


def test_the_browser_install_is_skipped_when_declined_or_impossible(tmp_path: Path) -> None:
    (tmp_path / "declined").mkdir()
    rc, out, calls = _make_browser(tmp_path / "declined", uid=0, FRENZY_NO_SYSTEM_PACKAGES="1")
    assert rc == 0 and calls == [], out
    assert "FRENZY_NO_SYSTEM_PACKAGES=1: not installing it" in out and "will be skipped" in out
    (tmp_path / "user").mkdir()
    rc, out, calls = _make_browser(tmp_path / "user", uid=1000)
    assert rc == 0 and calls == [], out
    assert "cannot be installed here" in out and "FRENZY_NO_SYSTEM_PACKAGES=1 make test" in out


def test_ci_never_declines_the_install() -> None:
    """A skipped browser test must not pass for a green CI: .ci/run runs `make test` without the opt-out."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci
    assert "FRENZY_NO_SYSTEM_PACKAGES" not in ci
    makefile = (ROOT / "Makefile").read_text()
    assert not re.search(r"^\s*(export\s+)?FRENZY_NO_SYSTEM_PACKAGES\s*[:?+]?=", makefile, re.M)
