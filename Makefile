# The two commands a newcomer needs: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
export EOS_CACHE ?= $(HOME)/.cache/eos
export PIP_CACHE_DIR ?= $(EOS_CACHE)/pip
export PYTHONPATH := $(CURDIR)/stack:$(CURDIR)

.PHONY: venv stack-up stack-down stack-status image image-test test test-unit demo soak bench bench-upgrade bench-recovery bench-executors bench-fencing bench-scale crds release clean

$(VENV)/.installed: pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "Python 3.11 is required: install python3.11 (or set PYTHON=/path/to/python3.11)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed

stack-up: venv
	$(PY) -m eos_stack up

stack-down: venv
	$(PY) -m eos_stack down

stack-status: venv
	$(PY) -m eos_stack status

# The Dockerfile built for real with Debian's buildah (no Docker engine here; run as root): the tools come from
# apt-get when missing, base images that cannot be pulled get local stand-ins made from Debian packages, and the
# build takes its wheels, jars and .debs from the stack's caches (no network in its RUN steps). Storage, bases
# and the layer cache live under $(EOS_CACHE)/image. `$(PY) -m eos_stack.image status|run|podman` after it.
# Then pushed to the stack's registry (eos_stack.registry, started if it is not), where the real nodes pull it.
# EOS_IMAGE_TAG builds and pushes another name than the chart's default image.
image: venv
	$(PY) -m eos_stack.image $(if $(EOS_IMAGE_TAG),--tag $(EOS_IMAGE_TAG)) build
	$(PY) -m eos_stack.image $(if $(EOS_IMAGE_TAG),--tag $(EOS_IMAGE_TAG)) push

# The built image run with podman: its user, entry points, jars, read-only root and Spark's executor argument
# (EOS_IMAGE_TAG: that build, given to the tests as EOS_TEST_IMAGE).
image-test: image
	$(PY) -m eos_stack up
	$(if $(EOS_IMAGE_TAG),EOS_TEST_IMAGE=$(EOS_IMAGE_TAG)) $(PY) -m pytest -q --basetemp=$(EOS_STATE)/pytest-image -m image tests/stack/test_image.py

# Unit tests only: no servers (seconds).
UNIT := tests/jobs tests/operator $(wildcard tests/model) $(wildcard tests/docs)
test-unit: venv
	$(PY) -m pytest -q -m unit $(UNIT)

# Everything. The unit tests (two at a time) run while the stack, the image (`make image`: the tests marked `image`
# and `containers` run it, the latter their Pods as its containers) and the real nodes with that image are made in
# the background (the unit tests need none of them; their log is printed after the unit tests, and either failing
# stops here). Then the real-stack tiers (chaos first, the longest; then stack, chart, e2e; see tests/conftest.py),
# each with its own per-test timeout, all two at a time (pytest-xdist, work stealing): a test that kills or
# stops a broker or an S3 server has its own (tests/harness/private.py); then alone the tests marked `serial`
# (none today). Test logs (the operator's, the Pods') stay under $(EOS_STATE)/pytest* for .ci/run to show
# when something fails.
export EOS_STATE ?= $(CURDIR)/.stack
test: venv
	@mkdir -p $(EOS_STATE)/logs; prep_log=$(EOS_STATE)/logs/test-prepare.log; \
	echo "make test: the stack, the image and the real nodes are being made beside the unit tests (log: $$prep_log)"; \
	( set -e; $(PY) -m eos_stack up; $(PY) -m eos_stack.image build; $(PY) -m eos_stack up node ) > $$prep_log 2>&1 & prep=$$!; \
	$(PY) -m pytest -q -n 2 --dist load -m unit $(UNIT); unit=$$?; \
	[ $$unit -eq 0 ] || echo "make test: the unit tests failed; waiting for the stack, image and nodes to settle"; \
	wait $$prep; ready=$$?; cat $$prep_log; \
	[ $$unit -eq 0 ] || exit 1; \
	[ $$ready -eq 0 ] || { echo "make test: the stack, the image or the real nodes could not be made (log above: $$prep_log)"; exit 1; }
	$(PY) -m pytest -n 2 --dist worksteal --durations=25 --basetemp=$(EOS_STATE)/pytest -m "not unit and not soak and not serial" tests
	@# Tests marked serial (tests/conftest.py SERIAL_FILES, empty today) run alone; exit 5 is "none collected".
	$(PY) -m pytest --durations=10 --basetemp=$(EOS_STATE)/pytest-serial -m "serial and not soak" tests || [ $$? -eq 5 ]

# The chaos tests at length: 100 kills (EOS_CHAOS_RUNS) and 100 lifecycle operations through the operator
# (EOS_LIFECYCLE_OPS); `make test` runs 8 chaos runs and 15 operations.
soak: venv
	$(PY) -m eos_stack up
	EOS_CHAOS_RUNS=$${EOS_CHAOS_RUNS:-100} EOS_LIFECYCLE_OPS=$${EOS_LIFECYCLE_OPS:-100} EOS_UPGRADES=$${EOS_UPGRADES:-3} \
	  $(PY) -m pytest -s -m "not soak" tests/e2e/test_chaos.py tests/e2e/test_chaos_lifecycle.py tests/e2e/test_upgrade_e2e.py
	$(PY) -m pytest -s --basetemp=$(EOS_STATE)/pytest-soak -m soak tests

# The demo's driver Pods run on the real nodes: the stack, the image and the nodes first (as `make test` makes them).
demo: venv
	$(PY) -m eos_stack up
	$(PY) -m eos_stack.image build
	$(PY) -m eos_stack up node
	$(PY) -m examples.colors.demo

bench: venv
	$(PY) -m eos_stack up
	$(PY) benchmarks/sink_throughput.py --out benchmarks/results/$$(date -u +%F)-sink-fair.md $${BENCH_ARGS}

# Output gap of a snapshot upgrade vs a plain restart, same run (results in benchmarks/results/).
bench-upgrade: venv
	$(PY) -m eos_stack up
	$(PY) -m eos_stack.image build
	$(PY) -m eos_stack up node
	$(PY) benchmarks/upgrade_gap.py --rounds $${ROUNDS:-2}

# Recovery from a driver SIGKILL to the first new committed output, in parts (detection, restart wait, resolution,
# Pod start, Python and JVM start, first batch), through the operator; VARIANT='spark.k=v' tries a job.sparkConf
# entry in the same run (results in benchmarks/results/).
bench-recovery: venv
	$(PY) -m eos_stack up
	$(PY) -m eos_stack.image build
	$(PY) -m eos_stack up node
	PYTHONPATH=$(CURDIR)/stack:$(CURDIR):$(CURDIR)/jobs:$(CURDIR)/operator $(PY) benchmarks/recovery.py \
	  --rounds $${ROUNDS:-5} $${VARIANT:+--variant "$$VARIANT"}

# The exactly-once sink job in Spark local mode vs deployMode cluster with 2 executor Pods, same input,
# through the operator, every Pod on one of the stack's real nodes (results in benchmarks/results/).
bench-executors: venv
	$(PY) -m eos_stack up
	$(PY) -m eos_stack.image build
	$(PY) -m eos_stack up node
	$(PY) benchmarks/executors.py --repeats $${REPEATS:-3}

# Resolution of a 16-, 256- and 1,024-slot stream: fencing one id at a time vs in parallel, on the local broker
# (results in benchmarks/results/; about 15 minutes, mostly the sequential baseline waiting).
bench-fencing: venv
	$(PY) -m eos_stack up
	$(PY) benchmarks/fencing.py --repeats $${REPEATS:-3}

# The operator with 50, 200 and 500 streams (STREAMS=...), driver Pods on a KWOK node played by a simulator:
# first action, crash to restart, API requests, Kafka connections, CPU, memory, takeover (results and a plot in
# benchmarks/results/).
bench-scale: venv
	$(PY) -c 'import matplotlib' 2>/dev/null || $(PY) -m pip install -q -e '.[test,bench]'
	$(PY) -m eos_stack up
	PYTHONPATH=$(CURDIR)/stack:$(CURDIR):$(CURDIR)/jobs:$(CURDIR)/operator $(PY) benchmarks/scale.py --streams $${STREAMS:-50,200,500} --baseline-no-informers $${SCALE_ARGS}

# The CRDs (crds/ and the chart's copy) and docs/reference.md, generated from the pydantic models.
crds: venv
	$(PY) -m eos_operator.crd
	$(PY) -m eos_operator.crd --dir charts/spark-eos-operator/crds
	$(PY) -m eos_operator.crd_reference

# The release checklist as a script (docs/releasing.md): `make release VERSION=0.1.0` bumps every place that
# carries the version, regenerates, turns the changelog's Unreleased section into the release's, commits, tags
# vVERSION, packages the chart into dist/ and builds the image; it pushes nothing.
release: venv
	@[ -n "$(VERSION)" ] || { echo "make release needs VERSION=X.Y.Z (or X.Y.Z-rc.N), for example make release VERSION=0.1.0"; exit 2; }
	$(PY) -m eos_stack.release $(VERSION)

clean:
	rm -rf $(VENV) .pytest_cache
