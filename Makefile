# Two commands for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-slow results gpu-data gpu-check chromium bench bench-peers bench-profiles clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# pyproject states the torch versions cadence supports; this install pins the exact CPU wheel
# (TORCH), since any other spec pulls a CUDA build.
TORCH ?= torch==2.13.0
$(STAMP): pyproject.toml Makefile | $(PY)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev,plot,ray]' '$(TORCH)'
	touch $(STAMP)

install: $(STAMP)

# Trains ComplEx on UMLS under sync, async and OAC side by side, 3 runs each interleaved (49 s
# here); prints the table (medians and ranges; ≈ where a speed-up is within the noise), the sentence
# it says, and writes plots.
demo: install
	$(VENV)/bin/cadence data fetch umls
	$(VENV)/bin/cadence -q compare --strategies sync,async,oac --config configs/umls-complex.yaml \
		--repeats 3 --out runs/demo-umls --overwrite
	@echo "Where the pipeline pays (reads that wait on a slow disk, a GPU computing): docs/strategies/pipelined.md, 'When the pipeline runs'. Predictions from a run: docs/predict.md."

# TEST_JOBS: pytest-xdist workers for the default suite (0: one process). Two on this 2-core machine:
# much of the suite waits on processes starting (imports, Ray actors), and the other worker fills it.
TEST_JOBS ?= 2
test: install
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadgroup

test-slow: install
	$(PY) -m pytest -q -m slow

# docs/results.md (each seed paper's headline beside cadence's figure, its plots in docs/results/) and
# the README's table of them, from benchmarks/results/*.json only (benchmarks/results_page.py)
results: install
	cd benchmarks && ../$(PY) results_page.py --write

# On a machine with a CUDA device: every CUDA test (`-m cuda`), then the GPU benchmark
# (benchmarks/results/gpu_check.json). Uses that machine's own torch (GPU_PY, default python3) with
# src/ on the path: no install, no network. GPU_JOBS: pytest-xdist workers (empty: none).
GPU_PY ?= python3
GPU_JOBS ?= 8
# one rep of each part: the whole target aimed at 4 minutes of a lease (the last 2-rep run: 263 s of
# benchmark before the FB15k-sized parts); GPU_CHECK_ARGS="--reps 2" for intervals
GPU_CHECK_ARGS ?= --reps 1
# The data sets the CUDA tests and the GPU benchmark read, fetched on a machine with network into
# $CADENCE_HOME (the GPU machine may have none): carry that folder there (docs/benchmarks.md).
GPU_DATA := umls fashion-mnist ml-100k enwiki-excerpt
gpu-data: install
	$(VENV)/bin/cadence data fetch $(GPU_DATA)

gpu-check:
	PYTHONPATH=src $(GPU_PY) -c "import sys, torch; torch.cuda.is_available() or sys.exit('gpu-check: no CUDA device here')"
	PYTHONPATH=src $(GPU_PY) -m pytest -q -m cuda -p no:cacheprovider $(if $(GPU_JOBS),-n $(GPU_JOBS)) tests
	PYTHONPATH=src $(GPU_PY) benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

# A headless browser for the HTML report's browser test and the README's screenshot: Debian's chromium
# and the libraries a bare Debian lacks, fetched with apt-get download at pinned versions, sha256-checked
# (tests/report/chromium.sha256), unpacked, not installed: .chromium/chromium. Without it that test skips.
CHROMIUM_DEBS := $(shell sed 's/^[0-9a-f]*  //; s/_amd64.deb$$//; s/_/=/' tests/report/chromium.sha256)
chromium: .chromium/chromium
.chromium/chromium: tests/report/chromium.sha256
	rm -rf .chromium && mkdir -p .chromium/debs
	cd .chromium/debs && apt-get download $(CHROMIUM_DEBS) && sha256sum -c ../../tests/report/chromium.sha256
	for f in .chromium/debs/*.deb; do dpkg-deb -x $$f .chromium/root; done
	printf '#!/bin/sh\nroot=$$(dirname "$$(readlink -f "$$0")")/root\nexport LD_LIBRARY_PATH="$$root/usr/lib/x86_64-linux-gnu:$$root/usr/lib/x86_64-linux-gnu/pulseaudio$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}"\nexec "$$root/usr/lib/chromium/chromium" "$$@"\n' > .chromium/chromium
	chmod +x .chromium/chromium

bench: install
	$(PY) benchmarks/kge_throughput.py
	$(PY) benchmarks/pipeline_throughput.py

# Each task against the library its users use today; the peers live in their own virtualenvs, built
# from benchmarks/peers/requirements-PEER.txt (each peer's side of a comparison: benchmarks/peers/).
PEERS := surprise gensim deepctr torchrec pbg torchkge pandas pykeen
.venv-bench-%/bin/python: benchmarks/peers/requirements-%.txt
	$(PYTHON) -m venv .venv-bench-$*
	.venv-bench-$*/bin/pip install -q --no-deps -r $<

# Tools the benchmarks run beside the library (py-spy), in their own virtualenvs too.
.venv-bench-pyspy/bin/python: benchmarks/requirements-pyspy.txt
	$(PYTHON) -m venv .venv-bench-pyspy
	.venv-bench-pyspy/bin/pip install -q --no-deps -r $<

bench-peers: install $(PEERS:%=.venv-bench-%/bin/python)
	$(PY) benchmarks/mf_vs_surprise.py
	$(PY) benchmarks/mf_vs_surprise.py --synthetic 500000,50000,10000000 --seeds 2 --contenders cadence_rating,surprise_default
	$(PY) benchmarks/w2v_vs_gensim.py
	$(PY) benchmarks/ctr_vs_deepctr.py
	$(PY) benchmarks/ctr_vs_deepctr.py --peer torchrec
	$(PY) benchmarks/kge_vs_pbg.py
	$(PY) benchmarks/kge_vs_pbg.py --model complex
	$(PY) benchmarks/kge_vs_pbg.py --epochs 3
	$(PY) benchmarks/kge_vs_pbg.py --epochs 3 --communities 4096
	$(PY) benchmarks/kge_vs_pbg.py --contenders cadence,torchkge --conditions quiet --reps 2 --torchkge-batches 20 \
		--out benchmarks/results/kge_vs_torchkge.json
	$(PY) benchmarks/import_edges.py
	$(PY) benchmarks/wordnet_quality.py

# Where each task's time goes: py-spy (its own venv) on each task's shipped config under sync;
# results/task_profiles.json and the table in docs/benchmarks.md.
bench-profiles: install .venv-bench-pyspy/bin/python
	$(PY) benchmarks/task_profiles.py --write

clean:
	rm -rf $(VENV) runs build dist src/*.egg-info .chromium
