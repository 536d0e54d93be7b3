#!/usr/bin/env bash
# A language model with the natural bias: SentencePiece on one language ->
# fairseq-preprocess --only-source -> fairseq-train --task language_modeling
# --arch transformer_lm_natbias_tiny with --natbias-init unigram (and zero, to
# compare) -> fairseq-eval-lm (test perplexity) -> Python sampling with the
# bias scaled by lambda (sample.py) -> examples/paper/sweep_lm.py (diversity and
# quality over lambda, Kobayashi et al., 2023).
#
#   examples/language_model/run.sh                          # Multi30k English
#   DATA=~/text LANG_ID=fr TRAIN=train VALID=dev TEST=test examples/language_model/run.sh
#
# DATA holds raw text, one sentence a line: $TRAIN.$LANG_ID, $VALID.$LANG_ID,
# $TEST.$LANG_ID (.gz allowed); with the defaults train.en, val.en,
# test_2016_flickr.en (Multi30k's names). Without DATA the data is found as
# `make demo` finds it: $NATBIAS_MULTI30K, else
# Multi30k downloaded into DATA_CACHE, else a synthetic corpus (announced).
# Every setting below can be given in the environment. Each step skips itself
# when its output exists (remove WORK, or a part of it, to redo it).
#
# Outputs in WORK: spm.model, data-bin/, runs/<init>/{checkpoint_best.pt,
# train.log, eval_lm.log, samples.txt, sweep/ (sweep_lm.md, .tsv, .png,
# continuations)}.
set -euo pipefail

# --- data ------------------------------------------------------------------------
DATA=${DATA-}                       # folder of raw text; empty: Multi30k, found or downloaded as by `make demo`
DATA_CACHE=${DATA_CACHE-work/examples/data}  # with DATA empty: where Multi30k is downloaded (or a synthetic corpus written)
LANG_ID=${LANG_ID-en}               # the language, as in the file names
TRAIN=${TRAIN-train}                # training file name, without .<lang>[.gz]
VALID=${VALID-val}                  # validation file name (Multi30k: val)
TEST=${TEST-test_2016_flickr}       # test file name: perplexity, sweep prompts
TRAIN_LINES=${TRAIN_LINES-0}        # first N training sentences only (0: all)
EVAL_LINES=${EVAL_LINES-0}          # first N validation and test sentences only (0: all)
VOCAB=${VOCAB-8000}                 # SentencePiece vocabulary size
WORK=${WORK-work/examples/language_model}  # everything this script writes
# --- model and training -------------------------------------------------------------------
INITS=${INITS-"unigram zero"}       # --natbias-init values to train, one run each
EMBED_DIM=${EMBED_DIM-128}          # d (transformer_lm_natbias_tiny's)
FFN_DIM=${FFN_DIM-256}              # feed-forward width
LAYERS=${LAYERS-2}                  # decoder layers
HEADS=${HEADS-4}                    # attention heads
TOKENS_PER_SAMPLE=${TOKENS_PER_SAMPLE-128}  # longest sentence (in pieces) trained on; longer ones are skipped
MAX_UPDATE=${MAX_UPDATE-500}        # training updates
MAX_TOKENS=${MAX_TOKENS-4096}       # tokens per batch
LR=${LR-1e-3}                       # peak learning rate (inverse square root schedule)
WARMUP=${WARMUP-100}                # warm-up updates
SEED=${SEED-1}                      # the same seed for every run: they differ in the bias alone
TRAIN_ARGS=${TRAIN_ARGS-}           # more fairseq-train options
# --- generation -----------------------------------------------------------------------------
PROMPT=${PROMPT-"A man"}            # text sample.py continues
LAMBDAS=${LAMBDAS-"1 0.5 0"}        # output-bias scales for sample.py and sweep_lm.py
SWEEP_ARGS=${SWEEP_ARGS-}           # more sweep_lm.py options, e.g. "--decoding beam"

# The examples' shared plumbing: --help, say, die, example_data, stage_text, logged, text_file, first_lines, HERE, REPO.
source "$(dirname "$0")/../common.sh"
example_help "$@"
example_needs fairseq-train "fairseq and fairseq_natbias"

# --- 1. raw text, the first TRAIN_LINES / EVAL_LINES lines --------------------------------------
# (examples/common.sh's stage_text)

# --- 2. SentencePiece on this one language ------------------------------------------------------------
sentencepiece() {
    [[ -f $WORK/spm/test.$LANG_ID ]] && { say "sentencepiece: $WORK/spm exists, skipped"; return; }
    say "sentencepiece: unigram model of $VOCAB pieces"
    python "$REPO/examples/translation/spm_text.py" train --model-prefix "$WORK/spm" \
        --vocab-size "$VOCAB" "$WORK/raw/train.$LANG_ID"
    python "$REPO/examples/translation/spm_text.py" encode --model "$WORK/spm.model" \
        --output-dir "$WORK/spm.part" "$WORK"/raw/{train,valid,test}."$LANG_ID"
    rm -rf "$WORK/spm" && mv "$WORK/spm.part" "$WORK/spm"
}

# --- 3. binarise one side only: dict.txt, {train,valid,test}.{bin,idx} -------------------------------------
preprocess() {
    [[ -f $WORK/data-bin/test.bin ]] && { say "preprocess: $WORK/data-bin exists, skipped"; return; }
    say "fairseq-preprocess --only-source"
    rm -rf "$WORK/data-bin"  # fairseq-preprocess refuses to overwrite a dictionary
    logged "$WORK/preprocess.log" fairseq-preprocess --only-source \
        --trainpref "$WORK/spm/train.$LANG_ID" --validpref "$WORK/spm/valid.$LANG_ID" \
        --testpref "$WORK/spm/test.$LANG_ID" --destdir "$WORK/data-bin" --workers 2
}

# --- 4. train: the unigram bias counts the task's next-token targets in data-bin/train.bin -------------------
train() {
    local init=$1 run=$WORK/runs/$1
    [[ -f $run/train.done ]] && { say "train [$init]: finished before, skipped"; return; }
    mkdir -p "$run"
    say "train [$init]: $MAX_UPDATE updates (log: $run/train.log)"
    # --sample-break-mode eos: one sentence a sample, each starting after EOS
    # (how sweep_lm.py and sample.py prompt the model).
    # shellcheck disable=SC2086  # TRAIN_ARGS is a list of options
    logged "$run/train.log" fairseq-train "$WORK/data-bin" --task language_modeling \
        --user-dir fairseq_natbias --arch transformer_lm_natbias_tiny --natbias-init "$init" \
        --decoder-embed-dim "$EMBED_DIM" --decoder-ffn-embed-dim "$FFN_DIM" \
        --decoder-layers "$LAYERS" --decoder-attention-heads "$HEADS" \
        --share-decoder-input-output-embed --dropout 0.1 \
        --sample-break-mode eos --tokens-per-sample "$TOKENS_PER_SAMPLE" \
        --skip-invalid-size-inputs-valid-test \
        --optimizer adam --adam-betas '(0.9, 0.98)' --lr "$LR" \
        --lr-scheduler inverse_sqrt --warmup-updates "$WARMUP" --criterion cross_entropy \
        --max-tokens "$MAX_TOKENS" --max-update "$MAX_UPDATE" --seed "$SEED" \
        --save-dir "$run" --no-epoch-checkpoints --num-workers 0 \
        --log-format simple --log-interval 25 --no-progress-bar $TRAIN_ARGS
    touch "$run/train.done"
}

# --- 5. test perplexity -----------------------------------------------------------------------------------
eval_lm() {
    local init=$1 run=$WORK/runs/$1
    if [[ ! -f $run/eval_lm.log ]]; then
        say "fairseq-eval-lm [$init]: the test split"
        # fairseq-eval-lm takes the task's settings from its own command line, not
        # from the checkpoint: without these it would read blocks of 1024 tokens.
        logged "$run/eval_lm.part" fairseq-eval-lm "$WORK/data-bin" --user-dir fairseq_natbias \
            --path "$run/checkpoint_best.pt" --gen-subset test --max-tokens "$MAX_TOKENS" \
            --sample-break-mode eos --tokens-per-sample "$TOKENS_PER_SAMPLE" \
            --skip-invalid-size-inputs-valid-test --num-workers 0
        mv "$run/eval_lm.part" "$run/eval_lm.log"
    fi
    ! grep -q 'Evaluated 0 tokens' "$run/eval_lm.log" ||
        die "fairseq-eval-lm scored no token: every test sentence is longer than TOKENS_PER_SAMPLE=$TOKENS_PER_SAMPLE pieces"
    echo "[$init] $(grep -o 'Loss (base 2): .*' "$run/eval_lm.log" | tail -n 1)"
}

# --- 6. samples with the bias scaled by lambda, from Python ------------------------------------------------
sample() {
    local init=$1 run=$WORK/runs/$1
    if [[ ! -f $run/samples.txt ]]; then
        # shellcheck disable=SC2086  # LAMBDAS is a list
        python "$HERE/sample.py" --checkpoint "$run/checkpoint_best.pt" --data-bin "$WORK/data-bin" \
            --spm-model "$WORK/spm.model" --prompt "$PROMPT" --lambdas $LAMBDAS \
            --seed "$SEED" >"$run/samples.part"
        mv "$run/samples.part" "$run/samples.txt"
    fi
    sed "s/^/[$init] /" "$run/samples.txt"
}

# --- 7. diversity and quality over lambda ----------------------------------------------------------------------
sweep() {
    local init=$1 run=$WORK/runs/$1
    if [[ ! -f $run/sweep/sweep_lm.md ]]; then
        say "sweep_lm.py [$init]: lambda in $LAMBDAS"
        # shellcheck disable=SC2086  # LAMBDAS, SWEEP_ARGS are lists
        python "$REPO/examples/paper/sweep_lm.py" "$WORK/data-bin" "$run/checkpoint_best.pt" --lambdas $LAMBDAS \
            --seed "$SEED" --out-dir "$run/sweep" $SWEEP_ARGS >/dev/null 2>"$run/sweep.log" ||
            { tail -n 5 "$run/sweep.log" >&2; exit 1; }
    fi
    echo "[$init] sweep_lm.py ($run/sweep):"
    cat "$run/sweep/sweep_lm.md"
}

mkdir -p "$WORK"
stage_text "$LANG_ID"
sentencepiece
preprocess
for init in $INITS; do
    train "$init"
done
for init in $INITS; do eval_lm "$init"; done
for init in $INITS; do sample "$init"; done
for init in $INITS; do sweep "$init"; done
