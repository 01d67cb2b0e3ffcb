#!/usr/bin/env bash
# Every GPU check in one run of under 8 minutes, for a machine that has torch,
# networkx and pytest but not this project's other dependencies:
#
#   bash bench/gpu_checks.sh [RESULTS_DIR]
#
# PuLP and highspy wheels found in .whl/ (for that machine's Python) are
# installed into a scratch folder first; remat itself is installed there too,
# so its package-dir mapping (remat.passes, remat.solvers) holds. Matplotlib
# (for the Pareto plots) and scipy (torch's "ilp" budget solver) are used if
# that machine has them; without matplotlib the tables are still written.
#
# Each check has its own time limit and a failing check does not stop the
# others; the script exits non-zero if any failed. To stay inside 8 minutes the
# benchmarks use the realistic per-layer size (d=1024, seq 2048, batch 8, bf16
# autocast) at 4 layers, and the side-by-side run measures the telling peers.
# The full 12-layer run is `python -m bench --device cuda` (longer than 8 min).
set -uo pipefail
cd "$(dirname "$0")/.."
results=${1:-bench/results}
mkdir -p "$results"
site=$(mktemp -d)
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl || exit 1
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-compile --target "$site" . || exit 1
# The installed remat (with remat.passes and remat.solvers) must win over the checkout's remat/ folder:
# -P keeps the working directory off sys.path, and pytest appends rather than prepends its paths.
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1
py="python3 -P"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), \
torch.cuda.get_device_name() if torch.cuda.is_available() else '')"

failed=()
check() {  # check NAME SECONDS COMMAND...
    local name=$1 limit=$2 t0=$SECONDS
    shift 2
    echo "=== $name (limit ${limit}s): $*"
    timeout --signal=INT --kill-after=10 "$limit" "$@"
    local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - t0))s"
    [ "$rc" -eq 0 ] || failed+=("$name")
}

check pytest-cuda 100 $py -m pytest -q -m cuda -o addopts= -o pythonpath= --import-mode=append tests/test_cuda.py
check budgets 130 $py -m bench.budgets --device cuda --set layers=4 --steps 5 --out "$results"
check side-by-side 170 $py -m bench --device cuda --models gpt --set layers=4 --warmup 2 --steps 5 \
    --peers "compile default" "checkpoint per block" "budget 0.5 (dp)" "selective" --no-sweep --max-minutes 2.5 \
    --out "$results"
# the meta plan of a 7B-shaped model (one layer, seq 2048) against the same model on this GPU
check capacity 80 $py -m bench.capacity_gpu --layers 1 --seq 2048 --out "$results"

if [ ${#failed[@]} -gt 0 ]; then
    echo "failed: ${failed[*]}"
    exit 1
fi
echo "all GPU checks passed"
