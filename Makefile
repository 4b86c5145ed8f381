# The two commands of the README:
#   make run    installs system packages, builds, trains the quick-start model on 2 local workers
#   make test   installs system packages, builds, runs every test, the numeric tests again with
#               oneDNN and OpenBLAS held to an older instruction set (make test-isa), and the
#               unit tests under AddressSanitizer + UndefinedBehaviorSanitizer (build-san builds
#               only them: target unit_tests); then prints the ten slowest tests
#               (scripts/run-tests.sh)
BUILD     ?= build
SAN_BUILD ?= build-san
JOBS      ?= $(shell nproc)
CMAKE     ?= cmake

.PHONY: all run test test-isa deps build build-san test-san bench clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@mkdir -p $(BUILD)
	@$(CMAKE) -S . -B $(BUILD) -DFL_WERROR=ON >$(BUILD)/configure.log 2>&1 \
	    || { cat $(BUILD)/configure.log; exit 1; }
	@grep '^-- fleet:' $(BUILD)/configure.log
	@$(CMAKE) --build $(BUILD) -j $(JOBS)

run: build
	$(BUILD)/tools/fleetrun --nproc_per_node 2 --log_dir log $(BUILD)/tools/fleet-train -c configs/quickstart.yaml

# build-san is made by run-tests.sh, at low priority beside the first test passes
test: build
	@scripts/run-tests.sh $(BUILD) $(SAN_BUILD) $(JOBS) "$(MAKE) --no-print-directory build-san"

test-isa: build
	@scripts/test-isa.sh $(BUILD) -j $(JOBS)

build-san: deps
	@mkdir -p $(SAN_BUILD)
	@$(CMAKE) -S . -B $(SAN_BUILD) -DFL_WERROR=ON -DFL_SANITIZE=address,undefined \
	    >$(SAN_BUILD)/configure.log 2>&1 || { cat $(SAN_BUILD)/configure.log; exit 1; }
	@$(CMAKE) --build $(SAN_BUILD) -j $(JOBS) --target unit_tests

bench: build
	@scripts/install-deps.sh --bench
	bash bench/mlp_step.sh

clean:
	rm -rf $(BUILD) $(SAN_BUILD)
