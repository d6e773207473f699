# Thin driver over CMake. Every target installs missing Debian packages first
# (scripts/install-deps.sh is idempotent and quiet when nothing is missing).
BUILD ?= build
JOBS ?= $(shell nproc)
PY ?= /usr/bin/python3
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test bench asan tsan fuzz cuda clean format lint image k8s-check

all: build

deps:
	@scripts/install-deps.sh build

# Configuring needs the demo's packages only (scripts/install-deps.sh demo).
$(BUILD)/CMakeCache.txt:
	@scripts/install-deps.sh demo
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE=$(PY) $(CMAKE_FLAGS)

configure: $(BUILD)/CMakeCache.txt

# A package installed since the last configure (say `make test` after `make
# demo`, which installs less) is found by configuring again: dpkg's status
# file is then newer than the cache.
build: deps configure
	@if [ /var/lib/dpkg/status -nt $(BUILD)/CMakeCache.txt ]; then cmake -S . -B $(BUILD) >/dev/null; fi
	cmake --build $(BUILD) -j $(JOBS)

# Installs and builds only what the demo runs: the CLI and the default model
# it loads (its dependencies), not the tests, fuzz replays and benchmarks,
# nor the packages only they need (scripts/install-deps.sh demo).
demo: configure
	@scripts/install-deps.sh demo
	cmake --build $(BUILD) -j $(JOBS) --target epd-encode
	scripts/demo.sh $(BUILD)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The OCI images, two-stage from a Debian base made by mmdebstrap (no
# registry): localhost/epd-encode, epd-router, epd-redis:<version>
# (scripts/image.sh, docs/DEPLOY.md). The base tarball is cached in $(BUILD)/oci.
image:
	@scripts/install-deps.sh image
	scripts/image.sh full $(BUILD)

# The deploy/ ctests alone: the Kubernetes manifests render and read into the
# client's typed models; the image, packaged from this build, runs, and so
# does `podman kube play` of the trial overlay. Both are part of `make test`.
k8s-check: build
	cd $(BUILD) && ctest -L deploy --output-on-failure

# Configures again (peers installed since the last configure are found; a
# missing one stops the configure, naming it: bench/peers.cmake).
bench:
	@scripts/install-deps.sh bench
	$(MAKE) configure
	cmake -S . -B $(BUILD) -DEPD_BUILD_BENCH=ON -DEPD_BENCH_REQUIRE_PEERS=ON
	$(MAKE) build
	scripts/bench.sh $(BUILD)

# Sanitizer builds, each in its own directory (docs/SANITIZERS.md). Not part
# of `make test`: a full instrumented build takes far longer than CI allows.
# ccache, when installed, keeps a rebuild cheap.
SAN_LAUNCHER := $(if $(shell command -v ccache),-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

# ASan + UBSan over the whole project and the whole ctest suite, the Python
# tests included (they run with LD_PRELOAD of libasan: cmake/epd_sanitizers.cmake).
asan:
	@scripts/install-deps.sh build
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE=$(PY) -DEPD_ASAN=ON \
	  $(SAN_LAUNCHER) $(CMAKE_FLAGS)
	cmake --build build-asan -j $(JOBS)
	cd build-asan && UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(JOBS)

# ThreadSanitizer over the core, media, worker, server and CLI tests (no
# torch, no Python: neither is TSan-instrumented). Debian's gRPC, protobuf
# and abseil are not instrumented either; scripts/tsan.supp says what is
# suppressed in them and why.
tsan:
	@scripts/install-deps.sh build
	cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE=$(PY) -DEPD_TSAN=ON \
	  -DEPD_WITH_TORCH=OFF -DEPD_WITH_PYTHON=OFF -DEPD_BUILD_BENCH=OFF $(SAN_LAUNCHER) $(CMAKE_FLAGS)
	cmake --build build-tsan -j $(JOBS)
	cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/scripts/tsan.supp" \
	  ctest --output-on-failure -j $(JOBS) -E '^(install_test)$$'

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

# Formats every C/C++ source with .clang-format (scripts/format.sh); `make
# test` fails on a file this would change (ctest format_check).
format:
	@scripts/install-deps.sh build
	scripts/format.sh

# clang-tidy with the checked-in .clang-tidy over the project's C++ sources,
# from the build's compile_commands.json (scripts/lint.sh).
lint: build
	scripts/lint.sh $(BUILD)

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz
