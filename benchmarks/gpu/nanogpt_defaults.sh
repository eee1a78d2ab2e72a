#!/usr/bin/env bash
# nanoGPT's own train.py at its defaults (GPT-2 124M, block 1024, batch 12 x 40 accumulation, bf16, compile on),
# searched as a new user would and then measured against hand-set micro-batches by nanoGPT's own ms/iter.
#   benchmarks/gpu/run_checklist.sh nanogpt-defaults        (or this script, from the project's root)
# 1. `python train.py` before any search: it must train at the script's own micro-batch (12 x 40), not run out
#    of memory at micro-batch = global batch;
# 2. `autofit search train.py --budget 3m` with no other flag: it must exit 0;
# 3. the pick's normal run and plain train.py at bf16 b in {12, 16, 24, 32, 48} (the same global batch of 480),
#    interleaved over $ROUNDS rounds, each nanoGPT's own ms/iter of iterations 3..$ITERS: the pick's ms/iter
#    over the best hand-set one's (issue "Priced for the GPU": at most 1/0.97 of it).
# Random GPT-2 token ids stand for OpenWebText (nothing is downloaded); logs go to $OUT (default out/gpu).
set -u
ROOT="$PWD"; OUTD="${OUT:-out/gpu}"; mkdir -p "$OUTD"; OUTD=$(cd "$OUTD" && pwd)
PY="${PYTHON:-python3}"; export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$ROOT" PYTHONUNBUFFERED=1
ROUNDS="${ROUNDS:-2}"; ITERS="${ITERS:-8}"; HAND="${HAND:-12 16 24 32 48}"
W=$(mktemp -d); cp -r tests/corpus/nanogpt_repo/. "$W/"; cd "$W"
grep -v "# autofit:" train.py > train_plain.py   # upstream train.py: the four autofit lines taken out
"$PY" - <<'PYEOF'
import os, numpy as np
rng = np.random.default_rng(1337); os.makedirs("data/openwebtext", exist_ok=True)
rng.integers(0, 50257, size=20_000_000, dtype=np.uint16).tofile("data/openwebtext/train.bin")
rng.integers(0, 50257, size=1_000_000, dtype=np.uint16).tofile("data/openwebtext/val.bin")
PYEOF
step() { echo; echo "=== $* ($(date +%T))"; }
ms_iter() { grep -E "^iter ([3-9]|[1-9][0-9]+):" "$1" | sed -E 's/.*time ([0-9.]+)ms.*/\1/' | sort -n | \
    awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "nan"}'; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
step "python train.py before any search (must train at the script's own micro-batch, not run out of memory)"
timeout 300 "$PY" train.py --max_iters="$ITERS" --eval_iters=2 > "$OUTD/nanogpt-defaults-unsearched.log" 2>&1
grep -E "autofit|^iter [0-3]:|Error" "$OUTD/nanogpt-defaults-unsearched.log" | tail -8
echo "default (bf16 b=12 acc=40, unsearched) ms/iter $(ms_iter "$OUTD/nanogpt-defaults-unsearched.log")"
step "autofit search train.py --budget ${BUDGET:-3m} (no other flag)"
timeout "${SEARCH_TIMEOUT:-420}" "$PY" -m autofit.cli search train.py --budget "${BUDGET:-3m}" --fresh 2>&1 | tee "$OUTD/nanogpt-defaults-search.log" | tail -40
echo "search exit ${PIPESTATUS[0]}"
"$PY" -m autofit.cli show 2>&1 | tee "$OUTD/nanogpt-defaults-show.log"
for round in $(seq "$ROUNDS"); do
    step "round $round: the pick's normal run, then plain train.py at bf16 b in {$HAND} (global batch 480)"
    timeout 300 "$PY" train.py --max_iters="$ITERS" --eval_iters=2 > "$OUTD/nanogpt-defaults-pick-$round.log" 2>&1
    echo "pick: $(grep -E 'running train.py' "$OUTD/nanogpt-defaults-pick-$round.log" | head -1)"
    echo "pick ms/iter $(ms_iter "$OUTD/nanogpt-defaults-pick-$round.log")"
    for b in $HAND; do
        timeout 300 "$PY" train_plain.py --batch_size="$b" --gradient_accumulation_steps=$((480 / b)) \
            --max_iters="$ITERS" --eval_iters=2 > "$OUTD/nanogpt-defaults-b$b-$round.log" 2>&1
        echo "b=$b ms/iter $(ms_iter "$OUTD/nanogpt-defaults-b$b-$round.log")"
    done
done | tee "$OUTD/nanogpt-defaults-compare.log"
