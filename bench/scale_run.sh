#!/usr/bin/env bash
# The 7B-scale run of record (docs/benchmarks.md, "Weight storage"): one family at a
# time, write random-weight checkpoints of its real configuration, measure every
# storage option with `spec-ar bench storage`, and record what the sizing says of
# requests that do not fit this machine; then delete the files.
#     bench/scale_run.sh [OUT=docs/bench-storage-7b] [WORK=/tmp/scale]
set -uo pipefail
out="${1:-docs/bench-storage-7b}"
work="${2:-/tmp/scale}"
py="${PYTHON:-python}"
mkdir -p "$out"
# SPECS="family layout,family layout" runs a subset
IFS=, read -ra specs <<< "${SPECS:-janus-pro-7b original,janus-pro-7b converted,lumina-mgpt-7b-768 converted,anole-7b converted,emu3-gen converted}"
for spec in "${specs[@]}"; do
  set -- $spec
  family=$1 layout=$2
  folder="$work/$family-$layout"
  rm -rf "$work" && mkdir -p "$work"
  "$py" -m spec_ar.bench.scale_checkpoints --family "$family" --layout "$layout" --out "$folder" || exit 1
  "$py" -m spec_ar.cli bench storage --model "$folder" --dtypes bfloat16 int8 fp8 nf4 --windows 1 24 \
      --forwards 3 --out "$out/$family-$layout" || exit 1
  # what the sizing says of requests this machine cannot hold (one line each, exit status 2)
  { if [ "$family" = simplear-1.5b ]; then  # 1.5B fits in float32: ask for a batch that does not
      echo "\$ spec-ar render --model $family-$layout --dtype bfloat16 --batch 64 --prompt 'a red fox' --mode sjd"
      timeout 300 "$py" -m spec_ar.cli render --model "$folder" --dtype bfloat16 --batch 64 --prompt "a red fox" \
          --mode sjd --out "$work/r" 2>&1 | tail -1
    else
      echo "\$ spec-ar render --model $family-$layout --dtype float32 --prompt 'a red fox' --mode ar"
      "$py" -m spec_ar.cli render --model "$folder" --dtype float32 --prompt "a red fox" --mode ar --out "$work/r" 2>&1
    fi
    if [ "$family" = emu3-gen ]; then  # 720 px: the batch check must count the memory-mapped weights
      echo "\$ spec-ar render --model $family-$layout --dtype bfloat16 --batch 9 --prompt 'a red fox' --mode ar"
      timeout 120 "$py" -m spec_ar.cli render --model "$folder" --dtype bfloat16 --batch 9 --prompt "a red fox" \
          --mode ar --out "$work/r" 2>&1 | tail -1
    fi
  } > "$out/$family-$layout/sizing.txt"
done
rm -rf "$work"
