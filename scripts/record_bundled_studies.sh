#!/usr/bin/env bash
# Record the small search results that ship with autofit, so `autofit show`, `autofit report` and
# notebooks/explore_study.ipynb work right after installation (nothing to probe first).
#
# Runs one real CPU search per bundled study (studies/gpt.py, cnn.py, mlp.py) into one SQLite
# storage, autofit/recorded/autofit.db (package data), and writes autofit/recorded/<stem>.train.best.json.
# The probes' output lands in autofit/recorded/runs/<study>/ (`autofit show --trial N` prints it).
#
# Usage: scripts/record_bundled_studies.sh            all studies, from a clean storage
#        scripts/record_bundled_studies.sh gpt        re-record only these (the others are kept)
# AUTOFIT=/path/to/autofit picks the command (default: autofit on PATH). Takes ~3 minutes a study:
# run it on an otherwise idle machine, since the probes measure throughput.
set -euo pipefail
cd "$(dirname "$0")/.."
AUTOFIT="${AUTOFIT:-autofit}"
BUDGET="${BUDGET:-3m}"
OUT=autofit/recorded
STORAGE="sqlite:///$OUT/autofit.db"

# The memory limit each study's docstring describes its shape under.
limit_of() {
  case "$1" in
    gpt) echo 1GiB ;;
    cnn) echo 1.5GiB ;;
    mlp) echo 1.5GiB ;;
    *) echo "record_bundled_studies: no memory limit known for study '$1'" >&2; exit 2 ;;
  esac
}

if [ "$#" -eq 0 ]; then
  set -- gpt cnn mlp
  rm -rf "$OUT/autofit.db" "$OUT/runs"
fi
mkdir -p "$OUT"
for stem in "$@"; do
  if [ ! -f "studies/$stem.py" ]; then
    echo "record_bundled_studies: studies/$stem.py must exist, but it does not" >&2
    exit 2
  fi
  rm -rf "$OUT/runs/$stem.train-cpu0"
  echo "== $stem: limit $(limit_of "$stem"), budget $BUDGET" >&2
  "$AUTOFIT" search "studies/$stem.py" --device cpu --memory-limit "$(limit_of "$stem")" \
    --budget "$BUDGET" --storage "$STORAGE" --out "$OUT/$stem.train.best.json" --fresh
done
"$AUTOFIT" studies --storage "$STORAGE"
