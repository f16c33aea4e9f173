# Selkie's two commands: `make demo` and `make test`. Both set up what they need first.
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
CARGO ?= cargo
CLUSTER_DIR ?= .selkie/cluster
SELKIE_CLUSTER := target/debug/selkie-cluster

.PHONY: setup test lint unit demo cluster-up cluster-down components

## setup: install what the build and tests need (idempotent; seconds when warm)
setup:
	@bash e2e/scripts/setup.sh

## components: build the real kube-apiserver, kubectl and etcd (cached outside the repo)
components:
	@bash e2e/scripts/build-components.sh all

## lint: formatting and clippy, warnings are errors
lint: setup
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

## test: lint, then every test, against real components; ends with one "total: N passed, M failed" line
test: lint
	@mkdir -p target
	$(CARGO) test --workspace --locked 2>&1 | tee target/test-output.log
	@awk '/^test result:/ { passed += $$4; failed += $$6 } \
	  END { printf "total: %d passed, %d failed\n", passed, failed }' target/test-output.log

$(SELKIE_CLUSTER): FORCE
	@$(CARGO) build --locked -q -p selkie-e2e --bin selkie-cluster

## cluster-up: start etcd + kube-apiserver in the background; the last line is the kubeconfig path
cluster-up: setup $(SELKIE_CLUSTER)
	@$(SELKIE_CLUSTER) --dir $(CLUSTER_DIR) up

## cluster-down: stop the cluster started by cluster-up
cluster-down: $(SELKIE_CLUSTER)
	@$(SELKIE_CLUSTER) --dir $(CLUSTER_DIR) down

## demo: start the local control plane, use it with the real kubectl, stop it
demo: setup $(SELKIE_CLUSTER)
	@bash e2e/scripts/demo.sh $(SELKIE_CLUSTER) $(CLUSTER_DIR)

.PHONY: FORCE
FORCE:
