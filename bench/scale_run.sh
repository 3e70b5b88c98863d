#!/usr/bin/env bash
# The 7B-scale run of record (docs/benchmarks.md, "Weight storage"): one family at a
# time, write random-weight checkpoints of its real configuration, measure every
# storage option with `spec-ar bench storage`, delete the files.
#     bench/scale_run.sh [OUT=docs/bench-storage-7b] [WORK=/tmp/scale]
set -euo pipefail
out="${1:-docs/bench-storage-7b}"
work="${2:-/tmp/scale}"
py="${PYTHON:-python}"
for spec in "janus-pro-7b original" "janus-pro-7b converted" "lumina-mgpt-7b-768 converted" \
            "anole-7b converted" "emu3-gen converted"; do
  set -- $spec
  family=$1 layout=$2
  folder="$work/$family-$layout"
  rm -rf "$work" && mkdir -p "$work"
  "$py" -m spec_ar.bench.scale_checkpoints --family "$family" --layout "$layout" --out "$folder"
  "$py" -m spec_ar.cli bench storage --model "$folder" --dtypes bfloat16 int8 fp8 nf4 --windows 1 24 \
      --forwards 3 --out "$out/$family-$layout"
done
rm -rf "$work"
