# Thin wrapper over CMake. See README.md.
BUILD      ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
KS_WERROR  ?= OFF
FUZZ_SECONDS ?= 60
CMAKE_FLAGS ?=

.PHONY: all deps build demo test test-asan bench fuzz install clean

all: build

deps:
	@scripts/install-deps

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DKS_WERROR=$(KS_WERROR) $(CMAKE_FLAGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	@scripts/demo $(BUILD)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	$(MAKE) test-asan

# The format, parser and metric tests again under AddressSanitizer + UBSan.
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DKS_SANITIZE=ON -DKS_WERROR=$(KS_WERROR) -DCMAKE_BUILD_TYPE=Debug $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS) -L 'unit|fuzz|asan'

bench: build
	@scripts/bench $(BUILD)
	@# The Python package against safetensors and torch.save, when the build made it (optional).
	@py=$${KS_VENV:-.venv}/bin/python; if [ -d $(BUILD)/python-pkg/keepsake ] && [ -x $$py ]; then \
	  $$py -m pip install -q --disable-pip-version-check -r scripts/requirements-bench.txt 2>/dev/null || \
	    echo "make bench: the peers of scripts/requirements-bench.txt are not installable here; their rows are skipped"; \
	  echo "== python_bench"; PYTHONPATH=$(BUILD)/python-pkg $$py bench/python_bench.py; \
	  echo "== python_manager_bench"; PYTHONPATH=$(BUILD)/python-pkg $$py bench/python_manager_bench.py; \
	  echo "== python_remote_bench"; PYTHONPATH=$(BUILD)/python-pkg $$py bench/python_remote_bench.py --build $(BUILD); \
	  for n in 2 4; do echo "== dcp_bench, $$n ranks"; PYTHONPATH=$(BUILD)/python-pkg $${KS_VENV:-.venv}/bin/torchrun \
	    --nproc-per-node $$n --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:0 bench/dcp_bench.py --repeat 3; done; fi

FUZZ_TARGETS := $(notdir $(basename $(wildcard tests/fuzz/fuzz_*.c)))

# The library itself is instrumented for coverage (fuzzer-no-link), not just the targets.
fuzz: deps
	CC=clang cmake -S . -B $(FUZZ_BUILD) -DKS_WITH_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link,address,undefined" $(CMAKE_FLAGS)
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target $(FUZZ_TARGETS)
	@scripts/fuzz $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_ONLY)
	@# The Python package's readers (a mutation fuzzer: see tests/fuzz/py_readers.py), when built.
	@py=$${KS_VENV:-.venv}/bin/python; if [ -d $(BUILD)/python-pkg/keepsake ] && [ -x $$py ] && \
	  { [ -z "$(FUZZ_ONLY)" ] || echo " $(FUZZ_ONLY) " | grep -q " py_readers "; }; then \
	  echo "== fuzzing py_readers for $(FUZZ_SECONDS)s"; \
	  PYTHONPATH=$(BUILD)/python-pkg $$py tests/fuzz/py_readers.py . $(FUZZ_SECONDS); fi

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
