# Shared by scripts/test.sh and scripts/demo.sh (sourced, not run): apt helpers, the project's
# virtualenv and the editable install. Expects ROOT, VENV, PYTHON and LOG_TAG to be set; sets VPY.

log() { printf '[%s] %s\n' "$LOG_TAG" "$*" >&2; }

# --- privileged helpers -------------------------------------------------------------------------
# apt is only used when running as root (or with password-less sudo), and never with DELAYQ_NO_APT=1.
can_apt() {
    [[ "${DELAYQ_NO_APT:-0}" != 1 ]] || return 1
    command -v apt-get >/dev/null 2>&1 || return 1
    [[ "$(id -u)" == 0 ]] && return 0
    command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1
}
as_root() {
    if [[ "$(id -u)" == 0 ]]; then "$@"; else sudo -n "$@"; fi
}
APT_UPDATED=0
apt_install() {
    if [[ "$APT_UPDATED" == 0 ]]; then
        log "apt-get update"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        APT_UPDATED=1
    fi
    log "apt-get install $*"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

# --- virtualenv ----------------------------------------------------------------------------------
ensure_venv() {
    if ! command -v "$PYTHON" >/dev/null 2>&1; then
        log "error: $PYTHON not found; install Python >= 3.10"
        exit 1
    fi
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
            if can_apt; then
                local pyver
                pyver="$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
                apt_install python3-venv || apt_install "python${pyver}-venv"
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
}

# --- install the project (only when pyproject.toml changed) --------------------------------------
# install_project EXTRAS: pip install -e ".[EXTRAS]" (or -e . when EXTRAS is empty), unless the
# stamp of that install, or of the dev,spark install (a superset), matches the current inputs.
install_project() {
    local extras="$1" spec="." name="base" want
    if [[ -n "$extras" ]]; then spec=".[$extras]"; name="${extras//,/-}"; fi
    # (delayq/__init__.py appearing changes how setuptools maps the editable package: reinstall then)
    want="$( { cat "$ROOT/pyproject.toml"; "$VPY" -VV; ls "$ROOT/delayq/__init__.py" 2>/dev/null || true; } |
        sha256sum | cut -d' ' -f1)"
    local stamp="$VENV/.delayq-installed-$name" full="$VENV/.delayq-installed-dev-spark"
    if [[ "${DELAYQ_REINSTALL:-0}" != 1 ]] &&
        { [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] || [[ -f "$full" && "$(cat "$full")" == "$want" ]]; }; then
        log "dependencies up to date (delete $stamp or set DELAYQ_REINSTALL=1 to reinstall)"
        return
    fi
    log "pip install -e $spec"
    local pip_flags=(-q)
    if [[ -n "${CI:-}" ]]; then pip_flags+=(--progress-bar off); fi
    "$VPY" -m pip install "${pip_flags[@]}" -e "$spec"
    printf '%s\n' "$want" >"$stamp"
}
