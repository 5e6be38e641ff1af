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

.PHONY: up test deps system-deps bench-deps clean

# Debian packages the tests drive for real: Chromium (browser tests), PostgreSQL
# (database option), iproute2 (network namespaces), curl (the %deploy notebook
# runs the curl line it prints). Installed when run as root.
system-deps:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  missing=""; \
	  for p in chromium postgresql iproute2 curl; do \
	    dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; \
	  done; \
	  if [ -n "$$missing" ]; then \
	    echo "Installing Debian packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  fi; \
	fi

# torch is pinned to 2.13.0: its CPU build lies on this kind of machine's disk.
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[torch,test]'
	# torchao 0.18 works with torch 2.13 but asks for other releases: no deps.
	$(PY) -m pip install -q --no-deps torchao==0.18.0
	touch $@

$(CHP): package.json
	npm install --no-audit --no-fund
	touch $@

deps: $(STAMP) $(CHP)

up: deps
	$(VENV)/bin/gpulab up $(if $(GPUS),--simulate-gpus $(GPUS)) $(ARGS)

test: system-deps deps
	$(PY) -m pytest $(PYTEST_ARGS)

bench-deps: deps
	$(PY) -m pip install -q -e '.[torch,test,bench]'

clean:
	rm -rf $(VENV) node_modules .gpulab
