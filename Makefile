# Targets the README names. Everything installs itself into .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_QUESTION ?= How do I read a file line by line?
# A real PDF manual beside them (Debian's gnuplot-doc: gnuplot.pdf, 311 pages), and a question it answers.
DEMO_PDFS ?= gnuplot-doc
DEMO_PDF_QUESTION ?= How do I save a plot as a PNG image?
# The demo corpus: part of the Python 3.11 documentation (Debian's python3.11-doc). DOCS=all ingests all of it.
DOCS ?= tutorial howto faq reference glossary.rst.txt

# Python writes its bytecode caches here whatever the shell says: with PYTHONDONTWRITEBYTECODE set, every `dpr`
# process a test starts compiles its imports again, and every pytest process rewrites the asserts of ~800 modules
# (the plugins' packages included) again: about 10 s of CPU each.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install chromium demo test test-unit test-integration test-slow lint typecheck bench bench-hotpaths clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch first, by pip: 2.13.0 is the CPU build this machine keeps on disk (a plain resolve would pull a CUDA
	# build). The rest by uv, which installs the same versions as pip's resolver in a quarter of the time (46 s vs
	# 173 s on 2 cores) and keeps the torch already there. Neither compiles all of every package's bytecode up
	# front (--no-compile halves torch's install): Python compiles the modules a process imports, once.
	$(BIN)/pip install -q --no-compile torch==2.13.0 uv
	$(BIN)/uv pip install -q --python $(BIN)/python -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	@src=$$(scripts/fetch_python_docs.sh .dpr/corpus) && \
	if [ "$(DOCS)" = all ]; then paths="$$src"; else paths=$$(for d in $(DOCS); do printf '%s/%s ' "$$src" "$$d"; done); fi && \
	pdfs=$$(for p in $(DEMO_PDFS); do scripts/fetch_debian_pdfs.sh .dpr/corpus $$p; done) && \
	echo "ingesting $$paths $$pdfs" && \
	$(BIN)/dpr ingest $$paths $$pdfs && \
	$(BIN)/dpr status && \
	$(BIN)/dpr query "$(DEMO_QUESTION)" -k 5 && \
	$(BIN)/dpr query "$(DEMO_PDF_QUESTION)" -k 3

# The console's browser test needs Debian's chromium: installed here when we are root with apt-get, else the test
# skips with its reason. Quiet, and nothing to do once /usr/bin/chromium exists.
chromium:
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing chromium (apt-get) for the console's browser test"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
			|| echo "chromium not installed; the browser test will skip"; \
	fi

# pytest on several processes (pytest-xdist, --dist loadfile: a test file's tests stay in one process, with its
# module-scoped fixtures such as a worker cluster); every test has its own temp dir and free ports, and the workers
# share one ONNX export (tests/conftest.py). `make test` runs in two parts: first the unit tests and the integration
# tests not marked `serial`, together on TEST_WORKERS (2) processes (one collection, and the unit tests fill the
# gaps while integration tests wait on their servers and workers); then the tests marked `serial` (their waits
# are timed in seconds against real workers or a reader's turn; on 2 busy cores they failed beside another test
# process) alone in one process. INTEGRATION_WORKERS (2; 0: one process) is for `make test-integration`.
TEST_WORKERS ?= 2
UNIT_WORKERS ?= 2
INTEGRATION_WORKERS ?= 2
xdist = -n $(1) --dist loadfile
# the files that mark tests `serial`, named so that this run collects them alone (1 s instead of 14 s)
serial = $(BIN)/pytest -m "integration and serial and not slow" -q --durations=10 \
	$(shell grep -l 'pytest.mark.serial' tests/integration/*.py)
integration = $(BIN)/pytest -m "integration and not serial and not slow" -q --durations=15 \
	$(call xdist,$(INTEGRATION_WORKERS)) && $(serial)

test: $(STAMP) chromium
	$(BIN)/ruff check entrypoints services workers encoders dpr_client tests benchmarks
	$(BIN)/mypy
	$(BIN)/pytest -m "unit or (integration and not serial and not slow)" -q --durations=25 $(call xdist,$(TEST_WORKERS))
	$(serial)

test-unit: $(STAMP)
	$(BIN)/pytest -m unit -q $(call xdist,$(UNIT_WORKERS))

test-integration: $(STAMP) chromium
	$(integration)

# The rest of the suite, kept out of `make test` to hold it near 10 minutes: the lab (training, adaptation,
# reranker, multilingual conversion on tiny models), the benchmark scripts' own tests, model-quality, OCR and kill -9
# runs, two integration tests that wait out a killed re-embed (marked slow as well), and the API fuzz at its full
# budget (90 s per role instead of 30).
test-slow: $(STAMP)
	$(BIN)/pytest -m slow -q --durations=20
	FUZZ_SECONDS=90 $(BIN)/pytest tests/integration/test_api_fuzz.py -q

lint: $(STAMP)
	$(BIN)/ruff check entrypoints services workers encoders dpr_client tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_ingest.py

# Issue 13's hot paths in one run (~40 min on 2 cores); the peer script searches with faiss-cpu (the bench extra)
bench-hotpaths: $(STAMP)
	$(BIN)/pip install -q -e ".[test,bench]"
	$(BIN)/python benchmarks/bench_hotpaths.py

clean:
	rm -rf $(VENV) .dpr .pytest_cache .ruff_cache .mypy_cache
