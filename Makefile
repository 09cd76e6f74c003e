# gpuhook: `make demo` shows what gpuhook does on this machine, `make test` runs the suite.
# Both set up what they need (Debian/Ubuntu packages when root, a venv in .venv).

# The venv's interpreter starts on every GPU container create: prefer the distribution's
# Python (>= 3.11), which starts faster than a pyenv build on the same node.
PYTHON ?= $(shell for p in /usr/bin/python3 python3; do $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && { echo $$p; break; }; done)
VENV   ?= .venv
BIN    := $(VENV)/bin
APT_PACKAGES := runc crun containerd podman docker.io docker-compose busybox-static gcc libc6-dev libc-bin python3-venv debootstrap iproute2 openssl libseccomp-dev
STAMP  := $(VENV)/.installed

.PHONY: demo test test-other-release deps venv lint bench image clean mutation nri-proto dra-proto front-header cluster-demo

# System packages the end-to-end tests and the demo use; only as root, only what is missing.
deps:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  if [ -n "$$missing" ]; then echo "installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi; \
	else echo "not root or no apt-get: system packages not installed; end-to-end tests will be skipped"; fi

HOOK  := gpuhook/hook/gpuhook-hook
FRONT := gpuhook/runtime/gpuhook-runtime

# The hook helper and the runtime's front in the source tree too (as setup.py builds them):
# the tests import gpuhook from here.
$(HOOK): gpuhook/hook/gpuhook-hook.c gpuhook/hook/gpuhook-hook.h gpuhook/runtime/logline.h gpuhook/hook/build.sh
	@sh gpuhook/hook/build.sh $@ $<
$(FRONT): gpuhook/runtime/gpuhook-runtime.c gpuhook/runtime/gpuhook-runtime.h gpuhook/runtime/logline.h gpuhook/hook/build.sh
	@sh gpuhook/hook/build.sh $@ $<

$(STAMP): pyproject.toml setup.py $(HOOK) $(FRONT) $(shell find gpuhook -type f -not -name '*.pyc' 2>/dev/null)
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	@$(BIN)/pip install -q --upgrade pip >/dev/null 2>&1 || true
	@$(BIN)/pip install -q '.[test]'
	@touch $@

venv: $(HOOK) $(FRONT) $(STAMP)

demo: deps venv
	@$(BIN)/python tests/demo.py

# The seed's outage on a real Kubernetes cluster on this machine (root): a control plane and
# three nodes (8 NVIDIA GPUs, AMD GPUs, none), each in namespaces of its own, gpuhook installed
# by `kubectl apply -k daemonset/`, then the GPU nodes fail one after the other; it prints a
# timeline (tests/cluster/cluster_demo.py). The first run builds Kubernetes from the Go module proxy
# (cached in /var/cache/gpuhook-test; later runs reuse it).
cluster-demo: deps venv
	@$(BIN)/python tests/cluster/cluster_demo.py

# The habits of the field first (lint, format, types over gpuhook/), then the suite. As root
# the end-to-end tests (real runc, containerd, podman, dockerd) must run, not skip.
test: deps venv lint
	@GPUHOOK_REQUIRE_E2E=$$([ "$$(id -u)" = 0 ] && echo 1 || echo 0) $(BIN)/python -m pytest -q tests

# The suite as CI runs it (CI=true bash .ci/run) in the other Debian release (12 <-> 13, or
# RELEASE=<codename>): a debootstrapped root cached in /var/cache/gpuhook-test (tests/debroot.py).
test-other-release:
	@APT_PACKAGES="$(APT_PACKAGES)" $(PYTHON) tests/debroot.py suite

# The DaemonSet's image (daemonset/), with no registry: FROM scratch, the host bundle built
# here from the venv (packaging/build-image.sh); tagged as daemonset/kustomization.yaml names it.
image: venv
	@PYTHON=$(BIN)/python packaging/build-image.sh

# the front's tables (gpuhook/runtime/gpuhook-runtime.h, checked in) from the Python that defines
# them (tests/unit/test_front.py holds it current)
front-header: venv
	$(BIN)/python -m gpuhook.runtime.gen_header

# gpuhook/nri/*_pb2.py from the .proto files beside them (tests/unit/test_nri.py holds them current)
nri-proto: venv
	$(BIN)/python -m gpuhook.nri.regen

# gpuhook/dra/*_pb2*.py from the kubelet's .proto files beside them (tests/unit/test_dra_proto.py holds them current)
dra-proto: venv
	$(BIN)/python -m gpuhook.dra.regen

lint: venv
	@$(BIN)/ruff check gpuhook
	@$(BIN)/ruff format --check gpuhook
	@$(BIN)/mypy

# Mutation testing of the pipeline's core ([tool.mutmut] in pyproject.toml): fails under 90%
# killed, the mutants tests/mutants-equivalent.txt lists left out (tests/mutation_score.py).
# Incremental: mutants/ keeps each mutant's result and a run tests only the new or changed
# functions' mutants, then once more the survivors (the tests may have changed since).
# MUTANTS="gpuhook.spec*" narrows it to one module; MUTATION_SAMPLE=5 checks a fifth of every
# function's mutants, the same fifth every run (MUTATION_SEED picks another), and says how far
# the whole score may be from the sample's (.ci/run runs that; all of them: 30+ min on 2 cores).
MUTATION_JOBS ?= 2
MUTATION_SAMPLE ?=
MUTATION_SEED ?=
MUTANTS ?= $(if $(MUTATION_SAMPLE),$(shell $(PYTHON) tests/mutation_score.py --sample $(MUTATION_SAMPLE) $(MUTATION_SEED)))
mutation: venv
	@[ -f tests/mutants-equivalent.txt ]
	@echo "mutmut over $(or $(MUTANTS),every mutant) (log: mutants.log)"
	@set -f; $(BIN)/mutmut run --max-children $(MUTATION_JOBS) $(MUTANTS) >mutants.log 2>&1 || { tail -40 mutants.log; exit 1; }
	@again=$$(MUTANTS='$(MUTANTS)' $(BIN)/python tests/mutation_score.py --survivors); \
	  if [ -n "$$again" ] && [ -z '$(MUTANTS)' ]; then \
	    $(BIN)/mutmut run --max-children $(MUTATION_JOBS) $$again >>mutants.log 2>&1 || { tail -40 mutants.log; exit 1; }; fi
	@MUTANTS='$(MUTANTS)' MUTATION_SAMPLE='$(MUTATION_SAMPLE)' $(BIN)/python tests/mutation_score.py

# NVIDIA's runtime beside gpuhook when its binaries are at hand (../shared/peer, or PEER_DIR)
PEER_DIR ?= $(wildcard ../shared/peer/nvidia-container-toolkit)
bench: deps venv
	@PEER_DIR=$(PEER_DIR) $(BIN)/python tests/perf/bench.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis mutants mutants.log
