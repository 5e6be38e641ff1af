# gpulab: `make up` starts the embedded platform, `make test` runs every test.
# Both install what they need first, on a fresh machine too.

VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
CHP     := node_modules/.bin/configurable-http-proxy
# On a machine without an NVIDIA driver, `make up` declares two GPUs (marked
# simulated everywhere); override with `make up GPUS=1xH200-141GB` or GPUS=.
GPUS    ?= $(shell command -v nvidia-smi >/dev/null 2>&1 || echo 2xA100-80GB)
ARGS    ?=
PYTEST_ARGS ?=

.PHONY: up test lint deps venv-base reach system-deps run-deps bench-deps gpu-check clean lab kube-bins test-kube

# Debian packages the tests drive for real: Chromium (browser tests; libnss3-tools
# puts gpulab's CA in its certificate store for the https test), PostgreSQL
# (database option), iproute2 (network namespaces), curl (the %deploy notebook
# runs the curl line it prints), slurm-wlm and munge (the Slurm backend's tests
# run a throwaway cluster: `gpulab slurm-sandbox`), slirp4netns (outbound network
# for a job's own network namespace), containerd + runc + containernetworking-plugins
# (the live Kubernetes cluster's node: `make test-kube`), iptables + ipset (its
# kube-proxy, and kube-router enforcing NetworkPolicies). Installed when run as root.
# `make up` installs only what a running site uses (RUN_PACKAGES: the jobs' network
# namespaces and their outbound network); `make test` all of them.
RUN_PACKAGES  := iproute2 slirp4netns
TEST_PACKAGES := chromium libnss3-tools postgresql curl slurm-wlm munge containerd runc containernetworking-plugins iptables ipset
system-deps: PACKAGES = $(RUN_PACKAGES) $(TEST_PACKAGES)
run-deps: PACKAGES = $(RUN_PACKAGES)
system-deps run-deps:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  missing=""; \
	  for p in $(PACKAGES); do \
	    dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; \
	  done; \
	  if [ -n "$$missing" ]; then \
	    echo "Installing Debian packages:$$missing"; \
	    for i in 1 2 3; do apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing && break; \
	      [ $$i = 3 ] && exit 1; sleep 10; done; \
	  fi; \
	fi

# As root, users' servers, job ranks and replicas run as their own accounts and
# must be able to run the venv's interpreter: build it on the system Python
# (/usr/bin/python3), not on one under /root (a 0700 home). A venv built on
# another interpreter is rebuilt.
BASE_PY ?= $(shell if [ "$$(id -u)" = 0 ] && [ -x /usr/bin/python3 ]; then echo /usr/bin/python3; else echo python3; fi)
BASE_HOME := $(shell dirname "$$(readlink -f "$$(command -v $(BASE_PY))")")

venv-base:
	@if [ -f $(VENV)/pyvenv.cfg ] && ! grep -qx 'home = $(BASE_HOME)' $(VENV)/pyvenv.cfg; then \
	  echo "$(VENV) was built on another Python; rebuilding it on $(BASE_PY)"; rm -rf $(VENV); \
	fi

# torch is pinned to 2.13.0: its CPU build lies on this kind of machine's disk.
# The registry's downloads can break off mid-file (CUDA wheels are 200 MB+): pip
# resumes a broken download many times, and the whole install is tried three
# times before make gives up (what pip has by then is cached).
PIP_INSTALL := $(PY) -m pip install -q --retries 10 --resume-retries 50

$(STAMP): pyproject.toml
	$(BASE_PY) -m venv $(VENV)
	for i in 1 2 3; do $(PY) -m pip install -q --retries 10 -U pip && break; [ $$i = 3 ] && exit 1; sleep 5; done
	for i in 1 2 3; do $(PIP_INSTALL) -e '.[torch,notebook,embeddings,llm,mlflow,test]' && break; \
	  [ $$i = 3 ] && exit 1; echo "pip install failed (try $$i of 3); trying again"; sleep 10; done
	# torchao 0.18 works with torch 2.13 but asks for other releases: no deps.
	for i in 1 2 3; do $(PIP_INSTALL) --no-deps torchao==0.18.0 && break; [ $$i = 3 ] && exit 1; sleep 5; done
	touch $@

$(CHP): package.json
	for i in 1 2 3; do npm install --no-audit --no-fund && break; [ $$i = 3 ] && exit 1; sleep 10; done
	touch $@

deps: venv-base $(STAMP) $(CHP) lab

# The JupyterLab extension (lab/): the TypeScript in lab/js built into the prebuilt
# labextension lab/labextension (as a wheel ships it: users build nothing), copied
# into the venv's JupyterLab, and the server extension enabled in the venv. Rebuilt
# only when lab/js changes (the stamp), so `make test` does not rebuild each time.
LAB_JS       := lab/js
LAB_NODE     := $(LAB_JS)/node_modules/.installed
LAB_BUILT    := lab/labextension/.built
LAB_SOURCES  := $(wildcard $(LAB_JS)/src/*.ts $(LAB_JS)/style/*) $(LAB_JS)/tsconfig.json
LAB_DEST     := $(VENV)/share/jupyter/labextensions/@gpulab/lab
LAB_SERVER   := $(VENV)/etc/jupyter/jupyter_server_config.d/gpulab.json

$(LAB_NODE): $(LAB_JS)/package.json
	cd $(LAB_JS) && for i in 1 2 3; do npm install --no-audit --no-fund && break; [ $$i = 3 ] && exit 1; sleep 10; done
	touch $@

# jupyter-builder (JupyterLab's build tool, in the venv) runs node from lab/js.
$(LAB_BUILT): $(LAB_NODE) $(LAB_SOURCES) | $(STAMP)
	cd $(LAB_JS) && node_modules/.bin/tsc && PATH="$(abspath $(VENV))/bin:$$PATH" jupyter-builder build .
	touch $@

# A copy, not a link: `pip install -e` writes the wheel's data files to the same place.
$(LAB_DEST)/.built: $(LAB_BUILT)
	rm -rf $(LAB_DEST) && mkdir -p $(dir $(LAB_DEST))
	cp -r lab/labextension $(LAB_DEST)

$(LAB_SERVER): lab/jupyter-config/gpulab.json | $(STAMP)
	mkdir -p $(dir $@) && cp $< $@

lab: $(LAB_DEST)/.built $(LAB_SERVER)

up: run-deps deps reach
	$(VENV)/bin/gpulab up $(if $(GPUS),--simulate-gpus $(GPUS)) $(ARGS)

# As root the tests make real per-user accounts, which must reach this checkout
# and its venv: folders above it get search permission (o+x: pass through, not
# list), as an install under /opt or /srv has anyway.
reach:
	@if [ "$$(id -u)" = 0 ]; then \
	  d="$$(pwd)"; while [ "$$d" != / ]; do \
	    if [ -z "$$(find "$$d" -maxdepth 0 -perm -o=x)" ]; then \
	      echo "Letting users' accounts pass through $$d (chmod o+x) to reach gpulab"; \
	      chmod o+x "$$d"; \
	    fi; d="$$(dirname "$$d")"; \
	  done; \
	fi

# Lint and format check (settings: pyproject.toml's [tool.ruff]); `make test` runs it first.
lint: venv-base $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

# The suite runs in TEST_WORKERS processes, a test file per process at a time (its
# module fixtures, a hub or a Slurm sandbox, start once): `make test TEST_WORKERS=0`
# runs it in one process. One worker more than cores: a fifth of the suite's time is
# waits on processes it started (servers starting, a hub's poll), which a third
# worker fills on 2 cores (2 workers: 1100 s; 3: 925 s). At most 5 (memory).
TEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n + 1 < 5 ? n + 1 : 5 )))
# The live Kubernetes cluster's suite (a real cluster the suite starts, from binaries
# kube-bins builds once) runs as a second pytest after the rest, so each prints its own
# time: the suite's pytest time outside the live cluster, then the live cluster's (its
# lines say how long the build and the cluster's start took). Both always run; `make
# test` fails if either failed (the second selecting no test, pytest's exit 5 under a
# PYTEST_ARGS -k, is no failure). GPULAB_TEST_LIVE_KUBE=0 leaves the cluster out
# (reported as skipped).
LIVE_KUBE_TESTS := tests/kube/test_live_cluster.py tests/kube/test_live_cluster_dra_netpol.py tests/kube/test_live_cluster_kueue.py
PYTEST_WORKERS   = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)
test: system-deps deps reach lint kube-bins
	@suite=0; kube=0; t0=$$(date +%s); \
	echo "== pytest: the suite outside the live Kubernetes cluster =="; \
	$(PY) -m pytest $(PYTEST_WORKERS) $(addprefix --ignore=,$(LIVE_KUBE_TESTS)) $(PYTEST_ARGS) || suite=$$?; \
	t1=$$(date +%s); \
	echo "== pytest: the live Kubernetes cluster suite (make test-kube) =="; \
	$(PY) -m pytest $(LIVE_KUBE_TESTS) -p no:cacheprovider $(PYTEST_ARGS) || kube=$$?; \
	[ $$kube = 5 ] && kube=0; \
	t2=$$(date +%s); \
	echo "pytest time: $$((t1 - t0)) s outside the live cluster (exit $$suite), $$((t2 - t1)) s the live-cluster suite (exit $$kube)"; \
	[ $$suite = 0 ] && [ $$kube = 0 ]

# The live Kubernetes cluster's binaries (kube-apiserver, -controller-manager,
# -scheduler, kubelet 1.34.4; etcd; CoreDNS; helm 4; kube-router 2.1; Kueue 0.14), built once from the Go module
# proxy into ~/.cache/gpulab-kube (GPULAB_KUBE_CACHE): 15-25 min cold on 2 cores, a
# second run does nothing. `make test-kube` runs only the live-cluster suite on them
# (docs/howto/live-kubernetes-tests.md).
kube-bins:
	nice -n 10 scripts/kube/build.sh

test-kube: system-deps deps reach kube-bins
	$(PY) -m pytest $(LIVE_KUBE_TESTS) -p no:cacheprovider $(PYTEST_ARGS)

bench-deps: deps
	$(PIP_INSTALL) -e '.[torch,notebook,embeddings,llm,mlflow,test,bench]'

# gpulab's GPU paths on a GPU machine, as one table (benchmarks/gpu_check.py), in
# under 8 minutes. Uses the venv if there is one (no install: GPU machines may be
# offline), else python3. Without an NVIDIA driver every row says so; exit 0.
gpu-check:
	timeout -k 10 470 $(if $(wildcard $(PY)),$(PY),python3) benchmarks/gpu_check.py --deadline 450

clean:
	rm -rf $(VENV) node_modules .gpulab lab/labextension lab/js/node_modules lab/js/lib
