#!/usr/bin/env bash
# Side-by-side comparison of the strategies on HAPT: 30 clients over MQTT (embedded broker),
# same seed, 10 rounds of 1 local epoch, lr 0.01, batch 32, the FedDist paper's split; baselines with the
# same 10 passes. FedAvg aggregation unless a strategy names another (the settings of docs/results.md's
# single-seed table, which predate today's defaults).
# Usage: scripts/compare_strategies.sh [OUT_DIR]   (default runs/compare; finished runs are skipped)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/compare}
BIN=.venv/bin
mkdir -p "$OUT"
common=(--rounds 10 --local-epochs 1 --lr 0.01 --seed 1 --split paper --no-progress --feddist-max-width 1.25)

done_run() { [ -f "$OUT/$1/report.json" ] && grep -q '"wall_seconds"' "$OUT/$1/report.json" && grep -q '"peak_memory"' "$OUT/$1/report.json"; }

sim() {
  local name=$1; shift
  if done_run "$name"; then echo "skip $name (done)"; return; fi
  rm -rf "${OUT:?}/$name"
  echo "== $name: fedhar-simulate ${common[*]} $*"
  "$BIN/fedhar-simulate" "${common[@]}" --run-dir "$OUT/$name" --run-id "compare-$name" "$@" > "$OUT/$name.log" 2>&1
  tail -2 "$OUT/$name.log"
}

base() {
  local name=$1; shift
  if [ -f "$OUT/$name/report.json" ]; then echo "skip $name (done)"; return; fi
  echo "== $name: fedhar-baseline $*"
  "$BIN/fedhar-baseline" "$@" --epochs 10 --lr 0.01 --seed 1 --split paper --run-dir "$OUT/$name" --no-progress > "$OUT/$name.log" 2>&1
}

sim fedavg --aggregation fedavg
sim fedavg-ala --aggregation fedavg --client-init ala
sim feddwa --aggregation feddwa
sim feddwa-ala --aggregation feddwa --client-init ala
sim fedper --aggregation fedper
sim feddist --aggregation fedavg --growth feddist
sim feddist-feddwa-ala --aggregation feddwa --growth feddist --client-init ala
base local-only local-only
base centralised centralised
sim fedprox --aggregation fedprox --prox-mu 0.01

"$BIN/fedhar-compare" "$OUT"/{fedavg,fedavg-ala,feddwa,feddwa-ala,fedper,feddist,feddist-feddwa-ala,local-only,centralised,fedprox} > "$OUT/table.md"
cat "$OUT/table.md"
