#!/usr/bin/env bash
# Stop exactly the server recorded in DIR/state.env (PID + start time + command line).
#   scripts/env-down.sh --state DIR [--json] [--by-port]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m harness.env down "$@"
