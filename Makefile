# COD: the two commands of the README, and what they need.
#   make demo   set up everything, then run the main job
#   make test   set up everything, then run every test
# Both are idempotent: Debian packages are installed only when missing, the
# virtual environment only when pyproject.toml changed.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
APT_PACKAGES := swi-prolog-nox hwloc gcc make libc6-dev
# Elastic cores (issue 16): a real PostgreSQL for its smoke test and benchmark.
APT_PACKAGES += postgresql
# libcod (clients/c): its JSON library, pkg-config for cod.pc, valgrind and clang (libFuzzer) for its tests.
APT_PACKAGES += libjansson-dev pkg-config valgrind clang libclang-rt-dev
# CSCS (clients/cscs): libnuma for partition placement.
APT_PACKAGES += libnuma-dev
# BPF process events (rm/enforce/bpf, issue 27): libbpf for their loader (the BPF side is built with clang).
APT_PACKAGES += libbpf-dev
# Names that look alike (rm/confusables.py): PyICU builds against ICU's headers with a C++ compiler.
APT_PACKAGES += libicu-dev g++
PYTEST_ARGS ?=
# setuptools says at every editable install that a folder named like a package may shadow it
# (a BuildBackendWarning of ten lines): true of any editable install, and nothing to act on here.
EDITABLE_QUIET := PYTHONWARNINGS="ignore:Editable installation"

# The NUMA guests with cgroup v2 (tests/vm/, docs/testing.md): qemu under TCG, virtme-ng's
# initramfs (busybox) and udev (its script I/O ports), depmod for the guest's modules.
VM_APT_PACKAGES := qemu-system-x86 busybox-static udev kmod
VM_TOPOLOGY ?= 2x2
# debian: Debian's 6.12 kernel image; scx: Debian's linux-source-6.12 built with sched_ext and
# BTF (kernel_patches/build_kernel.sh, cached by its inputs; the first build is the long part of a
# fresh machine's make test: kernel_patches/README.md has the figures).
VM_KERNEL ?= debian
# What building that kernel and scx_cod needs (flex/bison/bc/libelf/libssl for the kernel, xz for
# its source, dwarves' pahole for its BTF, bpftool for vmlinux.h, clang-19 for scx_cod's BPF).
SCX_APT_PACKAGES := flex bison bc libelf-dev libssl-dev zlib1g-dev xz-utils dwarves bpftool clang-19
# make vm-suites' guests, TOPOLOGY:KERNEL, one after the other: both topologies on Debian's kernel,
# and the scheduler's tests (vmrun.py's SCX_TESTS) on the sched_ext kernel, split between both.
VM_SUITES := 2x2:debian 4x2:debian 2x2:scx 4x2:scx
VM_TIMEOUT ?= 3600
VMRUN := $(PYTHON) tests/vm/vmrun.py


.PHONY: setup native bpf deps demo test bench clean cclient skb-user nri-test vm-deps scx-deps vm-prepare vm-test vm-shell vm-suites

# The SKB engine's native helpers (setup.py builds them in every install; the editable install
# here builds them in place): its seccomp filter against execve (skb/native/cod_noexec.c, preloaded
# by skb/lockdown.py) and the direct channel's frames in C (skb/native/cod_frames.c, loaded by
# skb/prolog/cod_frames.pl; SWI-Prolog's foreign headers and jansson). Both are optional to pip,
# not to make setup: a helper that did not build fails it here.
NATIVE_SRC := skb/native/cod_noexec.c skb/native/cod_frames.c
NATIVE_SO := $(NATIVE_SRC:.c=.so)
# The unprivileged user the SKB engine runs as when the daemon is root (EngineConfig.user, RM skb_user).
SKB_USER ?= cod-skb

setup: deps $(STAMP) native skb-user bpf

native: $(STAMP)
	@ls $(NATIVE_SO) >/dev/null 2>&1 || $(EDITABLE_QUIET) $(VPY) -m pip install -q --no-deps -e .
	@for so in $(NATIVE_SO); do test -f $$so || { \
	  echo "$$so was not built: see the build_ext lines of '$(VPY) -m pip install -v --no-deps -e .'"; exit 1; }; done

# The BPF process events' object and loader (rm/enforce/bpfevents.py; the RM uses the proc connector without them).
bpf:
	$(MAKE) -s -C rm/enforce/bpf

# As root: a system user with no home, no shell and no password; without it the engine runs as nobody.
skb-user:
	@if [ "$$(id -u)" -eq 0 ] && ! getent passwd $(SKB_USER) >/dev/null; then \
	  echo "creating system user $(SKB_USER) for the SKB engine"; \
	  useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
	    --user-group $(SKB_USER) || echo "could not create $(SKB_USER): the SKB engine runs as nobody"; \
	fi

deps:
	@missing=""; \
	for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" -eq 0 ]; then SUDO=""; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends $$missing; \
	fi

$(STAMP): pyproject.toml setup.py $(NATIVE_SRC)
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV) || { \
	  echo "python3 -m venv failed: installing python3-venv"; \
	  if [ "$$(id -u)" -eq 0 ]; then SUDO=""; else SUDO=sudo; fi; \
	  $$SUDO apt-get install -y -q python3-venv && $(PYTHON) -m venv $(VENV); }
	$(VPY) -m pip install -q --upgrade pip
	$(EDITABLE_QUIET) $(VPY) -m pip install -q -e '.[test]'
	@touch $@

# The SKB and Listing 3 on this machine and the paper's machines, then the whole story live:
# the RM, CSCS under COD, a CPU stressor, the upcall, the redistribution (clients/cscs/demo.py).
demo: setup
	$(VPY) clients/python/examples/demo.py
	$(VPY) clients/cscs/demo.py

# The guests' kernels (the sched_ext one built unless cached) come before the host suite, so a
# missing package or network fails make test in its first minutes, with one line saying what.
test: setup vm-deps scx-deps cclient nri-test
	$(MAKE) -C clients/cscs check
	$(MAKE) vm-prepare
	$(VPY) -m pytest -q $(PYTEST_ARGS)
	$(MAKE) vm-suites

# The guests' suites, one after the other (each a boot of its own).
vm-suites: setup vm-deps scx-deps
	@for s in $(VM_SUITES); do \
	  $(VMRUN) test --topology $${s%:*} --kernel $${s#*:} --timeout $(VM_TIMEOUT) || exit $$?; \
	done

# Debian's kernel, virtme-ng and the sched_ext kernel with scx_cod, each unless cached.
vm-prepare: setup vm-deps scx-deps
	$(VMRUN) prepare --kernel scx

vm-deps:
	@$(MAKE) -s deps APT_PACKAGES="$(VM_APT_PACKAGES)"

scx-deps:
	@$(MAKE) -s deps APT_PACKAGES="$(SCX_APT_PACKAGES)"

# One guest: make vm-test [VM_TOPOLOGY=2x2|4x2] [VM_KERNEL=debian|scx] [PYTEST_ARGS='-x tests/vm/test_topology.py']
# [VM_RW=bench/experiments/results]: a project directory the guest writes through to (tests/vm/vmrun.py --rw)
vm-test: setup vm-deps
	@if [ "$(VM_KERNEL)" = scx ]; then $(MAKE) -s scx-deps; fi
	$(VMRUN) test --topology $(VM_TOPOLOGY) --kernel $(VM_KERNEL) --timeout $(VM_TIMEOUT) $(foreach d,$(VM_RW),--rw $(d)) -- $(PYTEST_ARGS)

# A root shell in the guest (needs a terminal); exit (or Ctrl-D) powers it off.
vm-shell: setup vm-deps
	@if [ "$(VM_KERNEL)" = scx ]; then $(MAKE) -s scx-deps; fi
	$(VMRUN) shell --topology $(VM_TOPOLOGY) --kernel $(VM_KERNEL)

# The NRI plugin (clients/nri, docs/kubernetes.md): go vet and its tests against a real `cod rm`.
# Go 1.24+ is needed (containerd/nri); an older Go fetches the right toolchain itself (GOTOOLCHAIN=auto).
nri-test: setup
	@command -v go >/dev/null || $(MAKE) -s deps APT_PACKAGES=golang-go
	cd clients/nri && go vet ./... && COD_BIN=$(CURDIR)/$(VENV)/bin/cod go test -count=1 ./...

# libcod, its test programs and the Listing 1 example (tests/clients/c/test_cclient.py runs them).
cclient:
	$(MAKE) -s -C clients/c all check-progs

# The benchmarks also compare libcod's JSON library with two others (docs/cclient.md).
BENCH_APT_PACKAGES := libcjson-dev libjson-c-dev

bench: setup
	@$(MAKE) -s deps APT_PACKAGES="$(BENCH_APT_PACKAGES)"
	$(EDITABLE_QUIET) $(VPY) -m pip install -q -e '.[bench]'
	@for b in bench/*_bench.py; do echo "== $$b"; $(VPY) $$b; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis $(NATIVE_SO)
	$(MAKE) -s -C rm/enforce/bpf clean
