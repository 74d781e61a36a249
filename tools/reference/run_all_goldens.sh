#!/usr/bin/env bash
# Regenerates every golden from the reference libraries (run on the GPU machine: transformers 5.17,
# tokenizers 0.23.2, jinja2) and compares with what is committed. Usage, from the repository root:
#   bash tools/reference/run_all_goldens.sh TINY_DIR OUT_DIR
# TINY_DIR holds the make-tiny checkpoints (TINY_DIR/<preset>, seed 1); OUT_DIR receives the model goldens.
set -uo pipefail
tiny=$1
out=$2
mkdir -p "$out"
python3 -c "import transformers, tokenizers, torch, jinja2; print('transformers', transformers.__version__, \
'tokenizers', tokenizers.__version__, 'torch', torch.__version__, 'jinja2', jinja2.__version__)"
snap=$(mktemp -d)
cp -r tests/fixtures "$snap/"
status=0
python3 tools/reference/make_model_goldens.py --models "$tiny" --out "$out/model_goldens" || status=1
for f in "$out"/model_goldens/*.safetensors; do
  if cmp -s "$f" "tests/fixtures/model_goldens/$(basename "$f")"; then echo "same: model_goldens/$(basename "$f")";
  else echo "DIFFERENT: model_goldens/$(basename "$f")"; status=1; fi
done
for s in tokenizer_goldens.py jinja_goldens.py chat_goldens.py; do
  [ -f "tools/reference/$s" ] || continue
  echo "== $s"
  python3 "tools/reference/$s" || status=1
done
if diff -r "$snap/fixtures" tests/fixtures >"$out/fixtures.diff"; then
  echo "text goldens: identical to the committed ones"
else
  echo "text goldens: DIFFERENT (see fixtures.diff)"; head -50 "$out/fixtures.diff"; status=1
fi
exit $status
