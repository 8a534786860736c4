#!/usr/bin/env bash
# Installs everything the tests need, then runs the whole suite (this is what CI runs).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo/device_scripts/setup_host.sh" --test
cd "$repo"
# the collector reuses the harness builds the tests make (int8 and optional ISA variants off: faster)
export LAYERDIFF_HARNESS_TEST_BUILD=1
python3 -m pytest -q -p no:cacheprovider tests "$@"
