#!/usr/bin/env bash
# Stop exactly the server recorded in DIR/state.env (PID + start time + command line).
#   scripts/env-down.sh --state DIR [--json] [--by-port]
# The interpreter: the one faultnet is installed in (scripts/_python.sh says how it is found).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$root/scripts/_python.sh"
faultnet_exec "$root" scripts/env-down.sh -m harness.env down "$@"
