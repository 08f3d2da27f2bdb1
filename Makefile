# Two commands set everything up on a fresh machine:
#   make demo   - the main job end to end on the embedded synthetic corpus (artifacts under $(RUN))
#   make test   - the test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RUN ?= runs/demo
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PACKAGES := espeak-ng
TEST_APT_PACKAGES := espeak-ng chromium chromium-driver

.PHONY: demo test lint bench sysdeps test-sysdeps clean-demo

# --- environment -------------------------------------------------------------
# NOTE: torch and torchaudio are installed first and pinned together: torchaudio's wheels do not pin torch,
# and torchaudio 2.11 is the release that works with torch 2.14.1 on CPU.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.14.1 torchaudio==2.11.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

define apt_install
	@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; fi
endef

sysdeps:
	$(call apt_install,$(APT_PACKAGES))

test-sysdeps:
	$(call apt_install,$(TEST_APT_PACKAGES))

# --- the two commands ----------------------------------------------------------
test: test-sysdeps $(VENV)/.installed
	$(PY) -m pytest -q

demo: sysdeps $(VENV)/.installed
	$(PY) -m data_prep.demo run_dir=$(RUN)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: $(VENV)/.installed
	for b in bench/bench_*.py; do $(PY) $$b || exit 1; done
