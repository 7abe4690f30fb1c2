#!/usr/bin/env bash
# Start a fresh enclave environment; prints its state directory, and only that, on stdout
# (the rest on stderr), so `scripts/env-down.sh --state "$(scripts/env-up.sh)"` works.
#   scripts/env-up.sh [--state DIR] [--json] [--ping-interval S] [--ping-timeout S]
# The interpreter: the one faultnet is installed in (scripts/_python.sh says how it is found).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$root/scripts/_python.sh"
faultnet_exec "$root" scripts/env-up.sh -m harness.env up "$@"
