#!/usr/bin/env bash
# Every GPU check in one run, for a machine that has torch, networkx and pytest
# but not this project's other dependencies:
#
#   bash bench/gpu_checks.sh [RESULTS_DIR]
#
# PuLP and highspy wheels found in .whl/ (for that machine's Python) are
# installed into a scratch folder first; remat itself is installed there too,
# so its package-dir mapping (remat.passes, remat.solvers) holds. Matplotlib
# (for the Pareto plots) and scipy (torch's "ilp" budget solver) are used if
# that machine has them; without matplotlib the tables are still written.
set -euo pipefail
cd "$(dirname "$0")/.."
results=${1:-bench/results}
site=$(mktemp -d)
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-compile --target "$site" .
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
python3 -m pytest -q -m cuda tests/test_cuda.py
python3 -m bench.budgets --device cuda --out "$results"
# Every model beside every PyTorch peer, bf16 autocast, rows past an 8-minute budget recorded as skipped.
python3 -m bench --device cuda --out "$results"
