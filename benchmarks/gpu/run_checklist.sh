#!/usr/bin/env bash
# The GPU checklist in one command per part, for a machine with a GPU and a CUDA build of torch.
#   benchmarks/gpu/run_checklist.sh check     scripts/check_cuda.sh, then a search of each bundled study
#   benchmarks/gpu/run_checklist.sh finders   Lightning's and HF's batch-size finders on GPT-2 small (124M)
#   benchmarks/gpu/run_checklist.sh search    autofit on GPT-2 small
#   benchmarks/gpu/run_checklist.sh compare --config NAME=PREC:BATCH ...   picks re-measured interleaved
#   benchmarks/gpu/run_checklist.sh fidelity  probe vs normal run of GPT-2 small (benchmarks/fidelity.py)
# Everything is logged to $OUT (default: out/gpu); PYTHON picks the interpreter (default python3).
set -u
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python3}"
OUT="${OUT:-out/gpu}"
mkdir -p "$OUT"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1
BUDGET="${BUDGET:-45s}"
step() { echo; echo "=== $* ($(date +%T))"; }

case "${1:-check}" in
check)
    step nvidia-smi; nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv
    "$PYTHON" -c 'import torch, optuna; print("torch", torch.__version__, "cuda", torch.version.cuda, "optuna", optuna.__version__)'
    step check_cuda; PYTHON="$PYTHON" scripts/check_cuda.sh
    for study in gpt cnn mlp; do
        step "autofit search studies/$study.py --gpu 0 --budget $BUDGET"
        "$PYTHON" -m autofit.cli search "studies/$study.py" --gpu 0 --budget "$BUDGET" --fresh \
            --storage sqlite:///studies/autofit.db
        echo "exit status $?"
    done
    "$PYTHON" -m autofit.cli show --study gpt.train-cuda0 --storage sqlite:///studies/autofit.db
    ;;
finders)
    step "Lightning scale_batch_size (power) on GPT-2 small"
    "$PYTHON" -m benchmarks.gpu.finders lightning --device cuda --out "$OUT/lightning.json" 2>&1 | grep -v -E "it/s]|^\s*$" | tail -40
    step "HF auto_find_batch_size from 256 on GPT-2 small"
    "$PYTHON" -m benchmarks.gpu.finders hf --device cuda --start 256 --out "$OUT/hf.json" 2>&1 | grep -v -E "it/s]|^\s*$" | tail -40
    ;;
search)
    step "autofit search benchmarks/gpu/gpt124m.py --gpu 0 --budget ${BUDGET}"
    "$PYTHON" -m autofit.cli search benchmarks/gpu/gpt124m.py --gpu 0 --budget "$BUDGET" --fresh --out "$OUT/gpt124m.best.json"
    echo "exit status $?"
    "$PYTHON" -m autofit.cli show --study gpt124m.train-cuda0 --storage sqlite:///studies/autofit.db
    ;;
fidelity)
    step "probe vs normal run, interleaved (benchmarks/fidelity.py --device cuda)"
    "$PYTHON" -m benchmarks.fidelity --device cuda --rounds "${ROUNDS:-2}" --out "$OUT/fidelity-cuda.md"
    ;;
compare)
    shift
    step "interleaved re-measure: $*"
    "$PYTHON" -m benchmarks.gpu.compare benchmarks/gpu/gpt124m.py --device cuda --out "$OUT/compare.json" "$@"
    ;;
esac
