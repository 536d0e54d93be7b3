#!/usr/bin/env bash
# Translation from scratch with Hugging Face transformers, the natural bias
# against transformers' stock training: a tokenizer trained here, a small
# Marian model, Seq2SeqTrainer, beam search, sacreBLEU; then a report (table
# and plot of validation NLL over updates, test BLEU and chrF with signatures).
#
#   examples/huggingface/run.sh                                  # Multi30k De->En
#   DATA=~/corpus SRC=fr TGT=en examples/huggingface/run.sh
#   ARMS="stock natbias" SEEDS="1 2 3" MAX_STEPS=1000 examples/huggingface/run.sh
#   TRAIN_LINES=3000 VOCAB=2500 MAX_STEPS=6000 EVAL_EVERY=100 PATIENCE=5 \
#       examples/huggingface/run.sh                              # a small corpus, past the best
#
# DATA holds raw text, one sentence a line, the two languages line-aligned:
# $TRAIN.$SRC, $TRAIN.$TGT, $VALID.*, $TEST.* (.gz allowed); without DATA,
# Multi30k is found as `make demo` finds it. Each run skips itself when done
# and resumes when interrupted. Outputs: WORK/runs/<arm>/seed<k>/ and WORK/report.md.
set -euo pipefail

DATA=${DATA-}                       # folder of raw parallel text; empty: Multi30k
DATA_CACHE=${DATA_CACHE-work/examples/data}  # with DATA empty: where Multi30k is downloaded
SRC=${SRC-de}                       # source language, as in the file names
TGT=${TGT-en}                       # target language
TRAIN=${TRAIN-train}                # training file name, without .<lang>[.gz]
VALID=${VALID-val}                  # validation file name
TEST=${TEST-test_2016_flickr}       # test file name
TRAIN_LINES=${TRAIN_LINES-0}        # first N training pairs only (0: all)
EVAL_LINES=${EVAL_LINES-0}          # first N validation and test pairs only (0: all)
VOCAB=${VOCAB-8000}                 # tokenizer vocabulary (both languages)
WORK=${WORK-work/examples/huggingface}  # everything this script writes
ARMS=${ARMS-"stock natbias natbias+unigram-ls"}  # also stock+unigram-ls
SEEDS=${SEEDS-1}                    # one run per arm and seed
MAX_STEPS=${MAX_STEPS-1000}         # training updates
EVAL_EVERY=${EVAL_EVERY-50}         # updates between validations
PATIENCE=${PATIENCE-0}              # stop after N validations without a lower NLL (0: never)
BATCH=${BATCH-80}                   # sentence pairs per update
LAYERS=${LAYERS-2}                  # encoder and decoder layers
DIM=${DIM-128}                      # model width
FFN=${FFN-256}                      # feed-forward width
HEADS=${HEADS-4}                    # attention heads

source "$(dirname "$0")/../common.sh"
example_help "$@"
example_needs python "natbias with its [hf] extra"
python -c "import natbias.hf" 2>/dev/null ||
    die "natbias.hf needs transformers: pip install 'fairseq-natbias[hf]' (or make install)"

mkdir -p "$WORK"
stage_text "$SRC" "$TGT"
for seed in $SEEDS; do
    for arm in $ARMS; do
        bias=none; [[ $arm == natbias* ]] && bias=natural
        smoothing=uniform; [[ $arm == *+unigram-ls ]] && smoothing=unigram
        say "train [$arm] seed $seed: $MAX_STEPS updates (log: $WORK/runs/$arm/seed$seed/train.log)"
        mkdir -p "$WORK/runs/$arm/seed$seed"
        logged "$WORK/runs/$arm/seed$seed/train.log" python "$HERE/translate.py" \
            --data "$WORK/raw" --src "$SRC" --tgt "$TGT" --work "$WORK" --vocab "$VOCAB" \
            --bias "$bias" --label-smoothing "$smoothing" --seed "$seed" \
            --max-steps "$MAX_STEPS" --eval-every "$EVAL_EVERY" --patience "$PATIENCE" \
            --batch-size "$BATCH" --layers "$LAYERS" --dim "$DIM" --ffn "$FFN" --heads "$HEADS"
        say "[$arm] seed $seed: $(grep -E '^\[.*\] test' "$WORK/runs/$arm/seed$seed/train.log" | tail -n 1)"
    done
done
python "$HERE/report.py" "$WORK" --out "$WORK/report.md"
