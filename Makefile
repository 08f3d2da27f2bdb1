# Two commands set everything up on a fresh machine:
#   make demo   - the main job end to end on the embedded synthetic corpus (artifacts under $(RUN))
#   make test   - the test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RUN ?= runs/demo
DEMO_UTTERANCES ?= 4500
DEMO_VOCAB ?= 256
DEMO_MAX_TIME ?= 00:00:20:00
WORKERS ?= 2
DEMO_LM_WEIGHT ?= 1.0
DEMO_WORD_SCORE ?= 0.0
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PACKAGES := espeak-ng fortunes
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

# make demo: every step writes a file that marks it done, so a rerun goes straight to what is missing.
demo: sysdeps $(VENV)/.installed
	$(MAKE) --no-print-directory $(RUN)/eval/summary.json
	$(PY) -m serve.try_api model=$(RUN)/train/bundle.pt manifest=$(RUN)/corpus/test.jsonl clips=2
	@echo; echo "make demo: done. Every artifact is under $(RUN)/ (corpus, shards, tokenizer.model, lm.arpa, train/, eval-greedy/, eval/)."

$(RUN)/corpus/test.jsonl:
	$(PY) -m data_prep.synth out_dir=$(RUN)/corpus num_utterances=$(DEMO_UTTERANCES) seed=0

$(RUN)/shards/%/index.json: $(RUN)/corpus/test.jsonl
	$(PY) -m data_prep.shard manifest=$(RUN)/corpus/$*.jsonl out_dir=$(RUN)/shards/$* split=$* workers=$(WORKERS) \
	  max_shard_bytes=50000000

$(RUN)/tokenizer.model: $(RUN)/shards/train/index.json
	$(PY) -m data_prep.tokenizer input=$(RUN)/shards/train model=$@ vocab_size=$(DEMO_VOCAB)

$(RUN)/train/bundle.pt: $(RUN)/shards/train/index.json $(RUN)/shards/dev/index.json $(RUN)/tokenizer.model
	$(PY) -m asr.train run_dir=$(RUN)/train data=tiny data.train_dir=$(RUN)/shards/train \
	  data.val_dir=$(RUN)/shards/dev data.tokenizer=$(RUN)/tokenizer.model trainer.max_time=$(DEMO_MAX_TIME) \
	  optim=adamw_time data.spec_augment=false trainer.check_val_every_n_epoch=2 trainer.monitor=val/wer

$(RUN)/lm.arpa: $(RUN)/shards/train/index.json
	$(PY) -m data_prep.lm input=$(RUN)/shards/train out=$@ order=3

# Test-set WER twice: greedy CTC, then beam search with the word trigram LM of the training transcripts.
$(RUN)/eval/summary.json: $(RUN)/train/bundle.pt $(RUN)/shards/test/index.json $(RUN)/lm.arpa
	$(PY) -m asr.evaluate model=$(RUN)/train/bundle.pt data=$(RUN)/shards/test out_dir=$(RUN)/eval-greedy
	$(PY) -m asr.evaluate model=$(RUN)/train/bundle.pt data=$(RUN)/shards/test out_dir=$(RUN)/eval \
	  decoding=beam decoding.lm=$(RUN)/lm.arpa decoding.lm_weight=$(DEMO_LM_WEIGHT) decoding.word_score=$(DEMO_WORD_SCORE)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: $(VENV)/.installed
	for b in bench/bench_*.py; do $(PY) $$b || exit 1; done
