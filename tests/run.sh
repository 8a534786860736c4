#!/usr/bin/env bash
# Installs everything the tests need, then runs the whole suite (this is what CI runs).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo/device_scripts/setup_host.sh" --test
cd "$repo"
python3 -m pytest -q -p no:cacheprovider tests "$@"
