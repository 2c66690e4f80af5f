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

$(STAMP): pyproject.toml setup.py $(COMPILED)
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Frenzy needs Python 3.11 (set PYTHON=python3.11)"'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[server,dev,train,sim]'
	@touch $(STAMP)

## demo: the main job — the stack on a private Redis with fake-GPU agents, one job end to end
demo: $(STAMP)
	$(BIN)/frenzy demo

# The dashboard's browser test (tests/e2e/test_dashboard_browser.py) drives Debian's chromium
# through Playwright, which cannot download a browser of its own here. Installed when missing
# and this is root with apt-get; otherwise that test fails saying how to install it.
browser:
	@if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium (Debian package) for the dashboard's browser test"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	        chromium fonts-liberation; } >/tmp/frenzy-chromium-install.log 2>&1 \
	      || echo "could not install chromium (see /tmp/frenzy-chromium-install.log): the browser test will fail"; \
	  else echo "chromium is missing and cannot be installed here (not root, or no apt-get): the browser test will fail"; fi; \
	fi

## test: the whole suite (unit, integration on a real Redis, end to end); fails if no test ran.
## Four workers (pytest-xdist; each has its own Redis): on 2 cores 7.9 min instead of 11.8, since
## most tests wait on subprocesses and sockets rather than compute. PYTEST_WORKERS=0 runs serially.
PYTEST_WORKERS ?= 4
test: $(STAMP) browser
	@$(BIN)/python -m pytest -n $(PYTEST_WORKERS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing on purpose"; exit 1; fi; exit $$rc

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
