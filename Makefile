# Thin wrapper: `make run` (the main job) and `make test` (every test through ctest).
JOBS ?= 2
.PHONY: deps build run test test-python asan tsan test-sanitizers fuzz clean

deps:
	@scripts/install-deps

build: deps
	cmake --preset release >/dev/null
	cmake --build build/release -j$(JOBS)

# Device, then tune and benchmark the smoke specs (user cache in build/ so runs stay local), trace
# the example MoE block, and write a report of all three: build/report.html. Builds only what it
# runs (the command and the example), with a heading per phase, and ends with the report's summary.
RUN_ENV = TOKAMAX_CACHE_DIR=$(CURDIR)/build/cache
run: deps
	@echo "== build: the tokamax command and the MoE example"
	@cmake --preset release >/dev/null
	@cmake --build build/release -j$(JOBS) --target tokamax_cli moe_block | tail -n 1
	@echo "== device: this CPU and its measured ceilings"
	@$(RUN_ENV) build/release/tokamax device --roofline
	@echo "== autotune: the smoke specs (small shapes that check the tools), one line per key"
	@$(RUN_ENV) build/release/tokamax autotune --tag smoke --into-cache -o build/autotune_smoke.json
	@echo "== bench: every implementation of the smoke specs side by side"
	@$(RUN_ENV) build/release/tokamax bench --tag smoke -o build/bench_smoke.json > build/bench_smoke.txt
	@echo "   $$(($$(wc -l < build/bench_smoke.txt) - 2)) rows: build/bench_smoke.txt"
	@echo "== trace: two steps of the example MoE block"
	@$(RUN_ENV) TOKAMAX_LOG=error TOKAMAX_TRACE=build/trace_moe_block.json \
	  build/release/examples/moe_block --steps 2 >/dev/null
	@echo "   build/trace_moe_block.json"
	@echo "== report"
	@build/release/tokamax report build/autotune_smoke.json --bench build/bench_smoke.json \
	  --trace build/trace_moe_block.json -o build/report.html
	@echo "open $(CURDIR)/build/report.html"

# The C++ tests, then the Python package's (scripts/test-python: a virtual environment under
# build/ with pinned dependencies, `pip install .`, pytest).
test: build
	ctest --preset release -j$(JOBS)
	scripts/test-python

test-python: deps
	scripts/test-python

# Every C++ test under AddressSanitizer + UndefinedBehaviorSanitizer (clang; the build also has the
# libFuzzer targets), the `long` ones included.
asan: deps
	cmake --preset asan >/dev/null
	cmake --build build/asan -j$(JOBS)
	ctest --preset asan -j$(JOBS)

# The tests labelled `threads` under ThreadSanitizer (the tsan test preset selects them).
tsan: deps
	cmake --preset tsan >/dev/null
	cmake --build build/tsan -j$(JOBS) --target tokamax_tests tokamax_cli
	ctest --preset tsan -j$(JOBS)

# What CI runs after `make test` (.ci/run): the suite under ASan + UBSan less the `long` tests,
# every fuzz target for FUZZ_SECONDS from the same build, the `threads` tests under TSan.
FUZZ_SECONDS ?= 60
test-sanitizers: deps
	JOBS=$(JOBS) FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/test-sanitizers

# Every libFuzzer target for FUZZ_SECONDS each (fuzz/README.md), FUZZ_JOBS at a time, from the
# seed corpora in fuzz/seeds plus the shipped tuning data; findings land in build/fuzz/findings.
FUZZ_JOBS ?= 1
fuzz: deps
	cmake --preset fuzz >/dev/null
	cmake --build build/fuzz -j$(JOBS)
	scripts/run-fuzzers -j $(FUZZ_JOBS) build/fuzz $(FUZZ_SECONDS)

clean:
	rm -rf build
