# strata — make run: chat on the default model; make test: the test suite. Both set up .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
NATIVE_BUILD := build/native
CMAKE_ARGS ?=
PYTEST_ARGS ?=
MATRIX_OUT ?= matrix-out

.PHONY: all run test test-simd test-asan test-llama-cpp native gpu-test bench matrix lint clean

all: native

# dev tools and the ray extra (tests/test_matrix_run.py sends cells to a local Ray cluster)
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,ray]'
	touch $@

# The test suite also compares against Hugging Face transformers (torch CPU; the wheel is local).
# tests/test_transformers.py imports them: a failed install fails here, not as a skipped test.
REF_STAMP := $(VENV)/.reference-stamp
$(REF_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,reference]'
	touch $@

# Incremental build of libstrata.so into strata/lib (the loader looks there first).
native: $(STAMP)
	cmake -S native -B $(NATIVE_BUILD) -DCMAKE_BUILD_TYPE=Release -DSTRATA_OUTPUT_DIR=$(CURDIR)/strata/lib $(CMAKE_ARGS) >/dev/null
	cmake --build $(NATIVE_BUILD) -j

run: native
	$(BIN)/strata chat

test: native $(REF_STAMP)
	$(BIN)/python -m pytest -m "not gpu and not bench and not llama_cpp" $(PYTEST_ARGS)

# llama.cpp reading strata's models: needs llama.cpp's Python binding and STRATA_LLAMA_CPP_LIB (the folder
# with libllama.so); it fails, not skips, without them.
test-llama-cpp: native
	$(BIN)/python -m pytest -m llama_cpp -p no:cacheprovider tests/test_llama_cpp.py $(PYTEST_ARGS)

# The numerics tests again on the kernels of CPUs without AVX-512 and without AVX2 (STRATA_SIMD caps the
# level --simd auto picks), so that a bound tuned on one machine cannot pass here and fail on the next.
SIMD_TESTS := tests/test_reference.py tests/test_determinism.py tests/test_memplan.py tests/test_cuda_mirror.py \
              tests/test_engine_api.py tests/test_parallel.py tests/test_arch.py
test-simd: native $(REF_STAMP)
	for lv in avx2 scalar; do STRATA_SIMD=$$lv $(BIN)/python -m pytest -q -p no:cacheprovider $(SIMD_TESTS) || exit 1; done

# The engine tests against a build with AddressSanitizer and UBSan.
test-asan: $(STAMP)
	cmake -S native -B build/asan -DCMAKE_BUILD_TYPE=Debug -DSTRATA_SANITIZE=ON -DSTRATA_CUDA=OFF >/dev/null
	cmake --build build/asan -j
	STRATA_LIB=$(CURDIR)/build/asan/libstrata.so \
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	$(BIN)/python -m pytest -m "asan" -p no:cacheprovider $(PYTEST_ARGS)

# GPU tests and GPU benchmarks in one command (one device call); prints a short table last.
# It needs no .venv (GPU hosts often have no package registry): the system python3 with numpy, pytest,
# tokenizers, gguf and platformdirs importable (and starlette, uvicorn for the matrix's GPU cells);
# GPU_PYTHON overrides the interpreter.
GPU_PYTHON ?= python3
gpu-test:
	cmake -S native -B build/gpu -DCMAKE_BUILD_TYPE=Release -DSTRATA_OUTPUT_DIR=$(CURDIR)/strata/lib >/dev/null
	cmake --build build/gpu -j
	PYTHONPATH=$(CURDIR):$$PYTHONPATH $(GPU_PYTHON) -m pytest -p no:cacheprovider -o addopts="" -m gpu \
	  tests/gpu tests/test_matrix_gpu.py -v $(PYTEST_ARGS)
	PYTHONPATH=$(CURDIR):$$PYTHONPATH $(GPU_PYTHON) tests/gpu/bench_gpu.py

bench: native
	$(BIN)/python -m pytest tests/bench --benchmark-only -m "bench" $(PYTEST_ARGS)

matrix: native
	$(BIN)/repro_matrix run builtin --out $(MATRIX_OUT)

# ruff's lint and format checks and mypy, with the settings in pyproject.toml (CI runs it first; ~15 s).
LINT_PATHS := strata strata_tui strata_bench repro_matrix tests
lint: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/mypy

clean:
	rm -rf build strata/lib/libstrata.so
