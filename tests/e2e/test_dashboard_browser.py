"""The dashboard in a real browser (issue 20): headless Chromium, driven by Playwright, against a
local stack (scheduler, predictor, fake-GPU agents and `frenzy api` as separate processes).

As a person would: the page asks for a token, takes the stack's, shows every GPU; a job that
prints a line every 0.3 s shows up RUNNING on its GPUs; its live log opens and keeps growing;
the cancel button (after the confirm dialog) ends it CANCELLED and frees the GPUs. The picture
in the README (docs/img/dashboard.png) is taken here, with the job running and its log open: into
the test's temporary directory, and into docs/img only when FRENZY_UPDATE_SCREENSHOTS=1 asks for it
(a test run leaves the tracked tree as it found it; `make test` checks that).
/docs (Swagger UI) renders from the gateway's own files. The browser may fetch nothing but the
gateway: any other request is refused and fails the test, and so does any script error.

The browser is Debian's `chromium` (Playwright cannot download its own build on these machines):
`make test` installs it when it is missing and it can (root with apt-get), saying so first; without
it this test FAILS saying how to install it. It skips only when the user declined the install
(FRENZY_NO_SYSTEM_PACKAGES=1, which CI never sets: tests/unit/test_make_test_hygiene.py).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from frenzy.devstack.stack import LocalStack
from has.cluster_spec import parse_cluster
from support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TRACKED_SCREENSHOT = ROOT / "docs" / "img" / "dashboard.png"  # the README's picture
CLUSTER = {"nodes": [{"gpu": "A100-80GB", "count": 1, "gpus_per_node": 4, "name_prefix": "a100"},
                     {"gpu": "L4", "count": 1, "gpus_per_node": 2, "name_prefix": "l4"},
                     {"gpu": "T4", "count": 1, "gpus_per_node": 4, "name_prefix": "t4"}]}
TOTAL_GPUS = 10
# A job that runs until cancelled (at most two minutes), printing a line every 0.3 s; one line of
# Python, as the log's first line repeats the command. It declares a peak of 3 GiB per GPU (on fake
# GPUs, what the agent reports as observed: $FRENZY_RUN_DIR/peak_bytes).
TICKER = ('import os, time; open(os.environ["FRENZY_RUN_DIR"] + "/peak_bytes", "w").write(str(3 * 2**30)); '
          '[print("step %d loss %.3f" % (i, 4 / (1 + i)), flush=True) or time.sleep(0.3) for i in range(400)]')
INSTALL_HELP = ("Install Debian's chromium: `apt-get install -y chromium` (as root; `make test` does it when it "
                "can, unless FRENZY_NO_SYSTEM_PACKAGES=1), or point FRENZY_CHROMIUM at a Chromium binary")
WAIT_MS = 20_000


def screenshot_path(tmp_path: Path) -> Path:
    """Where the dashboard's picture goes: the tracked docs/img/dashboard.png only when
    FRENZY_UPDATE_SCREENSHOTS=1 asks to refresh it, else the test's temporary directory."""
    if os.environ.get("FRENZY_UPDATE_SCREENSHOTS") == "1":
        return TRACKED_SCREENSHOT
    return tmp_path / "dashboard.png"


def chromium_binary() -> str:
    """FRENZY_CHROMIUM, else chromium (or chromium-browser) on PATH; the test fails without one,
    unless the user declined installing it (FRENZY_NO_SYSTEM_PACKAGES=1): then it skips."""
    given = os.environ.get("FRENZY_CHROMIUM")
    if given:
        if not (os.path.isfile(given) and os.access(given, os.X_OK)):
            pytest.fail(f"FRENZY_CHROMIUM={given!r} is not an executable file. {INSTALL_HELP}")
        return given
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        missing = "no Chromium for the dashboard's browser test (looked for chromium and chromium-browser on PATH)"
        if os.environ.get("FRENZY_NO_SYSTEM_PACKAGES") == "1":
            pytest.skip(f"{missing}, and FRENZY_NO_SYSTEM_PACKAGES=1 declined installing it. {INSTALL_HELP}")
        pytest.fail(f"{missing}. {INSTALL_HELP}")
    return found


@pytest.fixture(scope="module")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    s = LocalStack.create(parse_cluster(CLUSTER), run_dir=str(tmp_path_factory.mktemp("run")), redis_url=redis_url,
                          prefix=f"t{uuid.uuid4().hex[:10]}", with_worker=False, with_api=True,
                          heartbeat_s=0.5, ttl_s=3)
    s.start()
    try:
        # `frenzy api` is spawned last and not waited for by the stack: ready once it answers.
        wait_for(lambda: _answers(f"http://127.0.0.1:{s.api_port}/healthz"), timeout=30,
                 what=f"the API on port {s.api_port} (log: {s.run_dir}/api.log)", interval=0.1)
        yield s
    finally:
        s.stop()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright is not installed: pip install -e '.[dev]' (make test does it)")
    binary = chromium_binary()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=binary, headless=True)
        yield b
        b.close()


class Page:
    """A fresh tab that may talk only to ``base``: any other request is refused and recorded, as
    are script errors and console errors (each fails the test at the end)."""

    def __init__(self, browser: object, base: str) -> None:
        self.base = base
        self.context = browser.new_context(viewport={"width": 1280, "height": 800})  # type: ignore[attr-defined]
        self.page = self.context.new_page()
        self.outside: list[str] = []
        self.errors: list[str] = []
        origin = urlsplit(base).netloc

        def gate(route: object) -> None:
            url = route.request.url  # type: ignore[attr-defined]
            if urlsplit(url).netloc == origin or url.startswith(("data:", "blob:")):
                route.continue_()  # type: ignore[attr-defined]
            else:
                self.outside.append(url)
                route.abort()  # type: ignore[attr-defined]

        self.page.route("**/*", gate)
        self.page.on("pageerror", lambda exc: self.errors.append(f"page error: {exc}"))
        self.page.on("console", lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None)

    def check_clean(self) -> None:
        assert self.outside == [], f"the page tried to reach beyond the gateway: {self.outside}"
        assert self.errors == [], f"the page logged errors: {self.errors}"

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def tab(browser: object, stack: LocalStack) -> Iterator[Page]:
    t = Page(browser, f"http://127.0.0.1:{stack.api_port}")
    yield t
    t.close()


def test_dashboard_sign_in_gpus_running_job_live_log_and_cancel(tab: Page, stack: LocalStack, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    page = tab.page
    page.goto(tab.base + "/")
    # No token yet: the page asks for one, and shows no data.
    expect(page.locator("#signin")).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("#status")).to_have_text("a token is needed")
    page.fill("#token-input", stack.token)
    page.click("#signin button[type=submit]")
    expect(page.locator("#signin")).to_be_hidden()

    # Every node and every GPU, all free.
    nodes = page.locator("#nodes .node")
    expect(nodes).to_have_count(3, timeout=WAIT_MS)
    for name in ("a100-0", "l4-0", "t4-0"):
        expect(page.locator("#nodes .node header b", has_text=name)).to_have_count(1)
    expect(page.locator("#nodes .gpu")).to_have_count(TOTAL_GPUS)
    expect(page.locator("#nodes .gpu.busy")).to_have_count(0)
    expect(page.locator("#summary")).to_contain_text(f"0/{TOTAL_GPUS}")

    # A job, submitted through the same gateway with the same token.
    entry = {"name": "demo-ticker", "model": "gpt2-124m", "seq_len": 512, "global_batch": 8,
             "command": [sys.executable, "-u", "-c", TICKER]}
    r = httpx.post(f"{tab.base}/api/jobs", json=entry, headers={"authorization": f"Bearer {stack.token}"},
                   timeout=60)
    assert r.status_code == 200, r.text
    job_id = r.json()["id"]

    row = page.locator("#jobs tr", has=page.locator("td", has_text=job_id))
    expect(row.locator(".st")).to_have_text("RUNNING", timeout=WAIT_MS)
    expect(row).to_contain_text("demo-ticker")
    placement = row.locator("td").nth(4)
    expect(placement).not_to_have_text("-")
    busy = page.locator("#nodes .gpu.busy")
    expect(busy.first).to_be_visible()
    used = busy.count()
    assert used >= 1
    for i in range(used):  # each busy tile names this job (its tooltip: "owner: job-... (demo-ticker)")
        assert job_id in (busy.nth(i).get_attribute("title") or "")
    expect(page.locator("#summary")).to_contain_text(f"{used}/{TOTAL_GPUS}")

    # Its live log: the panel opens on this job, shows the output, and keeps growing while open.
    row.get_by_role("button", name="logs").click()
    expect(page.locator("#logs-section")).to_be_visible()
    expect(page.locator("#logs-title")).to_have_text(job_id)
    assert page.url.endswith(f"#logs={job_id}")
    log = page.locator("#logs .logpart pre").first
    expect(log).to_contain_text("step 0", timeout=WAIT_MS)
    seen = max(int(n) for n in re.findall(r"step (\d+)", log.inner_text()))
    expect(log).to_contain_text(f"step {seen + 8} ", timeout=WAIT_MS)  # the next poll's output (2 s)
    # Its memory: the plan's predicted peak per GPU, nothing observed while it runs.
    first = page.locator("#memory-rows tr[data-attempt='1']")
    expect(first.locator("td").nth(2)).to_contain_text(re.compile(r"\d+\.\d GiB of \d+\.\d GiB"))
    expect(first.locator("td").nth(3)).to_have_text("not measured")

    screenshot = screenshot_path(tmp_path)
    page.screenshot(path=str(screenshot), full_page=True)

    # Cancel from its row, through the confirm dialog.
    asked: list[str] = []

    def accept(dialog: object) -> None:
        asked.append(dialog.message)  # type: ignore[attr-defined]
        dialog.accept()  # type: ignore[attr-defined]

    page.once("dialog", accept)
    row.get_by_role("button", name="cancel").click()
    expect(row.locator(".st")).to_have_text("CANCELLED", timeout=WAIT_MS)
    assert asked == [f"Cancel job {job_id}?"]
    expect(row.get_by_role("button", name="cancel")).to_have_count(0)  # an ended job has none
    expect(page.locator("#nodes .gpu.busy")).to_have_count(0, timeout=WAIT_MS)
    expect(page.locator("#summary")).to_contain_text(f"0/{TOTAL_GPUS}")
    # Ended: the peak it declared, against the prediction (as `frenzy accuracy` shows it).
    expect(first.locator("td").nth(3)).to_have_text("3.0 GiB", timeout=WAIT_MS)
    expect(first.locator("td").nth(4)).to_have_text(re.compile(r"[+-]\d+%"))
    expect(first.locator("td").nth(5)).to_contain_text("cancelled")

    # The scheduler agrees, with the dashboard's reason.
    job = httpx.get(f"{tab.base}/api/jobs/{job_id}", headers={"authorization": f"Bearer {stack.token}"},
                    timeout=10).json()
    assert job["state"] == "CANCELLED"
    assert any("dashboard" in (t.get("reason") or "") for t in job["job"]["history"]), job["job"]["history"]
    tab.check_clean()
    assert screenshot.stat().st_size > 20_000


def test_api_docs_render_from_local_assets(tab: Page) -> None:
    from playwright.sync_api import expect

    page = tab.page
    page.goto(tab.base + "/docs")
    # Swagger UI drew the schema: one block per operation, the job submission among them.
    expect(page.locator(".opblock-summary-path", has_text="/api/jobs").first).to_be_visible(timeout=WAIT_MS)
    expect(page.locator(".opblock")).not_to_have_count(0)
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Frenzy")
    tab.check_clean()


def test_the_screenshot_goes_into_the_tree_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FRENZY_UPDATE_SCREENSHOTS", raising=False)
    assert screenshot_path(tmp_path) == tmp_path / "dashboard.png"
    monkeypatch.setenv("FRENZY_UPDATE_SCREENSHOTS", "0")
    assert screenshot_path(tmp_path) == tmp_path / "dashboard.png"
    monkeypatch.setenv("FRENZY_UPDATE_SCREENSHOTS", "1")
    assert screenshot_path(tmp_path) == ROOT / "docs" / "img" / "dashboard.png"


def test_without_chromium_the_browser_test_fails_unless_the_install_was_declined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no chromium here
    monkeypatch.delenv("FRENZY_CHROMIUM", raising=False)
    monkeypatch.delenv("FRENZY_NO_SYSTEM_PACKAGES", raising=False)
    with pytest.raises(pytest.fail.Exception, match="apt-get install -y chromium"):
        chromium_binary()
    monkeypatch.setenv("FRENZY_NO_SYSTEM_PACKAGES", "1")
    with pytest.raises(pytest.skip.Exception, match="FRENZY_NO_SYSTEM_PACKAGES=1 declined .*apt-get install -y chromium"):
        chromium_binary()
