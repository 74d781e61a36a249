#!/usr/bin/env bash
# The house model, end to end, in one command (run from anywhere; paths below are relative to the caller):
#
#   bash tools/house_model/run_all.sh --out DIR [--minutes 7] [--total-minutes 8.5] [--corpus stdlib|stdlib+site]
#        [--max-site-mb 150] [--size small|large]
#        [--pack DIR] [--resume] [--ckpt-dir DIR] [--smoke] [--python PY] [-- extra train.py flags]
#
# Stages: prepare_data.py -> train_tokenizer.py -> train.py -> export.py -> goldens.py -> fill_readme.py [-> pack].
# Everything lands under --out:
#   model/      the checkpoint dir for models/house (config, bf16 safetensors, tokenizer files, README, manifest)
#   fixtures/   heldout.txt + goldens.json for tests/fixtures/house_model
#   work/       corpus, token ids, logs, final.pt (not to be committed); ckpt/ (resumable training state)
#   summary.json, data_manifest.json, run.log
# --total-minutes is the hard wall-clock budget of the whole command: training gets at most --minutes, and is cut
# (its cosine schedule shortened up front) so that export and goldens still finish inside the total.
# --pack DIR writes model/ + fixtures/ + summaries as a .tgz split into 15 MiB parts (house.tgz.part-00, -01, ...)
# plus summary.json and run.log: at most 8 files, for transports that limit file count and size. Unpack with
#   cat DIR/house.tgz.part-* | tar -xzf - -C DEST
set -uo pipefail
T0=$(date +%s)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

OUT="" MINUTES="" TOTAL="" CORPUS="stdlib" SITE_MB=150 SIZE=small PACK="" RESUME=0 CKPT="" SMOKE=0 EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --minutes) MINUTES="$2"; shift 2 ;;
    --total-minutes) TOTAL="$2"; shift 2 ;;
    --corpus) CORPUS="$2"; shift 2 ;;
    --max-site-mb) SITE_MB="$2"; shift 2 ;;
    --size) SIZE="$2"; shift 2 ;;
    --pack) PACK="$2"; shift 2 ;;
    --resume) RESUME=1; shift ;;
    --ckpt-dir) CKPT="$2"; shift 2 ;;
    --smoke) SMOKE=1; shift ;;
    --python) PYTHON="$2"; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "run_all.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$OUT" ] || { echo "run_all.sh: --out DIR is required" >&2; exit 2; }
if [ "$SMOKE" = 1 ]; then MINUTES=${MINUTES:-1}; TOTAL=${TOTAL:-5}; RESERVE=60; else
  MINUTES=${MINUTES:-7}; TOTAL=${TOTAL:-8.5}; RESERVE=110; fi
mkdir -p "$OUT/work" "$OUT/fixtures" "$OUT/model"
OUT=$(cd "$OUT" && pwd)
[ -n "$PACK" ] && { mkdir -p "$PACK"; PACK=$(cd "$PACK" && pwd); }
CKPT=${CKPT:-$OUT/ckpt}
mkdir -p "$CKPT" && CKPT=$(cd "$CKPT" && pwd)
exec > >(tee -a "$OUT/run.log") 2>&1

export PYTHONUNBUFFERED=1 PYTHONHASHSEED=0 TOKENIZERS_PARALLELISM=true
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
PY=${PYTHON:-python3}
# This project's CPU machines keep torch in /opt/refvenv; the GPU machine's plain python3 has it.
if [ -z "${PYTHON:-}" ] && ! "$PY" -c 'import torch' 2>/dev/null && [ -x /opt/refvenv/bin/python ]; then
  PY=/opt/refvenv/bin/python
fi
DEADLINE=$(awk -v t0="$T0" -v tot="$TOTAL" -v r="$RESERVE" 'BEGIN { printf "%d", t0 + tot * 60 - r }')
PHASES="$OUT/work/phases.txt"
: > "$PHASES"
STATUS=0
cd "$HERE"

pack() {  # model/ + fixtures/ + summaries as 15 MiB parts (at most 8 files in $PACK in all)
  [ -n "$PACK" ] || return 0
  local items=() p
  for p in model fixtures data_manifest.json train_files.txt summary.json run.log work/train_summary.json \
           work/export_check.json work/train_log.jsonl work/token_stats.json work/phases.txt; do
    [ -e "$OUT/$p" ] && items+=("$p")
  done
  rm -f "$PACK"/house.tgz.part-*
  tar -C "$OUT" -cf - "${items[@]}" | gzip -1 | split -b 15m -d -a 2 - "$PACK/house.tgz.part-"
  [ -f "$OUT/summary.json" ] && cp "$OUT/summary.json" "$PACK/"
  echo "=== packed -> $PACK: $(ls "$PACK" | tr '\n' ' ') ==="
}

phase() {  # phase NAME cmd...: run, time, and remember a failure without stopping the pipeline
  local name="$1"; shift
  local t=$(date +%s)
  echo "=== $name: $* ==="
  "$@"
  local rc=$?
  echo "$name $(( $(date +%s) - t ))" >> "$PHASES"
  if [ $rc -ne 0 ]; then echo "=== $name FAILED (exit $rc) ==="; STATUS=1; fi
  return $rc
}

echo "house model: out $OUT, minutes $MINUTES, total $TOTAL min (train deadline $(( DEADLINE - T0 ))s from start)," \
  "corpus $CORPUS, size $SIZE, smoke $SMOKE"
"$PY" -c 'import sys, torch, transformers, tokenizers; print("python", sys.version.split()[0], "torch", torch.__version__,
  "transformers", transformers.__version__, "tokenizers", tokenizers.__version__, "cuda", torch.cuda.is_available())' \
  || { echo "run_all.sh: $PY lacks torch/transformers/tokenizers (use --python PY)"; exit 1; }

if [ "$SMOKE" = 1 ]; then
  DATA_ARGS=(--max-train-mb 2 --max-eval-mb 0.1); TOK_ARGS=(--vocab-size 2048 --train-mb 2)
  TRAIN_ARGS=(--smoke --eval-every-sec 20 --max-steps 40); GOLD_ARGS=(--window 128)
else
  DATA_ARGS=(); TOK_ARGS=(); TRAIN_ARGS=(--size "$SIZE"); GOLD_ARGS=(--window 1024)
fi

ok=1
if [ "$RESUME" = 1 ] && [ -f "$OUT/model/tokenizer.json" ] && [ -f "$OUT/work/ids_train.npy" ]; then
  echo "=== resume: reusing $OUT/work data and tokenizer ==="
else
  phase data "$PY" prepare_data.py --out "$OUT" --corpus "$CORPUS" --max-site-mb "$SITE_MB" "${DATA_ARGS[@]}" || ok=0
  [ $ok = 1 ] && { phase tokenizer "$PY" train_tokenizer.py --out "$OUT" "${TOK_ARGS[@]}" || ok=0; }
fi
if [ $ok = 1 ]; then
  RES=(); [ "$RESUME" = 1 ] && RES=(--resume)
  # Backstop only: train.py stops itself at the deadline; timeout kills it if a step hangs far past it.
  KILL_AFTER=$(( DEADLINE - $(date +%s) + 90 )); [ $KILL_AFTER -lt 30 ] && KILL_AFTER=30
  phase train timeout "$KILL_AFTER" "$PY" train.py --out "$OUT" --minutes "$MINUTES" --deadline "$DEADLINE" \
    --ckpt-dir "$CKPT" "${RES[@]}" "${TRAIN_ARGS[@]}" "${EXTRA[@]}" || ok=0
fi
[ $ok = 1 ] && { phase export "$PY" export.py --out "$OUT" || ok=0; }
pack  # early copy, in case anything after this runs out of time
[ -f "$OUT/model/model.safetensors" ] && { phase goldens "$PY" goldens.py --out "$OUT" "${GOLD_ARGS[@]}" || ok=0; }
echo "total $(( $(date +%s) - T0 ))" >> "$PHASES"
if [ -f "$OUT/fixtures/goldens.json" ] && [ -f "$OUT/work/train_summary.json" ]; then
  phase readme "$PY" fill_readme.py --out "$OUT" --phases "$PHASES" || true
fi

pack
echo "=== run_all.sh done in $(( $(date +%s) - T0 ))s, status $STATUS ==="
[ -n "$PACK" ] && cp "$OUT/run.log" "$PACK/run.log" 2>/dev/null
exit $STATUS
