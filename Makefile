# Selkie's two commands: `make demo` and `make test`. Both set up what they need first.
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
CARGO ?= cargo
CLUSTER_DIR ?= .selkie/cluster
SELKIE_CLUSTER := target/debug/selkie-cluster
FUZZ_SECONDS ?= 20
# make's builds are one-shot (CI on a fresh machine): cargo's incremental caches would about
# double the size of target/ on a disk whose free space is not ours to choose, for no gain there.
# A developer iterating keeps them with `CARGO_INCREMENTAL=1 make test`.
export CARGO_INCREMENTAL ?= 0

.PHONY: setup test lint unit demo cluster-up cluster-down components fuzz crds manifests

## setup: install what the build and tests need (idempotent; seconds when warm)
setup:
	@bash e2e/scripts/setup.sh

## components: build the real kube-apiserver, kubectl and etcd (cached outside the repo)
components:
	@bash e2e/scripts/build-components.sh all

## lint: formatting and clippy, warnings are errors
lint: setup
	$(CARGO) fmt --all -- --check
	rustfmt --check fuzz/src/lib.rs fuzz/fuzz_targets/*.rs
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

## test: lint, then every test, against real components, then the fuzz targets; ends with one
## "total: N passed, M failed" line (of the cargo tests). The release binaries the node tests'
## images carry are built first, rather than inside those tests while every other test competes
## for the cores. The fuzz targets are built meanwhile at the lowest priority (log:
## target/fuzz-build.log), on what the tests leave of the cores (they wait on components much of
## the time), and run after. Tests run TEST_THREADS (4) at a time: most of an end-to-end test's
## time is spent waiting for the components it drives. When a test fails, the run stops after the
## cargo tests and ends with what the failed tests said (e2e/scripts/test-failures.sh).
TEST_THREADS ?= 4
test: lint
	@mkdir -p target
	$(CARGO) build --release --locked -q -p selkie-concierge -p selkie-supervisor
	@setsid nice -n 19 bash e2e/scripts/fuzz.sh --build-only >target/fuzz-build.log 2>&1 & fuzz_build=$$!; \
	trap 'kill -- -$$fuzz_build 2>/dev/null || true' EXIT; \
	set -x; \
	tests=0; \
	$(CARGO) test --workspace --locked --no-fail-fast -- --test-threads=$(TEST_THREADS) 2>&1 | tee target/test-output.log || tests=$$?; \
	if (( tests )); then { set +x; } 2>/dev/null; bash e2e/scripts/test-failures.sh target/test-output.log; exit "$$tests"; fi; \
	bash perf/run --smoke; \
	bash perf/run-streams --smoke; \
	bash perf/soak --smoke; \
	bash perf/scale --smoke; \
	{ set +x; } 2>/dev/null; \
	wait $$fuzz_build || echo "building the fuzz targets in the background failed (target/fuzz-build.log); building again"; \
	bash e2e/scripts/fuzz.sh $(FUZZ_SECONDS)
	@awk '/^test result:/ { passed += $$4; failed += $$6 } \
	  END { printf "total: %d passed, %d failed\n", passed, failed }' target/test-output.log

## fuzz: build the fuzz targets (fuzz/) and run each for FUZZ_SECONDS (20); fails on any crash
fuzz: setup
	@bash e2e/scripts/fuzz.sh $(FUZZ_SECONDS)

## crds: regenerate conf/crds/ from the selkie-api types (a unit test fails when they drift)
crds:
	$(CARGO) run --locked -q -p selkie-api --example crdgen

## manifests: render conf/install/concierge.yaml and supervisor.yaml from the Helm chart
## conf/helm/selkie with its default values, and copy conf/crds/ into the chart's crds/ (the e2e
## test helm_chart fails when they drift)
manifests:
	@helm="$$(bash e2e/scripts/build-components.sh helm | sed -n 's/^helm=//p')/helm"; \
	rm -f conf/helm/selkie/crds/*.yaml; \
	cp conf/crds/*.yaml conf/helm/selkie/crds/; \
	for component in concierge supervisor; do \
	  other=supervisor; [[ $$component == concierge ]] || other=concierge; \
	  { printf '%s\n' \
	      "# Generated from the Helm chart conf/helm/selkie by \`make manifests\` (helm template with" \
	      "# the default values, $$other.enabled=false); do not edit: change the chart, run" \
	      "# \`make manifests\` and commit both. The e2e test helm_chart fails when they differ." \
	      "#" \
	      "#   kubectl apply --server-side -f conf/crds/" \
	      "#   kubectl apply -f conf/install/$$component.yaml"; \
	    "$$helm" template selkie conf/helm/selkie --set "$$other.enabled=false"; \
	  } >"conf/install/$$component.yaml.tmp"; \
	  mv "conf/install/$$component.yaml.tmp" "conf/install/$$component.yaml"; \
	  echo "wrote conf/install/$$component.yaml"; \
	done

$(SELKIE_CLUSTER): FORCE
	@$(CARGO) build --locked -q -p selkie-e2e --bin selkie-cluster

## cluster-up: start etcd + kube-apiserver in the background; the last line is the kubeconfig path.
## `make cluster-up NODE=1` also joins a real node (containerd, kubelet, kube-proxy, scheduler,
## controller manager, CoreDNS; needs root, one per machine) and prints its address
cluster-up: setup $(SELKIE_CLUSTER)
	@$(SELKIE_CLUSTER) --dir $(CLUSTER_DIR) up $(if $(filter-out 0,$(NODE)),--node)

## cluster-down: stop the cluster started by cluster-up (with its node and the node's pods)
cluster-down: $(SELKIE_CLUSTER)
	@$(SELKIE_CLUSTER) --dir $(CLUSTER_DIR) down

## demo: the full integration on real components — Dex, the Supervisor and the Concierge from
## conf/, selkie get kubeconfig, a login (browser with a display, else the password flow),
## kubectl through the proxy; then stop. `make demo KEEP=1` leaves it running until Ctrl-C.
## `make demo NODE=1` runs Selkie as pods instead: a real node (as root), the images built from
## the Containerfile, `helm install` of conf/helm/selkie, the same login and kubectl.
demo: setup
	@$(CARGO) build --locked -q -p selkie-e2e --bin selkie-demo -p selkie-concierge -p selkie-supervisor -p selkie
	@if [[ '$(NODE)' != '' && '$(NODE)' != 0 ]]; then \
	  echo "building the images' release binaries (minutes the first time)"; \
	  $(CARGO) build --release --locked -q -p selkie-concierge -p selkie-supervisor; \
	fi
	@KEEP='$(KEEP)' NODE='$(NODE)' bash e2e/scripts/demo.sh target/debug/selkie-demo

.PHONY: FORCE
FORCE:
