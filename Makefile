# Thin wrapper over CMake. `make demo` and `make test` do all the set-up.
BUILD   ?= build
JOBS    ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo

.PHONY: all deps build demo test test-asan bench fuzz clean

all: build

deps:
	@scripts/deps.sh
	@scripts/npm.sh

build: deps
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

demo: build
	@scripts/demo.sh $(BUILD)/host/nimbus-host

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

# Every suite again with the host and the C tests built with AddressSanitizer + UBSan
# (in their own build tree; valgrind does not mix with ASan, so that one is left out; so are the
# functional suites' store variants, cold, late, cached and in_doubt: they run the code the plain suites
# run, and the dispatcher's own suite runs each variant under ASan as test_dispatch_*; of the broker
# beside a PostgreSQL store, the outcomes and crash suites and the two-host spec run, the rest plain only;
# the 20,000-event partitions spec too: the partitions suite runs the same code under ASan).
test-asan: deps
	@cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=Debug -DNH_ASAN=ON >/dev/null
	@cmake --build $(BUILD)-asan -j $(JOBS)
	@cd $(BUILD)-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS) --timeout 600 \
	  -E 'valgrind|functional_(cold|late|cached|in_doubt|pgstore)_|functional_pgamqp_(parking|retry|operator|handoff|request_reply|amqp|crmerp|partitions_scale)|functional_pgservicebus_sessions_scale'

# every host a bench starts serves its console on a free port (several run at once)
bench: export NIMBUS_ADMIN = 127.0.0.1:0
bench: build
	@$(BUILD)/host/nimbus-host -l spec/bench/throughput.lua $(BUILD)/host/nimbus-host
	@$(BUILD)/host/nimbus-host -l spec/bench/observability.lua $(BUILD)/host/nimbus-host
	@$(BUILD)/host/nimbus-host -l spec/bench/outage.lua $(BUILD)/host/nimbus-host
	@$(BUILD)/host/nimbus-host -l spec/bench/sleepers.lua
	@$(BUILD)/host/nimbus-host -l spec/bench/http_serve.lua
	@$(BUILD)/host/nimbus-host -l spec/bench/console.lua $(BUILD)/host/nimbus-host
	@$(BUILD)/host/nimbus-host -l spec/bench/admin_stream.lua $(BUILD)/host/nimbus-host
	@$(BUILD)/host/nimbus-host -l spec/bench/renewals.lua $(BUILD)/host/nimbus-host
	@$(BUILD)/host/nimbus-host -l spec/bench/reload.lua $(BUILD)/host/nimbus-host
	@$(BUILD)/host/nimbus-host -l spec/bench/amqp.lua $(BUILD)/host/nimbus-host $(BUILD)/bench/nh-amqp-bench
	@$(BUILD)/host/nimbus-host -l spec/bench/partitions.lua $(BUILD)/host/nimbus-host $(BUILD)/bench/nh-amqp-bench
	@$(BUILD)/host/nimbus-host -l spec/bench/store_pg.lua $(BUILD)
	@$(BUILD)/host/nimbus-host -l spec/bench/pg_host.lua $(BUILD)

# libFuzzer (clang) over host/fuzz: FUZZ_SECONDS per target (default 60); crashes are
# written under $(BUILD)-fuzz/fuzz-crashes (scripts/fuzz.sh says what to do with them).
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := fuzz_url fuzz_amqp_msg fuzz_cli_args fuzz_json_lua fuzz_http_serve
fuzz: deps
	@cmake -S . -B $(BUILD)-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNH_FUZZ=ON >/dev/null
	@cmake --build $(BUILD)-fuzz -j $(JOBS) --target $(FUZZ_TARGETS)
	@scripts/fuzz.sh $(BUILD)-fuzz $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-fuzz
