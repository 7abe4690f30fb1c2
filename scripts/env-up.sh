#!/usr/bin/env bash
# Start a fresh enclave environment; prints its state directory (see harness/env.py).
#   scripts/env-up.sh [--state DIR] [--json] [--ping-interval S] [--ping-timeout S]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m harness.env up "$@"
