# Preflight: the two front-door commands are `make report` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PROFILE ?= data/profiles/example.yaml
AUDIT_ARGS ?=
PYTEST_ARGS ?= -q -rs
# make test runs the suite in this many processes (pytest-xdist; a test file stays on one, see
# tests/conftest.py). TEST_WORKERS=0: one process, in the order of the files.
TEST_WORKERS ?= 2
# make wheelhouse: which interpreter / platform the wheels are for (an air-gapped cluster's).
WHEEL_PY ?= 3.11
WHEEL_PLATFORM ?= manylinux_2_28_x86_64
WHEELHOUSE ?= wheelhouse
# Extra pip options, e.g. offline: PIP_OPTS="--no-index --find-links wheelhouse"
PIP_OPTS ?=

.PHONY: setup setup-keep-torch bytecode report plan test test-fast lint lab wheelhouse clean

# Installed once; re-run only when pyproject.toml changes. A venv marked .keep-torch (make
# setup-keep-torch) keeps its own torch: every other pin, then the package without dependencies.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	if [ -e $(VENV)/.keep-torch ]; then \
	  $(PY) tools/pins.py --without torch > $(VENV)/pins-without-torch.txt && \
	  $(PY) -m pip install --quiet $(PIP_OPTS) -r $(VENV)/pins-without-torch.txt && \
	  $(PY) -m pip install --quiet $(PIP_OPTS) --no-deps -e .; \
	else \
	  $(PY) -m pip install --quiet $(PIP_OPTS) -e '.[test]'; \
	fi
	$(PY) -m ipykernel install --sys-prefix --name preflight --display-name "Python (preflight)" > /dev/null
	touch $@

setup: $(VENV)/.installed

## A GPU image's own torch (often 2.11): keep it. VENV= an environment that has torch, or a new one
## made with --system-site-packages from $(PYTHON). Later set-ups of that VENV keep it too.
setup-keep-torch:
	test -x $(PY) || $(PYTHON) -m venv --system-site-packages $(VENV)
	@$(PY) -c "import torch" 2> /dev/null || { echo "setup-keep-torch: $(PY) cannot import torch;" \
	  "give VENV= an environment that has it, or use make setup (installs torch==2.13.0)" >&2; exit 2; }
	touch $(VENV)/.keep-torch
	rm -f $(VENV)/.installed
	$(MAKE) --no-print-directory setup VENV=$(VENV)
	@$(PY) -c "import torch, preflight; print('torch', torch.__version__, 'kept; preflight', preflight.__version__)"

## The library's bytecode, compiled before an audit (0.06 s when up to date): where
## PYTHONDONTWRITEBYTECODE is set (CI images, this project's sandbox), Python never caches it and
## compiles the library again at every run, ~0.6 s of a 5-6 s plan. A checkout it cannot write to is
## no error: the audit then compiles in memory, as before.
bytecode: setup
	@$(PY) -m compileall -q lib > /dev/null 2>&1 || true

## Audit the example profile with live measurements on this machine.
report: bytecode
	$(PY) -m preflight audit $(PROFILE) $(AUDIT_ARGS)

## Formulas only, no live measurement (fast): written to reports/<project>-plan/, beside the measured report.
plan: bytecode
	$(PY) -m preflight audit $(PROFILE) --plan-only $(AUDIT_ARGS)

## As root, also installs Debian's Slurm (~13 MB) for the real-cluster tests in tests/test_slurm.py
## and Debian's chromium for the browser tests in tests/test_browser.py (report offline, JupyterLab
## sliders); if that fails, or elsewhere (not root), those tests are skipped.
test: setup
	@if [ "$$(id -u)" = 0 ] && command -v apt-get > /dev/null 2>&1 && ! PATH="$$PATH:/usr/sbin:/sbin" \
	    sh -c 'command -v slurmctld && command -v slurmd && command -v srun && command -v munged' > /dev/null; then \
	  echo "installing slurmctld slurmd slurm-client munge for the Slurm tests (apt-get)"; \
	  log=$$(mktemp); \
	  if ! { timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install \
	         -y -qq --no-install-recommends slurmctld slurmd slurm-client munge; } > "$$log" 2>&1; then \
	    tail -n 5 "$$log"; echo "Slurm not installed: the Slurm tests will be skipped"; \
	  fi; \
	  rm -f "$$log"; \
	fi
	@if [ "$$(id -u)" = 0 ] && command -v apt-get > /dev/null 2>&1 && [ ! -x /usr/bin/chromium ]; then \
	  echo "installing chromium for the browser tests (apt-get, ~480 MB)"; \
	  log=$$(mktemp); \
	  if ! { timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install \
	         -y -qq --no-install-recommends chromium; } > "$$log" 2>&1; then \
	    tail -n 5 "$$log"; echo "chromium not installed: the browser tests will be skipped"; \
	  fi; \
	  rm -f "$$log"; \
	fi
	$(VENV)/bin/ruff check lib tests tools
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

## The unit tier, for the people changing the code (under 5 minutes on 2 cores): formulas, schema,
## profiles, plan-only CLI paths and audits, the toolkit, the report from fixtures. Not: tests marked
## slow (live measurements, measure-mode audits, torchrun runs), browser (Chromium), slurm, gpu.
## `make test` runs everything, these included; CI runs `make test`.
test-fast: lint
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not slow and not browser and not slurm and not gpu" $(PYTEST_ARGS)

## The linter alone (make test runs it first): pyflakes, pycodestyle, import order, bugbear, pyupgrade.
lint: setup
	$(VENV)/bin/ruff check lib tests tools

## JupyterLab for workshops: loopback only, token on.
# The learners' copy: the committed notebooks are copied once into $(LAB_DIR) (ignored by git) and served
# from there, so outputs and edits autosave into the copy, never into playbook/. Delete $(LAB_DIR) to start
# over. Same depth as playbook/, so the notebooks' ../data paths hold. No news or update pop-ups.
LAB_DIR ?= lab
lab: setup
	@mkdir -p $(LAB_DIR) && for f in playbook/*.ipynb playbook/*.md; do \
	  [ -e "$(LAB_DIR)/$$(basename $$f)" ] || cp "$$f" $(LAB_DIR)/; done
	@echo "serving your copy of the playbook in $(LAB_DIR)/ (playbook/ stays as committed); open the URL printed below"
	$(VENV)/bin/jupyter lab --ip=127.0.0.1 --no-browser --ServerApp.root_dir=$(LAB_DIR) \
	  --LabApp.news_url=None --LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate \
	  $(if $(filter 0,$(shell id -u)),--allow-root)

## Every wheel the project needs, for an offline install on another machine (see README).
wheelhouse:
	mkdir -p $(WHEELHOUSE)
	$(PYTHON) tools/pins.py --build > $(WHEELHOUSE)/requirements.txt
	$(PYTHON) -m pip download --only-binary=:all: --python-version $(WHEEL_PY) --implementation cp \
	  --platform $(WHEEL_PLATFORM) --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d $(WHEELHOUSE) -r $(WHEELHOUSE)/requirements.txt
	@echo "wheels in $(WHEELHOUSE)/. Offline: make report PIP_OPTS=\"--no-index --find-links $(WHEELHOUSE)\""

clean:
	rm -rf $(VENV) reports build lib/*.egg-info
