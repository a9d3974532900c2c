# Statewright: `make run` starts the agent's main job, `make test` runs every check.
# Both do all set-up on a fresh machine (Debian packages when root, a .venv with pinned deps).

VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
APT_PKGS := clang llvm gcc libbpf-dev bpftool iproute2 containernetworking-plugins etcd-server
BPF_OBJ  := build/sock_lb.o
BTF_OBJ  := build/maps.o
LXC_OBJ  := build/lxc.o
NODEPORT_OBJ := build/nodeport.o
MULTIARCH ?= $(shell python3 -c 'import sysconfig; print(sysconfig.get_config_var("MULTIARCH") or "")' 2>/dev/null)

.PHONY: setup system-deps bytecode native test lint pytest run bench conformance docs clean

setup: system-deps $(STAMP) $(BPF_OBJ) $(BTF_OBJ) $(LXC_OBJ) $(NODEPORT_OBJ) bytecode native

# The project's modules compiled to __pycache__ (only those changed since the last run).
# Python reads these even where PYTHONDONTWRITEBYTECODE is set (it then never writes
# them itself): without them every process the tests start (agents, CLI, CNI plugin)
# compiles the ~190 modules of its own it imports from source, about 0.4 s of CPU per agent start.
PY_PACKAGES := statedb reconciler tables bpf bpfops sources statewright policy tests benchmarks examples
bytecode: $(STAMP)
	@$(PY) -m compileall -q -j 0 $(PY_PACKAGES) >/dev/null

# The Kubernetes converter compiled with mypyc into build/native (sources/native_build.py):
# rebuilt only when a file it was compiled from changed (about 35 s of gcc); without mypyc
# or a C compiler it says why and the converter runs from its source. The agent imports the
# build only while it matches the sources (sources/native.py); STATEWRIGHT_PURE_PYTHON=1
# skips it here and there. The same step builds statedb's row builder (statedb/_rowbuild.c,
# a few seconds; statedb/rowbuild.py imports it only while built from that source).
native: $(STAMP)
	@$(PY) -m sources.native_build

# The socket load balancer (bpf/sock_lb.c); without clang the datapath tests skip.
$(BPF_OBJ): bpf/sock_lb.c $(wildcard bpf/include/*.h) | system-deps
	@mkdir -p $(dir $@)
	@if command -v clang >/dev/null; then \
	  clang -O2 -g -Wall -target bpf $(if $(MULTIARCH),-I/usr/include/$(MULTIARCH)) -c $< -o $@ && echo "setup: built $@"; \
	else echo "setup: clang not installed, $@ not built (datapath tests will skip)"; fi

# The per-endpoint tc programs (bpf/lxc.c); without clang the endpoint datapath stays off.
$(LXC_OBJ): bpf/lxc.c $(wildcard bpf/include/*.h) | system-deps
	@mkdir -p $(dir $@)
	@if command -v clang >/dev/null; then \
	  clang -O2 -g -Wall -target bpf $(if $(MULTIARCH),-I/usr/include/$(MULTIARCH)) -c $< -o $@ && echo "setup: built $@"; \
	else echo "setup: clang not installed, $@ not built (endpoint datapath tests will skip)"; fi

# The north-south tc programs (bpf/nodeport.c); without clang NodePort from outside stays off.
$(NODEPORT_OBJ): bpf/nodeport.c $(wildcard bpf/include/*.h) | system-deps
	@mkdir -p $(dir $@)
	@if command -v clang >/dev/null; then \
	  clang -O2 -g -Wall -target bpf $(if $(MULTIARCH),-I/usr/include/$(MULTIARCH)) -c $< -o $@ && echo "setup: built $@"; \
	else echo "setup: clang not installed, $@ not built (north-south services stay off)"; fi

# Every map's key/value types as BTF (bpf/maps.c declares the maps; bpf/btf.py reads the BTF
# when it creates maps); without clang maps are created without BTF (bpftool dumps hex).
$(BTF_OBJ): bpf/maps.c $(wildcard bpf/include/*.h) | system-deps
	@mkdir -p $(dir $@)
	@if command -v clang >/dev/null; then \
	  clang -O2 -g -Wall -target bpf $(if $(MULTIARCH),-I/usr/include/$(MULTIARCH)) -c $< -o $@ && echo "setup: built $@"; \
	else echo "setup: clang not installed, $@ not built (maps get no BTF)"; fi

# Debian packages for the BPF toolchain and network tests; installed only when root and missing.
system-deps:
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "setup: installing Debian packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "setup: not root, cannot install Debian packages:$$missing (kernel tests will skip)"; fi; \
	fi
	@if [ "$$(id -u)" = 0 ] && [ -d /sys/fs/bpf ] && ! mountpoint -q /sys/fs/bpf; then \
	  mount -t bpf bpf /sys/fs/bpf && echo "setup: mounted bpffs on /sys/fs/bpf"; fi

$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[agent,test]'
	touch $@

lint: setup
	$(PY) -m ruff check .
	$(PY) -m mypy

# The whole suite runs with the compiled converter where it is built; the converter's and
# its callers' tests run again on its source (STATEWRIGHT_PURE_PYTHON=1, about a minute),
# and so do the row builders' (statedb's rows built in Python).
PURE_TESTS := tests/sources tests/test_sync_phases.py tests/statedb/test_rows.py \
	tests/statedb/test_rowbuild.py tests/tables/test_addrs_of_keys.py
pytest: setup
	$(PY) -m pytest -q --durations=15
	STATEWRIGHT_PURE_PYTHON=1 $(PY) -m pytest -q --durations=5 $(PURE_TESTS)

test: lint pytest

# The agent in the foreground on examples/manifests (kernel maps + datapath on its own cgroup
# when the machine allows, memory maps otherwise); Ctrl-C stops it. See README "Running the agent".
# `make run ARGS="--pin-dir ... --state-dir ..."` passes further flags to the agent.
run: setup
	$(PY) -m statewright agent --demo --status-line $$([ "$$(id -u)" = 0 ] || echo --api-socket=$${XDG_RUNTIME_DIR:-/tmp}/statewright-agent.sock) $(ARGS)

# Cilium's LB script-test corpus: `make conformance [CORPUS=DIR] [BACKEND=memory|kernel|both]
# [JSON=results.json]`; ends with `conformance: N passed, M failed`.
conformance: setup
	$(PY) -m tests.conformance $(if $(CORPUS),--corpus $(CORPUS)) $(if $(BACKEND),--backend $(BACKEND)) $(if $(JSON),--json $(JSON))

# The API reference of the library packages, generated from the docstrings into build/api
# (tests/test_api_docs.py builds the same modules, failing on any pdoc warning).
API_MODULES := statedb statedb.show statedb.gc_tuning reconciler reconciler.testing reconciler.testing.machine
docs: setup
	$(PY) -W error -m pdoc $(API_MODULES) -o build/api
	@echo "docs: open build/api/index.html"

bench: setup
	$(PY) benchmarks/statedb.py --quick

clean:
	rm -rf $(VENV) build *.egg-info
