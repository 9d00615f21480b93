# Two commands on a fresh machine with Python 3.11:
#   make demo   set up .venv, then TP2 x PP2 x DP2 pretraining with compression on 8 CPU processes
#   make test   set up .venv, then the test suite
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch first and pinned: the CPU wheel for the CPU set-up (pyproject.toml only asks for a
# range, so a GPU machine's CUDA torch is kept: there run `make setup TORCH=` or skip setup).
# pip's own indexes and find-links first (a wheel already on disk installs in seconds); the
# PyTorch CPU index only when they lack it (PyPI has no +cpu builds, so that fails fast).
TORCH  ?= torch==2.13.0+cpu
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
NPROC  ?= 8
# Every channel compressed: 8-bit activations forward (AC-SGD fixpoint), rank-16 CB with LEP
# backward (Optimus-CC), PowerSGD rank 8 on stage 0's dp gradients (SC), fused embedding sync.
# `make demo DEMO_COMPRESSION=` runs the uncompressed baseline.
DEMO_COMPRESSION ?= --forward-compress-method fixpoint --forward-bits 8 \
	--inter-grad-comp --inter-grad-comp-rank 16 --use-error-feedback \
	--grad-comp --grad-comp-rank 8 --grad-comp-warm-up 0.1 \
	--selective-grad-comp --selective-grad-comp-way 1 --emb-comm-opt

.PHONY: setup demo test test-312 bench clean gpu-check

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(if $(TORCH),$(BIN)/pip install -q $(TORCH) || \
	    $(BIN)/pip install -q --extra-index-url $(TORCH_INDEX) $(TORCH))
	$(BIN)/pip install -q -e ".[test,eval]"
	touch $@

demo: setup
	OMP_NUM_THREADS=1 $(BIN)/torchrun --nproc-per-node $(NPROC) pretrain_gpt.py \
	    --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \
	    --num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 128 \
	    --micro-batch-size 4 --global-batch-size 32 --train-iters 300 \
	    --lr 1e-3 --min-lr 1e-4 --lr-warmup-iters 20 --lr-decay-style cosine \
	    --log-interval 20 --eval-interval 100 --eval-iters 4 \
	    --save runs/demo/checkpoints --save-interval 150 \
	    $(DEMO_COMPRESSION) $(ARGS)

# One pytest worker per core (pytest-xdist; JOBS=0 runs in one process, e.g. for ARGS=-s);
# work stealing evens out the long multi-process tests.
JOBS ?= auto
test: setup
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest tests -n $(JOBS) --dist worksteal $(ARGS)

# megatron-core 0.17+ needs Python >= 3.12: the same suite in a second environment (PyPI's
# torch for 3.12 is a CUDA build of a few GB; it runs on the CPU)
PYTHON312 ?= python3.12
test-312:
	$(MAKE) test PYTHON="$(PYTHON312)" VENV=.venv312 TORCH=torch==2.13.0 ARGS="$(ARGS)"

bench: setup
	OMP_NUM_THREADS=1 $(BIN)/python bench/bench_vs_huggingface.py

# GPU correctness tests (each with a timeout), then the GPU benchmark, in one time budget that
# fits a 10-minute run (ARGS=--quick: under 5 minutes); exit status = correctness only; one
# line and exit 0 without CUDA. No setup dependency: a GPU machine brings its own torch
# (docs/gpu.md).
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
gpu-check:
	$(GPU_PYTHON) tools/gpu_check.py $(ARGS)

clean:
	rm -rf $(VENV) runs .cache
