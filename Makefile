# Thin wrapper: `make run` (the main job) and `make test` (every test through ctest).
JOBS ?= 2
.PHONY: deps build run test asan clean

deps:
	@scripts/install-deps

build: deps
	cmake --preset release >/dev/null
	cmake --build build/release -j$(JOBS)

# Device, then tune and benchmark the smoke specs (user cache in build/ so runs stay local).
run: build
	build/release/tokamax device
	TOKAMAX_CACHE_DIR=$(CURDIR)/build/cache build/release/tokamax autotune --tag smoke --into-cache
	TOKAMAX_CACHE_DIR=$(CURDIR)/build/cache build/release/tokamax bench --tag smoke

test: build
	ctest --preset release -j$(JOBS)

asan: deps
	cmake --preset asan >/dev/null
	cmake --build build/asan -j$(JOBS)
	ctest --preset asan -j$(JOBS)

clean:
	rm -rf build
