#!/usr/bin/env bash
# The GPU check: one script for a machine with one NVIDIA GPU and no internet except the package
# index. It creates its own environment with the cuda12 extra, checks that JAX sees the GPU, runs
# the tests whose numerics run on the default device, replays a real run's trace on the GPU (the
# replay's difference there; the step fails beyond the tolerance in _gpu_check.py), then sim_speed,
# workloads (ResNet-20 with native convolutions on fake CIFAR files, the LM task) and runtime_speed,
# and prints one JSON line of everything it measured.
# Every step has its own time limit; a step that fails or times out is recorded as such and the
# script goes on, so the last line is always the JSON line.
#
#   bash benchmarks/gpu_check.sh                 # on the GPU machine, from a clone of the repository
#
# Environment (all optional):
#   GPU_CHECK_DIR=DIR       work directory (default: a new temporary one); logs are kept there
#   GPU_CHECK_EXTRA=cuda12  the pip extra that brings the accelerator's jaxlib ("" on a CPU dry run)
#   GPU_CHECK_ALLOW_CPU=1   go on when JAX sees no GPU (a dry run of the script itself)
#   GPU_CHECK_QUICK=1       the smallest settings (a dry run of the script itself)
#   GPU_CHECK_VENV=DIR      use this existing virtual environment instead of installing one
set -u

root=$(cd "$(dirname "$0")/.." && pwd)
work=${GPU_CHECK_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")}
extra=${GPU_CHECK_EXTRA-cuda12}
quick=${GPU_CHECK_QUICK:-0}
mkdir -p "$work"
t_start=$(date +%s)
steps=()   # JSON fragments "name": {...}

record() {  # name, rc, seconds, log file -> a JSON fragment with the log's last JSON line (if any)
    local name=$1 rc=$2 secs=$3 log=$4 last
    last=$(grep -E '^\{.*\}$' "$log" 2>/dev/null | tail -n 1)
    [ -n "$last" ] || last=null
    steps+=("\"$name\": {\"rc\": $rc, \"seconds\": $secs, \"result\": $last}")
    echo "gpu_check: $name: exit $rc after ${secs} s (log: $log)"
}

step() {  # name, limit_s, command...: run with a time limit, log to $work/name.log
    local name=$1 limit=$2; shift 2
    local log="$work/$name.log" t0 rc
    t0=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
    rc=$?
    record "$name" "$rc" "$(( $(date +%s) - t0 ))" "$log"
    return $rc
}

finish() {
    local joined
    joined=$(IFS=,; echo "${steps[*]}")
    echo "{\"gpu_check\": {$joined}, \"wall_s\": $(( $(date +%s) - t_start )), \"work\": \"$work\"}"
}
trap finish EXIT

# 1. the environment, exactly as a user would install it, plus the accelerator's jaxlib
venv=${GPU_CHECK_VENV:-$work/venv}
if [ -z "${GPU_CHECK_VENV:-}" ]; then
    step install 600 bash -c "python3 -m venv '$venv' && . '$venv/bin/activate' && \
        pip install -q --upgrade pip && pip install -q -e '$root[dev${extra:+,$extra}]'" || exit 1
fi
# shellcheck disable=SC1091
. "$venv/bin/activate"
cd "$root" || exit 1

# 2. the device JAX uses by default
step devices 120 python benchmarks/_gpu_check.py devices
if ! grep -q '"backend": "gpu"' "$work/devices.log" && [ "${GPU_CHECK_ALLOW_CPU:-0}" != 1 ]; then
    echo "gpu_check: JAX sees no GPU (see $work/devices.log); set GPU_CHECK_ALLOW_CPU=1 for a dry run"
    exit 1
fi

# 3. tests whose numerics run on the default device (the others pin virtual CPU devices):
#    engine replays and sweeps, optax equivalences, local-update methods, the LM
tests=""
for t in tests/test_engine.py tests/test_optax.py tests/test_local.py tests/test_lm.py; do
    [ -f "$t" ] && tests="$tests $t"
done
[ "$quick" = 1 ] && tests="tests/test_engine.py"
step tests 420 bash -c "python -m pytest -q -p no:cacheprovider $tests --junitxml='$work/tests.xml'; rc=\$?; \
    python benchmarks/_gpu_check.py junit '$work/tests.xml'; exit \$rc"

# 4. a real run on the GPU and its trace replayed in the engine: the replay's difference on this device
#    (exit 1 beyond the tolerance documented in _gpu_check.py; the JSON line is kept either way)
updates=$([ "$quick" = 1 ] && echo 100 || echo 500)
step real_run 300 staleness run --task digits-mlp --policy asp --cluster 1*4 --updates "$updates" \
    --optimizer momentum:0.9 --out "$work/run" --overwrite --no-progress
step replay 300 python benchmarks/_gpu_check.py replay "$work/run"

# 5. speed: the replay against the plain-JAX limit, per-task workloads, the real runtime
q=$([ "$quick" = 1 ] && echo --quick)
step sim_speed 420 python benchmarks/sim_speed.py $q
step fake_cifar 120 python benchmarks/_gpu_check.py cifar "$work/cifar"
step workloads 600 python benchmarks/workloads.py $q --tasks digits-mlp,stdlib-lm,cifar10-resnet20 \
    --cifar-dir "$work/cifar"
step runtime_speed 420 python benchmarks/runtime_speed.py $q
exit 0
