# The two commands of the README, plus a few helpers. Each sets itself up:
# a fresh machine needs only Python 3.11 and make.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast lint proto up clean

# setup.py compiles these with mypyc at install (pure Python where it cannot): an edit
# re-installs, so the tests run the compiled build of the current source.
COMPILED := libs/has/cluster.py libs/has/placement.py libs/has/pass_state.py libs/has/policy.py libs/has/queued.py \
  libs/has/queue_order.py libs/has/releases.py libs/has/drain.py libs/has/preemption.py libs/has/queue_pass.py

$(STAMP): pyproject.toml setup.py $(COMPILED)
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Frenzy needs Python 3.11 (set PYTHON=python3.11)"'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev,train,sim]'
	@touch $(STAMP)

## demo: the main job — the stack on a private Redis with fake-GPU agents, one job end to end
demo: $(STAMP)
	$(BIN)/frenzy demo

## test: the whole suite (unit, integration on a real Redis, end to end); fails if no test ran
test: $(STAMP)
	@$(BIN)/python -m pytest; rc=$$?; \
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
