# Thin driver over CMake. Every target installs missing Debian packages first
# (scripts/install-deps.sh is idempotent and quiet when nothing is missing).
BUILD ?= build
JOBS ?= $(shell nproc)
PY ?= /usr/bin/python3
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test bench tsan fuzz cuda clean format

all: build

deps:
	@scripts/install-deps.sh build

$(BUILD)/CMakeCache.txt:
	@scripts/install-deps.sh build
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE=$(PY) $(CMAKE_FLAGS)

configure: $(BUILD)/CMakeCache.txt

build: deps configure
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	scripts/demo.sh $(BUILD)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# Configures again (peers installed since the last configure are found; a
# missing one stops the configure, naming it: bench/peers.cmake).
bench:
	@scripts/install-deps.sh bench
	$(MAKE) configure
	cmake -S . -B $(BUILD) -DEPD_BUILD_BENCH=ON -DEPD_BENCH_REQUIRE_PEERS=ON
	$(MAKE) build
	scripts/bench.sh $(BUILD)

tsan:
	@scripts/install-deps.sh build
	cmake -S . -B build-tsan -G Ninja -DEPD_TSAN=ON -DEPD_WITH_TORCH=OFF -DEPD_WITH_GRPC=OFF -DEPD_WITH_PYTHON=OFF -DEPD_BUILD_BENCH=OFF
	cmake --build build-tsan -j $(JOBS) --target concurrent_cache_test
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -R Concurrent

# libFuzzer over every fuzz target (fuzz/CMakeLists.txt) for FUZZ_SECONDS each,
# starting from its seed corpus; new inputs go to build-fuzz/fuzz-work, not
# the repository. docs/FUZZING.md.
FUZZ_SECONDS ?= 60
fuzz:
	@scripts/install-deps.sh build
	cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
	  -DCMAKE_CXX_COMPILER=clang++ -DEPD_WITH_FUZZ=ON -DEPD_WITH_TORCH=OFF -DEPD_WITH_GRPC=OFF \
	  -DEPD_WITH_PYTHON=OFF -DEPD_BUILD_BENCH=OFF
	cmake --build build-fuzz -j $(JOBS) --target fuzzers
	scripts/fuzz.sh build-fuzz $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD) build-tsan build-fuzz
