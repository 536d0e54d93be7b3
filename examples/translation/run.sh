#!/usr/bin/env bash
# Translation with the natural bias, end to end: joint SentencePiece ->
# fairseq-preprocess --joined-dictionary -> fairseq-train --arch
# transformer_natbias with --natbias-init unigram and, to compare, zero ->
# fairseq-generate (beam 5) -> sacreBLEU (BLEU and chrF with signatures).
#
#   examples/translation/run.sh                                  # Multi30k De->En, as `make demo`
#   DATA=~/corpus SRC=fr TGT=en TRAIN=train VALID=dev TEST=test examples/translation/run.sh
#   MAX_UPDATE=2000 INITS=unigram WORK=work/fr_en examples/translation/run.sh
#
# DATA holds raw (untokenised) text, one sentence a line, the two languages
# line-aligned: $TRAIN.$SRC, $TRAIN.$TGT, $VALID.*, $TEST.* (.gz allowed);
# with the defaults train.de, train.en, val.de, val.en, test_2016_flickr.de,
# test_2016_flickr.en (Multi30k's names). Without DATA the data is found as
# `make demo` finds it: $NATBIAS_MULTI30K, else
# Multi30k downloaded into DATA_CACHE, else a synthetic corpus (announced).
# Every setting below can be given in the environment. Each step skips itself
# when its output exists (remove WORK, or a part of it, to redo it); an
# interrupted training resumes from its checkpoint_last.pt.
#
# Outputs in WORK: spm.model, data-bin/, runs/<init>/{checkpoint_best.pt,
# train.log, test.gen, test.hyp, test.scores}.
set -euo pipefail

# --- data ------------------------------------------------------------------------
DATA=${DATA-}                       # folder of raw parallel text; empty: Multi30k, found or downloaded as by `make demo`
DATA_CACHE=${DATA_CACHE-work/examples/data}  # with DATA empty: where Multi30k is downloaded (or a synthetic corpus written)
SRC=${SRC-de}                       # source language, as in the file names
TGT=${TGT-en}                       # target language
TRAIN=${TRAIN-train}                # training file name, without .<lang>[.gz]
VALID=${VALID-val}                  # validation file name (Multi30k: val)
TEST=${TEST-test_2016_flickr}       # test file name (Multi30k: test_2016_flickr)
TRAIN_LINES=${TRAIN_LINES-0}        # first N training pairs only (0: all)
EVAL_LINES=${EVAL_LINES-0}          # first N validation and test pairs only (0: all)
VOCAB=${VOCAB-8000}                 # joint SentencePiece vocabulary size
WORK=${WORK-work/examples/translation}  # everything this script writes
# --- model and training: `make demo`'s sizes -----------------------------------------
INITS=${INITS-"unigram zero"}       # --natbias-init values to train, one run each (also: none)
LAYERS=${LAYERS-2}                  # encoder and decoder layers
EMBED_DIM=${EMBED_DIM-128}          # d, embeddings shared by encoder, decoder and output layer
FFN_DIM=${FFN_DIM-256}              # feed-forward width
HEADS=${HEADS-4}                    # attention heads
MAX_UPDATE=${MAX_UPDATE-250}        # training updates (a few hundred: a CPU demo, not a good model)
MAX_TOKENS=${MAX_TOKENS-3000}       # tokens per batch
LR=${LR-1e-3}                       # peak learning rate (inverse square root schedule)
WARMUP=${WARMUP-100}                # warm-up updates
SEED=${SEED-1}                      # the same seed for every run: they differ in the bias alone
CRITERION=${CRITERION-unigram_label_smoothed_cross_entropy}  # label smoothing 0.1 towards the unigram: lower at the end than the paper's label_smoothed_cross_entropy (examples/README.md#the-criterion)
TRAIN_ARGS=${TRAIN_ARGS-}           # more fairseq-train options, e.g. "--cpu" or "--natbias-weight-init fairseq"
# --- evaluation -------------------------------------------------------------------------
BEAM=${BEAM-5}                      # beam size

# The examples' shared plumbing: --help, say, die, example_data, stage_text, logged, in_id_order, text_file, first_lines, HERE.
source "$(dirname "$0")/../common.sh"
example_help "$@"
example_needs fairseq-train "fairseq and fairseq_natbias"

# --- 1. raw text: the first TRAIN_LINES / EVAL_LINES lines of each file --------------------
# (examples/common.sh's stage_text)

# --- 2. one joint SentencePiece model, the text as pieces -------------------------------------
sentencepiece() {
    [[ -f $WORK/spm/test.$TGT ]] && { say "sentencepiece: $WORK/spm exists, skipped"; return; }
    say "sentencepiece: joint unigram model of $VOCAB pieces on the training text"
    python "$HERE/spm_text.py" train --model-prefix "$WORK/spm" --vocab-size "$VOCAB" \
        "$WORK/raw/train.$SRC" "$WORK/raw/train.$TGT"
    python "$HERE/spm_text.py" encode --model "$WORK/spm.model" --output-dir "$WORK/spm.part" \
        "$WORK"/raw/{train,valid,test}."$SRC" "$WORK"/raw/{train,valid,test}."$TGT"
    rm -rf "$WORK/spm" && mv "$WORK/spm.part" "$WORK/spm"
}

# --- 3. binarise with one dictionary for both languages (the embeddings are shared) -----------------
preprocess() {
    [[ -f $WORK/data-bin/test.$SRC-$TGT.$TGT.bin ]] && { say "preprocess: $WORK/data-bin exists, skipped"; return; }
    say "fairseq-preprocess --joined-dictionary"
    rm -rf "$WORK/data-bin"  # fairseq-preprocess refuses to overwrite a dictionary
    logged "$WORK/preprocess.log" fairseq-preprocess --source-lang "$SRC" --target-lang "$TGT" \
        --trainpref "$WORK/spm/train" --validpref "$WORK/spm/valid" --testpref "$WORK/spm/test" \
        --destdir "$WORK/data-bin" --joined-dictionary --workers 2
}

# --- 4. train: the bias of the unigram run is counted from data-bin/train.*.$TGT -----------------------
train() {
    local init=$1 run=$WORK/runs/$1
    trained_before "$run" && { say "train [$init]: finished before, skipped"; return; }
    mkdir -p "$run"
    say "train [$init]: $MAX_UPDATE updates, --criterion $CRITERION (log: $run/train.log)"
    train_translation "$run" "$WORK/data-bin" --natbias-init "$init"
    mark_trained "$run"
    say "train [$init]: last validation: $(grep '| valid |' "$run/train.log" | tail -n 1 | sed 's/.*| valid | //')"
}

# --- 5. translate the test set with the best checkpoint ----------------------------------------------
generate() {
    local init=$1 run=$WORK/runs/$1
    [[ -f $run/test.hyp ]] && { say "generate [$init]: $run/test.hyp exists, skipped"; return; }
    [[ -f $run/checkpoint_best.pt ]] ||
        die "$run/checkpoint_best.pt: no such checkpoint, though $run/train.done says [$init] was trained; remove $run/train.done to train it again"
    say "generate [$init]: beam $BEAM on the test set"
    generate_test "$WORK/data-bin" "$run"
}

# --- 6. score against the raw references --------------------------------------------------------------
score() {
    local init=$1 run=$WORK/runs/$1
    local hyps refs
    hyps=$(wc -l <"$run/test.hyp") refs=$(wc -l <"$WORK/raw/test.$TGT")
    [[ $hyps == "$refs" ]] || die "$run/test.hyp has $hyps lines, the references $refs: remove it to translate again"
    sacrebleu "$WORK/raw/test.$TGT" -i "$run/test.hyp" -m bleu chrf -f text >"$run/test.scores"
    sed -e "s/^ */[$init] /" "$run/test.scores"
}

mkdir -p "$WORK"
stage_text "$SRC" "$TGT"
sentencepiece
preprocess
for init in $INITS; do
    train "$init"
    generate "$init"
done
say "test scores (best checkpoint, beam $BEAM):"
for init in $INITS; do score "$init"; done
