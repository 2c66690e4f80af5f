# The two commands of the README, plus a few helpers. Each sets itself up:
# a fresh machine needs only Python 3.11 and make.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast lint proto up clean browser

# setup.py compiles these with mypyc at install (pure Python where it cannot): an edit
# re-installs, so the tests run the compiled build of the current source.
COMPILED := libs/has/cluster.py libs/has/placement.py libs/has/pass_state.py libs/has/policy.py libs/has/queued.py \
  libs/has/queue_order.py libs/has/releases.py libs/has/drain.py libs/has/preemption.py libs/has/queue_pass.py

# pip shows what it downloads and installs (its progress bars on a terminal, no -v); the build of
# Frenzy itself ("Building editable for frenzy") prints nothing while mypyc compiles, so say so first.
$(STAMP): pyproject.toml setup.py $(COMPILED)
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Frenzy needs Python 3.11 (set PYTHON=python3.11)"'
	@test -x $(BIN)/python || { echo "creating the virtual environment $(VENV) ($(PYTHON))"; $(PYTHON) -m venv $(VENV); }
	@echo "installing Frenzy and its dependencies into $(VENV): the first run takes a few minutes (about 5 on a"
	@echo "  fresh machine: downloads, torch the largest), later runs only after pyproject.toml, setup.py or a"
	@echo "  compiled module changed. 'Building editable for frenzy' stays silent for a minute or two: mypyc"
	@echo "  compiles the scheduling pass (libs/has) to C."
	$(BIN)/pip install --disable-pip-version-check --progress-bar on -e '.[server,dev,train,sim]'
	@touch $(STAMP)

## demo: the main job — the stack on a private Redis with fake-GPU agents, one job end to end
demo: $(STAMP)
	$(BIN)/frenzy demo

# The dashboard's browser test (tests/e2e/test_dashboard_browser.py) drives Debian's chromium
# through Playwright, which cannot download a browser of its own here. When chromium is missing and
# this is root with apt-get, it is installed system-wide, said first (the exact packages, why, how
# long, how to skip): CI (.ci/run: a fresh machine, no stdin) runs that test too, so the install
# stays opt-out rather than opt-in. FRENZY_NO_SYSTEM_PACKAGES=1 skips it, and the browser test then
# skips naming how to install chromium; CI never sets it (tests/unit/test_make_test_hygiene.py).
# Without chromium and without that opt-out the browser test fails, saying the same.
BROWSER_PACKAGES := chromium fonts-liberation
BROWSER_LOG := /tmp/frenzy-chromium-install.log
browser:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then exit 0; fi; \
	if [ "$${FRENZY_NO_SYSTEM_PACKAGES:-}" = 1 ]; then \
	  echo "make test: chromium is missing and FRENZY_NO_SYSTEM_PACKAGES=1: not installing it; the dashboard's"; \
	  echo "  browser test will be skipped (to run it: apt-get install -y chromium)"; exit 0; \
	fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
	  echo "make test: chromium is missing and cannot be installed here (not root, or no apt-get): the dashboard's"; \
	  echo "  browser test will fail. Install it (apt-get install -y chromium) or skip that test:"; \
	  echo "  FRENZY_NO_SYSTEM_PACKAGES=1 make test"; exit 0; \
	fi; \
	echo "make test: installing Debian's $(BROWSER_PACKAGES) system-wide with apt-get (as root), for the"; \
	echo "  dashboard's browser test (Playwright drives chromium; it cannot download its own here). About a"; \
	echo "  minute. To skip the install, and that test: FRENZY_NO_SYSTEM_PACKAGES=1 make test"; \
	echo "  apt-get update (log: $(BROWSER_LOG))"; \
	if ! apt-get update -qq >$(BROWSER_LOG) 2>&1; then \
	  echo "could not update the package lists (see $(BROWSER_LOG)): the browser test will fail"; exit 0; \
	fi; \
	pkgs=$$(apt-get -s install --no-install-recommends $(BROWSER_PACKAGES) 2>>$(BROWSER_LOG) | awk '/^Inst /{print $$2}'); \
	echo "  installing $$(echo $$pkgs | wc -w) packages (chromium and what it needs):"; \
	echo $$pkgs | xargs -n 6 echo "   "; \
	if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(BROWSER_PACKAGES) \
	    >>$(BROWSER_LOG) 2>&1; then echo "  installed: $$(command -v chromium || echo "chromium, yet not on PATH")"; \
	else echo "could not install chromium (see $(BROWSER_LOG)): the browser test will fail"; tail -n 5 $(BROWSER_LOG); fi

## test: the whole suite (unit, integration on a real Redis, end to end); fails if no test ran, and
## fails if the tests changed a tracked file (a test writes under its tmp_path; inside a git work tree).
## Four workers (pytest-xdist; each has its own Redis): on 2 cores 7.9 min instead of 11.8, since
## most tests wait on subprocesses and sockets rather than compute. PYTEST_WORKERS=0 runs serially.
## FRENZY_UPDATE_SCREENSHOTS=1 lets the dashboard's test refresh docs/img (then exempt from the check).
PYTEST_WORKERS ?= 4
test: $(STAMP) browser
	@state() { git status --porcelain --untracked-files=no | while IFS= read -r l; do \
	    case "$$l" in ???docs/img/*) [ "$${FRENZY_UPDATE_SCREENSHOTS:-}" = 1 ] && continue;; esac; \
	    printf '%s %s\n' "$$l" "$$(git hash-object -- "$${l#???}" 2>/dev/null)"; done; }; \
	before=; if [ "$$(git rev-parse --is-inside-work-tree 2>/dev/null)" = true ]; then \
	  before=$$(mktemp); state >"$$before"; fi; \
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing on purpose"; rc=1; fi; \
	if [ -n "$$before" ]; then \
	  after=$$(mktemp); state >"$$after"; \
	  if ! cmp -s "$$before" "$$after"; then \
	    echo "make test: the tests changed tracked files (a test must write under its tmp_path):"; \
	    diff "$$before" "$$after" | sed -n 's/^[<>] ...\(.*\) [0-9a-f]*$$/  \1/p' | sort -u; \
	    [ $$rc -ne 0 ] || rc=1; \
	  fi; rm -f "$$before" "$$after"; \
	fi; exit $$rc

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .

proto: $(STAMP)
	$(BIN)/python scripts/gen_proto.py

up: $(STAMP)
	$(BIN)/frenzy up

clean:
	rm -rf $(VENV) var .pytest_cache build libs/has/*.so libs/has/_native.json *__mypyc*.so
