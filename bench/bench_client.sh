#!/usr/bin/env bash
# bench/bench_client.py on a platform of its own (bench/platform.sh: a veth
# pair between two network namespaces, the if-manager and one kp-if serving
# squeezenet, if 1, its configured SLO, in the platform namespace), the
# benchmark in the client namespace; everything torn down on exit.
#
#   bench/bench_client.sh [bench_client.py options: --concurrency 4 --rounds 5 --duration 3]
#
# Needs root, hugepages, `make build models python`. Binaries from
# ${CARGO_TARGET_DIR:-target}/release; the Python that has `kneepoint` is
# ${PYTHON:-.venv/bin/python} (e.g. a scratch venv with a wheel under test).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BENCH=bench-client BENCH_NS=kpb MODEL=squeezenet
source bench/platform.sh
ip netns exec "$CLIENT_NS" "${PYTHON:-.venv/bin/python}" bench/bench_client.py \
  --addr "$PLATFORM_IP:9000" --kp-client "$T/kp-client" "$@"
