# keel's two commands: `make demo` and `make test` (see README).
JOBS ?= 2
.PHONY: all keel deps deps-build demo test test-quick bench clean

all: keel

keel:
	@cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build build -j $(JOBS) -- --no-print-directory

deps:
	@bash scripts/install-deps.sh

deps-build:
	@bash scripts/install-deps.sh --build-only

demo: deps keel
	@bash scripts/demo.sh $(DEMO_ARGS)

build-asan/keel: FORCE
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKEEL_SANITIZE=ON >/dev/null
	@cmake --build build-asan -j $(JOBS) -- --no-print-directory

test: deps-build build-asan/keel
	@cd build-asan && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

# A local loop without the tests labelled heavy (CI runs `make test`: all of them).
test-quick: deps-build build-asan/keel
	@cd build-asan && ctest --output-on-failure -j $(JOBS) -LE heavy $(CTEST_ARGS)

bench: deps-build keel
	@bash bench/train_throughput.sh

clean:
	rm -rf build build-asan

FORCE:
