# Thin wrapper over CMake. `make demo` and `make test` do all the set-up.
BUILD   ?= build
JOBS    ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo

.PHONY: all deps build demo test test-asan bench clean

all: build

deps:
	@scripts/deps.sh

build: deps
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

demo: build
	@scripts/demo.sh $(BUILD)/host/nimbus-host

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

# Every suite again with the host and the C tests built with AddressSanitizer + UBSan
# (in their own build tree; valgrind does not mix with ASan, so that one is left out).
test-asan: deps
	@cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=Debug -DNH_ASAN=ON >/dev/null
	@cmake --build $(BUILD)-asan -j $(JOBS)
	@cd $(BUILD)-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS) --timeout 600 -E valgrind

bench: build
	@$(BUILD)/host/nimbus-host -l spec/bench/throughput.lua $(BUILD)/host/nimbus-host
	@$(BUILD)/host/nimbus-host -l spec/bench/outage.lua $(BUILD)/host/nimbus-host
	@$(BUILD)/host/nimbus-host -l spec/bench/sleepers.lua
	@$(BUILD)/host/nimbus-host -l spec/bench/http_serve.lua
	@$(BUILD)/host/nimbus-host -l spec/bench/renewals.lua $(BUILD)/host/nimbus-host
	@$(BUILD)/host/nimbus-host -l spec/bench/reload.lua $(BUILD)/host/nimbus-host
	@$(BUILD)/host/nimbus-host -l spec/bench/amqp.lua $(BUILD)/host/nimbus-host $(BUILD)/bench/nh-amqp-bench

clean:
	rm -rf $(BUILD) $(BUILD)-asan
