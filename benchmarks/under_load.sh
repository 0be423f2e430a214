#!/usr/bin/env bash
# The README's test command, three times in a row, on a fresh clone of the committed HEAD while
# CPU-bound processes compete for the cores (a shared machine, a busy CI runner). It prints each
# run's outcome (passed/failed counts, wall time) and one summary line; exit status 0 when every
# run passed. Uncommitted changes are not included: commit first.
#
#   bash benchmarks/under_load.sh
#
# Environment (all optional):
#   HOGS=2                      CPU hogs (python3 busy loops) running during the test runs
#   UNDER_LOAD_RUNS=3           how many times the test command runs
#   UNDER_LOAD_SELECT="..."     replace the command's selection "tests notebooks", e.g.
#                               "tests/test_lr.py notebooks/05-policy-explorer.ipynb" (a quick check)
#   UNDER_LOAD_ARGS="..."       extra pytest arguments appended to the command, e.g. "--durations=20"
#   UNDER_LOAD_KEEP=1           keep the clone (with its .venv) instead of deleting it
#
# The setup and test commands are read from README.md's lines after "# 1." and "# 2." (as .ci/run
# does), so this runs exactly what a user runs; the setup line's main job ("&& staleness ...")
# is left out, the install is not. Each run's full pytest output is kept in a log directory
# printed at the end.
set -u

runs=${UNDER_LOAD_RUNS:-3}
hogs=${HOGS:-2}
src=$(cd "$(dirname "$0")/.." && git rev-parse --show-toplevel) || { echo "under_load: not inside a git checkout"; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/under_load.XXXXXX")
logs="$work.logs"
mkdir -p "$logs"
hog_pids=()

test_pid=""
stop_hogs() {
    local p
    for p in "${hog_pids[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${hog_pids[@]}"; do wait "$p" 2>/dev/null; done
    hog_pids=()
}
stop_tests() {   # the test run's whole process group: pytest, its kernels and subprocesses
    [ -n "$test_pid" ] || return 0
    kill -TERM -- "-$test_pid" 2>/dev/null && sleep 2
    kill -KILL -- "-$test_pid" 2>/dev/null
    wait "$test_pid" 2>/dev/null
    test_pid=""
}
cleanup() {
    set +m   # no job-status chatter ("Terminated") while ending the jobs
    stop_tests
    stop_hogs
    if [ "${UNDER_LOAD_KEEP:-0}" = 1 ]; then echo "under_load: clone kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'echo; echo "under_load: interrupted"; exit 130' INT
trap 'exit 143' TERM

git clone -q "$src" "$work/project" || exit 2
cd "$work/project" || exit 2
head=$(git rev-parse --short HEAD)

setup=$(grep -A1 '^# 1\.' README.md | sed -n 2p)
tests=$(grep -A1 '^# 2\.' README.md | sed -n 2p)
case "$tests" in *pytest*) ;; *) echo "under_load: README's test command does not run pytest: $tests"; exit 2 ;; esac
setup=${setup%%&& staleness*}            # the install, without the main job
if [ -n "${UNDER_LOAD_SELECT:-}" ]; then
    case "$tests" in *" tests notebooks"*) ;; *) echo "under_load: no 'tests notebooks' to replace in: $tests"; exit 2 ;; esac
    tests=${tests/ tests notebooks/ $UNDER_LOAD_SELECT}
fi
[ -n "${UNDER_LOAD_ARGS:-}" ] && tests="$tests $UNDER_LOAD_ARGS"

echo "== under_load: HEAD $head of $src, cloned into $work/project"
echo "== setup (no load): $setup"
SECONDS=0
bash -c "$setup" >"$logs/setup.log" 2>&1 || { echo "under_load: setup failed; see $logs/setup.log"; tail -20 "$logs/setup.log"; exit 2; }
echo "== setup done after $SECONDS s"

# Job control from here on: each background job gets its own process group, so Ctrl-C reaches
# this script (which waits, traps it and cleans up) and cleanup can end a test run whole.
set -m
for _ in $(seq "$hogs"); do python3 -c "while True: pass" & hog_pids+=($!); done
echo "== $hogs CPU hogs running (pids ${hog_pids[*]}) on $(nproc) cores"
echo "== tests, $runs times: $tests"

count() { echo "$last" | grep -oE "[0-9]+ $1" | grep -oE '^[0-9]+' || echo 0; }   # N of "N passed" in $last
results=()
npass=0
for i in $(seq "$runs"); do
    log="$logs/run$i.log"
    t0=$(date +%s.%N)
    bash -c "$tests" </dev/null >"$log" 2>&1 &
    test_pid=$!
    wait "$test_pid"
    rc=$?
    test_pid=""
    wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')
    # pytest's last summary line, e.g. "2 failed, 250 passed, 3 skipped in 801.22s (0:13:21)"
    last=$(grep -E '[0-9]+ (passed|failed|errors?|skipped|deselected)' "$log" | tail -1 | sed -E 's/^=+ //; s/ =+$//')
    passed=$(count passed); failed=$(count failed); errors=$(count 'errors?')
    if [ "$rc" = 0 ]; then verdict=PASS; npass=$((npass + 1)); else verdict=FAIL; fi
    line="run $i: $verdict rc=$rc passed=$passed failed=$failed errors=$errors wall=${wall}s (${last:-no pytest summary})"
    echo "$line"
    if [ "$rc" != 0 ]; then
        grep -E '^(FAILED|ERROR) ' "$log" | head -20 | sed 's/^/    /'
    fi
    results+=("$wall")
done
stop_hogs

echo "== logs: $logs"
walls=$(IFS=/; echo "${results[*]}")
echo "under_load: $npass/$runs runs passed with $hogs CPU hogs on $(nproc) cores; wall ${walls} s; HEAD $head"
[ "$npass" = "$runs" ]
