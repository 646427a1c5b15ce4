# The two commands of the README: `make demo` and `make test`. Every target bootstraps what it needs:
# the virtualenv (.venv, from the pinned requirements.txt), Debian packages it lacks, the local services
# (.local/env holds their resolved settings) and the schema.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
ROOT := $(CURDIR)
VENV := $(ROOT)/.venv
PY := $(VENV)/bin/python
PYTHON ?= python3
LOCAL := $(ROOT)/.local
# Settings for every command: the services' env file, the venv first on PATH (spark-submit finds
# SPARK_HOME through it), Airflow's home under .local and this repo's airflow.cfg.
WITH_ENV := set -a && . $(LOCAL)/env && set +a && export PATH="$(VENV)/bin:$$PATH" SPARK_LOCAL_IP=127.0.0.1 \
	AIRFLOW_HOME="$(LOCAL)/airflow" AIRFLOW_CONFIG="$(ROOT)/airflow.cfg" TIERING_REPO="$(ROOT)" PYSPARK_PYTHON="$(PY)"
PYTEST_ARGS ?=
# the suite's workers (pytest-xdist, a module on one worker): most tests wait on subprocesses, JVMs and
# servers (two workers kept two cores 63 % busy), so three share two cores: 19 min 28 s against 21 min 02 s
# for two (docs/performance.md). Modules go out in collection order (--no-loadscope-reorder: the cluster,
# DAG and end-to-end tiers first, few slow tests each); xdist's default sends the modules with the most tests
# first, which left the slowest for last, on one worker while the other idled. Modules sharing a costly session
# fixture (the Spark cluster, the PostgreSQL-backed Airflow home) go out as one unit: tests/conftest.py
TEST_WORKERS ?= 3

.PHONY: demo test test-unit lint services schema up stop bench venv sysdeps clean dist

venv: $(VENV)/.installed
$(VENV)/.installed: requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "venv: installing pinned requirements (first time: a few minutes)"
	@$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	@$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	@touch $@

sysdeps:
	@bash .ci/sysdeps.sh

services: venv sysdeps
	@bash .ci/services.sh

schema: services
	@$(WITH_ENV) && tiering db upgrade

# The package as a py_files archive: how the jobs reach executors on a cluster.
dist: build/tiering.zip
build/tiering.zip: $(shell find tiering -name '*.py' -o -name '*.proto' 2>/dev/null) | venv
	@mkdir -p build
	@$(PY) -c 'import pathlib, zipfile; z = zipfile.ZipFile("$@", "w", zipfile.ZIP_DEFLATED); \
	[z.write(p) for p in sorted(pathlib.Path("tiering").rglob("*")) if p.suffix in (".py", ".proto")]'

test: lint schema dist
	@$(WITH_ENV) && $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS) \
		$(if $(findstring tests/,$(PYTEST_ARGS)),,tests)

# The pure tier alone: no services, no schema (about 20 s).
test-unit: venv
	@$(PY) -m pytest -q $(PYTEST_ARGS) tests/unit

# The layering contracts of .importlinter (DESIGN section 2): one direction of imports, pure format/policy.
lint: venv
	@out="$$($(VENV)/bin/lint-imports --no-cache --config .importlinter 2>&1)" || { echo "$$out"; exit 1; }; \
		echo "$$out" | grep -E 'KEPT|Contracts:'

demo: schema dist
	@$(WITH_ENV) && bash .ci/demo.sh

up: schema dist
	@$(WITH_ENV) && bash .ci/airflow_up.sh

bench: schema dist
	@$(WITH_ENV) && $(PY) bench/bench_metadata.py && $(PY) bench/bench_tier2.py $(BENCH_ARGS) \
		&& $(PY) bench/bench_pipeline.py $(BENCH_ARGS) && $(PY) bench/bench_statements.py \
		&& $(PY) bench/bench_idle_dag.py && $(PY) bench/bench_scale.py $(BENCH_ARGS) \
		&& $(PY) bench/bench_spark_source.py && $(PY) bench/bench_throttle.py \
		&& $(PY) bench/bench_tables.py && $(PY) bench/bench_series.py && $(PY) bench/bench_offload_timeline.py

stop:
	@bash .ci/stop.sh

# stop, drop the Airflow metastore this checkout created (its key goes with .local), delete .local
clean:
	@TIERING_LOCAL="$(LOCAL)" bash .ci/clean.sh
	rm -rf build dist
