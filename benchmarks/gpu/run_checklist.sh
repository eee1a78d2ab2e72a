#!/usr/bin/env bash
# The GPU checklist in one command per part, for a machine with a GPU and a CUDA build of torch.
#   benchmarks/gpu/run_checklist.sh nanogpt-defaults   FIRST: nanoGPT's train.py at its defaults searched in 3m with
#                                             no flag, then the pick against hand-set batches (benchmarks/gpu/nanogpt_defaults.sh)
#   benchmarks/gpu/run_checklist.sh features  SECOND: first where a GPU is at hand, each new shape's cost in bf16 and tf32
#                                             (benchmarks/gpu/shapes.py, 60 s: $OUT/shapes-profile.md), then
#                                             every feature beyond nanoGPT in one call (about 12 min): batches
#                                             by tokens over a whole epoch against the safe fixed batch, checkpointing
#                                             where memory binds (a 1.1B Llama, pick / expert), the estimator against measured peaks,
#                                             activation offload's peak and speed (GPT-2 small), the allocator's
#                                             settings and retries at GPT-2 medium's edge, the HF Trainer
#                                             adapter, each probe against its normal run; a dated table in
#                                             $OUT/features.md (benchmarks/gpu/features.py; PARTS=tokens,hf picks)
#   benchmarks/gpu/run_checklist.sh forecast  on a GPU other than the H100 (an H200): nanoGPT's defaults searched in 3m,
#                                             its file forecast for an H100 against the 2026-11-27 H100 log (the issue's
#                                             held-out check: benchmarks/forecast.py --held-out; TARGET=H100), the pair
#                                             kept as $OUT/nanogpt-defaults.best.json for benchmarks/gpu/results/
#   benchmarks/gpu/run_checklist.sh check     scripts/check_cuda.sh, then a search of each bundled study
#   benchmarks/gpu/run_checklist.sh finders   Lightning's and HF's batch-size finders on GPT-2 small (124M)
#   benchmarks/gpu/run_checklist.sh search    autofit on GPT-2 small
#   benchmarks/gpu/run_checklist.sh compare --config NAME=PREC:BATCH ...   picks re-measured interleaved
#   benchmarks/gpu/run_checklist.sh fidelity  probe vs normal run of GPT-2 small (benchmarks/fidelity.py)
#   benchmarks/gpu/run_checklist.sh nanogpt   the nanoGPT-style 124M searched over every knob, then its exhaustive grid
#   benchmarks/gpu/run_checklist.sh experts   autofit vs the expert baselines (bf16 finders, bf16 largest fit, grid)
#   benchmarks/gpu/run_checklist.sh xl        the same where memory binds: GPT-2 XL (1.5B) at context 1024
#   benchmarks/gpu/run_checklist.sh tokens    batching by tokens over a whole epoch (benchmarks/tokens.py), then a
#                                             search of its eager-attention study (does the squares cap pay?)
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
nanogpt-defaults)
    step "nanoGPT's train.py at its defaults, compile on (benchmarks/gpu/nanogpt_defaults.sh)"
    OUT="$OUT" PYTHON="$PYTHON" BUDGET="${BUDGET_NANOGPT:-3m}" benchmarks/gpu/nanogpt_defaults.sh
    ;;
forecast)
    step "nanoGPT's defaults searched here, then forecast for ${TARGET:-H100} (benchmarks/forecast.py --held-out)"
    ROUNDS=0 OUT="$OUT" PYTHON="$PYTHON" BUDGET="${BUDGET_NANOGPT:-3m}" benchmarks/gpu/nanogpt_defaults.sh
    best=$(sed -n 's/^best config written to //p' "$OUT/nanogpt-defaults-search.log" | tail -1)
    cp "$best" "$OUT/nanogpt-defaults.best.json" || exit 1
    "$PYTHON" -m benchmarks.forecast --held-out "$OUT/nanogpt-defaults.best.json" --target "${TARGET:-H100}" \
        | tee "$OUT/forecast-held-out.json"
    # nanoGPT's own loop counts no tokens (its file: "tokens_per_s": null): a sample is its block_size, 1024
    "$PYTHON" -m autofit.cli forecast "$OUT/nanogpt-defaults.best.json" --tokens 10B --tokens-per-sample 1024 \
        | tee "$OUT/forecast.log"
    ;;
features)
    step "variable lengths in bf16 and tf32: each new shape's cost, the attention kernel (benchmarks/gpu/shapes.py, 60 s)"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    timeout 90 "$PYTHON" -m benchmarks.gpu.shapes --device cuda --seconds 60 --out "$OUT"
    echo "exit status $?"
    step "every feature on one GPU (benchmarks/gpu/features.py --parts ${PARTS:-tokens,memory,estimator,offload,allocator,hf})"
    "$PYTHON" -m benchmarks.gpu.features --parts "${PARTS:-tokens,memory,estimator,offload,allocator,hf}" --out "$OUT"
    echo "exit status $?"
    ;;
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
tokens)
    step "benchmarks/tokens.py --device cuda --memory-limit ${LIMIT:-2GiB} (issue 26: autofit >= 2x the safe fixed batch)"
    "$PYTHON" -m benchmarks.tokens --device cuda --memory-limit "${LIMIT:-2GiB}" --budget "${BUDGET}" --rounds "${ROUNDS:-3}" \
        --samples "${SAMPLES:-8192}" --out "$OUT/tokens-cuda.md"
    step "the eager-attention study at lengths to 1024: does the squares cap (max_squares) pay on a GPU?"
    TOKENS_SAMPLES=8192 TOKENS_SCALE=2 TOKENS_ATTENTION=eager "$PYTHON" -m autofit.cli search benchmarks/tokens_study.py \
        --gpu 0 --memory-limit "${LIMIT:-2GiB}" --budget "${BUDGET}" --fresh --storage "sqlite:///$OUT/tokens.db" \
        --out "$OUT/tokens-eager.best.json"
    echo "exit status $?"
    ;;
fidelity)
    step "probe vs normal run, interleaved (benchmarks/fidelity.py --device cuda)"
    "$PYTHON" -m benchmarks.fidelity --device cuda --rounds "${ROUNDS:-2}" --out "$OUT/fidelity-cuda.md"
    ;;
nanogpt)
    step "autofit search benchmarks/gpu/nanogpt.py --gpu 0 --budget ${BUDGET}"
    "$PYTHON" -m autofit.cli search benchmarks/gpu/nanogpt.py --gpu 0 --budget "$BUDGET" --fresh \
        --storage "sqlite:///$OUT/nanogpt.db" --out "$OUT/nanogpt.best.json"
    echo "exit status $?"
    "$PYTHON" -m autofit.cli show --study nanogpt.train-cuda0 --storage "sqlite:///$OUT/nanogpt.db"
    step "the exhaustive grid: every precision x checkpoint level x batch, eager and compiled"
    "$PYTHON" -m benchmarks.record_landscape --study benchmarks/gpu/nanogpt.py --device cuda --compile \
        --memory-limit "${LIMIT:-78GiB}" --batch 8:128 --precision tf32,bf16,fp16 --out "$OUT/nanogpt-grid.json"
    step "the pick against the grid's best, interleaved"
    best=$("$PYTHON" -c "import json,sys; from benchmarks.landscape import Landscape; \
        c=Landscape.load(sys.argv[1]).best_config(); print(f'{c.precision}:{c.batch_size}:{c.checkpoint_segments}:{c.accumulation_steps}')" "$OUT/nanogpt-grid.json")
    "$PYTHON" -m benchmarks.gpu.compare benchmarks/gpu/nanogpt.py --device cuda --rounds 3 --steps 20 \
        --config "autofit=@$OUT/nanogpt.best.json" --config "grid=$best" --out "$OUT/nanogpt-compare.json"
    ;;
experts)
    step "autofit against the expert baselines on GPT-2 small (benchmarks/experts.py)"
    "$PYTHON" -m benchmarks.experts --device cuda --full-size --memory-limit "${LIMIT:-78GiB}" --budget "$BUDGET" \
        --grid-batch 4:128 --rounds 3 --steps 10
    cp benchmarks/experts-cuda.md "$OUT/"
    ;;
xl)
    step "GPT-2 XL (1.5B, context 1024): memory binds on one GPU"
    GPT124M_LAYERS=48 GPT124M_WIDTH=1600 "$PYTHON" -m benchmarks.experts --device cuda --full-size \
        --memory-limit "${LIMIT:-78GiB}" --budget "$BUDGET" --grid-batch 1:32 --rounds 2 --steps 5
    cp benchmarks/experts-cuda.md "$OUT/experts-xl-cuda.md"
    ;;
compare)
    shift
    step "interleaved re-measure: $*"
    "$PYTHON" -m benchmarks.gpu.compare benchmarks/gpu/gpt124m.py --device cuda --out "$OUT/compare.json" "$@"
    ;;
esac
