# The vLLM weight-loader patch series: see README.md for each target.
# Every target runs the Python tooling in scripts/seriestool from .venv
# (check-manifest and restore run with the system python3 alone).

VENV ?= .venv
PY := $(VENV)/bin/python
SERIES := PYTHONPATH=scripts $(PY) -m seriestool
VLLM ?=
BRANCH ?=
BASE ?=
CONSOLIDATED ?=
TO ?=
FROM ?=
DRAFT ?=
PATCHES ?=
CONTINUE ?=
ABORT ?=
KEEP ?=
NOTEST ?=
JSON ?=
FORCE ?=
GROUP ?=
SIGNOFF ?=
DELETE ?=
WHEEL ?=
# The pinned base's version, as patches/series.json records it (a rebase changes it).
BASE_VERSION := $(shell python3 -c 'import json; print(json.load(open("patches/series.json"))["base"]["version"])' 2>/dev/null)
# Extra options passed through, e.g. ARGS='--accept 0002 --reason "test moved"'
ARGS ?=

# `$(call opt,--vllm,VLLM)`: the option with the variable's value, taken from
# the environment make gives the recipe, so a path with spaces stays one word.
opt = $(if $($(2)),$(1) "$$$(2)")
# Targets that read no series folder refuse PATCHES= rather than ignore it.
no_patches = $(if $(PATCHES),$(error PATCHES= does not apply to `make $@`: $(1)))

.PHONY: help venv base apply status remove export check-manifest check rebase compare restore \
	test smoke test-tooling test-series lint device-bundle pr test-rebase-e2e wheel

# The first target: a bare `make` lists the targets (README.md: "Make targets").
help:
	@echo "make wheel [WHEEL=<released>]     a patched vLLM wheel in work/wheel/, from the released one"
	@echo "make apply [VLLM=<checkout>]      materialise vLLM v$(BASE_VERSION) (or use VLLM=) and apply the series"
	@echo "make status [VLLM=<checkout>]     which series version a checkout carries, on which base"
	@echo "make remove [VLLM=<checkout>]     take the series out: back to where apply started (DELETE=1: drop its branch)"
	@echo "make smoke                        one fast test per patch, on CPU (about a minute)"
	@echo "make test                         everything CI runs: check-manifest, lint, test-tooling, test-series"
	@echo "make test-tooling                 the tooling tests"
	@echo "make test-series                  every series prefix applies and passes its tests; ruff on the touched files"
	@echo "make export [BRANCH=] [BASE=]     write a checkout's series branch back into patches/"
	@echo "make check-manifest               patch files and patches/series.json agree"
	@echo "make check [CONSOLIDATED=<ref>]   audit a consolidated branch against the series"
	@echo "make pr GROUP=<name> [SIGNOFF=1]  a pull-request group as a branch, with its description"
	@echo "make rebase TO=<version|commit>   carry the series to another vLLM release or commit"
	@echo "make compare FROM=<version>       range-diff two series versions, draft their changelog"
	@echo "make restore [VLLM=<checkout>]    put back a checkout an interrupted apply or remove left part-way"
	@echo "make base                         materialise the pinned base (cached) and print its commit"
	@echo "make venv                         create or update .venv"
	@echo "make device-bundle                pack what the GPU machine needs into .device/"
	@echo "make lint                         ruff on the tooling"
	@echo "make test-rebase-e2e              rebase onto vLLM 0.32.0 through real conflicts, then check and apply (minutes)"

venv:
	@python3 scripts/bootstrap_venv.py

base: venv
	$(call no_patches,it materialises the base patches/series.json pins)
	$(SERIES) base

apply: venv
	$(SERIES) apply $(call opt,--vllm,VLLM) $(call opt,--patches-dir,PATCHES)

# Read or switch the checkout with git alone: no .venv needed.
status:
	@PYTHONPATH=scripts python3 -m seriestool status $(call opt,--vllm,VLLM) $(call opt,--patches-dir,PATCHES)

remove:
	@PYTHONPATH=scripts python3 -m seriestool remove $(call opt,--vllm,VLLM) $(if $(DELETE),--delete-branch) \
		$(call opt,--patches-dir,PATCHES)

export: venv
	$(SERIES) export $(call opt,--vllm,VLLM) $(call opt,--branch,BRANCH) $(call opt,--base,BASE) \
		$(call opt,--patches-dir,PATCHES)

check-manifest:
	@PYTHONPATH=scripts python3 -m seriestool check-manifest $(call opt,--patches-dir,PATCHES) \
		$(if $(PATCHES),--manifest "$$PATCHES/series.json")

# Silent recipe: with JSON=1, stdout is the report alone.
check: venv
	@$(SERIES) check $(call opt,--consolidated,CONSOLIDATED) $(call opt,--vllm,VLLM) \
		$(call opt,--base,BASE) $(call opt,--patches-dir,PATCHES) $(if $(JSON),--json) $(ARGS)

# ABORT=1 needs nothing installed: it only puts things back.
rebase: $(if $(ABORT),,venv)
	$(SERIES) rebase $(call opt,--to,TO) $(call opt,--vllm,VLLM) $(call opt,--patches-dir,PATCHES) \
		$(if $(CONTINUE),--continue) $(if $(ABORT),--abort) $(if $(KEEP),--keep-conflict) \
		$(if $(NOTEST),--skip-tests) $(if $(FORCE),--force) $(ARGS)

# Silent recipe: with JSON=1, stdout is the report alone.  No `make venv`: with
# each version's base cached under work/base (or in VLLM=) compare only reads
# git objects, so it runs with .venv's Python if there is one, else python3,
# and never reaches PyPI; a base not cached yet is fetched with .venv's pip.
compare:
	$(call no_patches,it compares versions of patches/ in this repository's history)
	@PYTHONPATH=scripts $(if $(wildcard $(PY)),$(PY),python3) -m seriestool compare \
		$(call opt,--from,FROM) $(call opt,--to,TO) $(call opt,--vllm,VLLM) \
		$(call opt,--draft,DRAFT) $(if $(JSON),--json) $(ARGS)

# Undo what an interrupted `make apply` left in VLLM= (it prints this command).
# FORCE=1: also when the checkout changed since in ways apply could not have made.
restore:
	$(call no_patches,it restores VLLM= from its own journal)
	@PYTHONPATH=scripts python3 -m seriestool restore $(call opt,--vllm,VLLM) $(if $(FORCE),--force)

test: venv check-manifest lint test-tooling test-series

smoke: venv
	$(call no_patches,it tests patches/)
	$(SERIES) smoke

test-tooling: venv
	$(PY) -m pytest tests/tooling

test-series: venv
	$(call no_patches,it tests patches/)
	$(SERIES) test-series

# A real rebase onto TO= (default 0.32.0; pip fetches its sdist once) in a clone
# of this repository, conflicts resolved by script, then check-manifest, apply
# and the whole series' tests on the new base.  Not part of `make test`.
test-rebase-e2e: venv
	$(PY) scripts/rebase_e2e.py $(or $(TO),0.32.0) $(ARGS)

lint: venv
	$(PY) -m ruff check scripts tests
	$(PY) -m ruff format --check scripts tests

# A pull-request group as branch pr/<GROUP> in VLLM= (default work/vllm), and
# its description under work/pr/; SIGNOFF=1 re-signs the commits as you.
pr: venv
	$(call no_patches,it exports a group of patches/)
	$(SERIES) pr --group "$$GROUP" $(call opt,--vllm,VLLM) $(if $(SIGNOFF),--signoff)

# The released wheel of the pinned version is fetched once into work/wheel-cache.
wheel: venv
	$(call no_patches,it builds from patches/)
	$(SERIES) wheel $(call opt,--wheel,WHEEL)

device-bundle: venv
	$(call no_patches,it bundles patches/)
	$(SERIES) device-bundle
