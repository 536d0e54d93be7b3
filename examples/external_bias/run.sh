#!/usr/bin/env bash
# The natural bias counted on an external corpus (Meister et al., 2023, App.
# A.7): b = log p_unigram of target-language text that is not the parallel
# training data, e.g. a large monolingual corpus of the same language.
#
#   examples/translation/run.sh                                      # first: data-bin, spm.model
#   EXTERNAL_TEXT=news.en.gz examples/external_bias/run.sh
#
# Steps: encode EXTERNAL_TEXT with the translation example's SentencePiece
# model -> natbias-count --dict data-bin/dict.$TGT.txt --text external.tok ->
# fairseq-train --natbias-init file --natbias-counts external.counts (the
# translation example's model and training settings: give the same
# environment) -> fairseq-generate (beam 5) -> sacreBLEU, next to the
# translation example's scores. Each step skips itself when its output exists.
#
# Outputs in WORK: external.counts (one "symbol count" line per dictionary
# entry), runs/file/{checkpoint_best.pt, train.log, test.hyp, test.scores}.
set -euo pipefail

# --- inputs ----------------------------------------------------------------------
TRANSLATION_WORK=${TRANSLATION_WORK-work/examples/translation}  # WORK of examples/translation/run.sh (data-bin, spm.model, raw/)
SRC=${SRC-de}                       # source language of that data
TGT=${TGT-en}                       # target language: the external text's language
EXTERNAL_TEXT=${EXTERNAL_TEXT-}     # raw target-language text, one sentence a line (.gz allowed); empty: all of $TRAIN.$TGT in the translation example's data (DATA and TRAIN as given to it; by default Multi30k's train.en), a stand-in for a real external corpus
DATA_CACHE=${DATA_CACHE-work/examples/data}  # with EXTERNAL_TEXT and DATA empty: where Multi30k is downloaded (or a synthetic corpus written)
EXTERNAL_LINES=${EXTERNAL_LINES-0}  # first N lines of it only (0: all)
WORK=${WORK-work/examples/external_bias}  # everything this script writes
# --- model and training: examples/translation/run.sh's defaults ---------------------------
LAYERS=${LAYERS-2}                  # encoder and decoder layers
EMBED_DIM=${EMBED_DIM-128}          # d, embeddings shared by encoder, decoder and output layer
FFN_DIM=${FFN_DIM-256}              # feed-forward width
HEADS=${HEADS-4}                    # attention heads
MAX_UPDATE=${MAX_UPDATE-250}        # training updates
MAX_TOKENS=${MAX_TOKENS-3000}       # tokens per batch
LR=${LR-1e-3}                       # peak learning rate (inverse square root schedule)
WARMUP=${WARMUP-100}                # warm-up updates
SEED=${SEED-1}                      # the translation example's seed: the runs differ in the bias alone
CRITERION=${CRITERION-unigram_label_smoothed_cross_entropy}  # the translation example's criterion (give the same)
TRAIN_ARGS=${TRAIN_ARGS-}           # more fairseq-train options
BEAM=${BEAM-5}                      # beam size

# The examples' shared plumbing: --help, say, die, example_data, logged, in_id_order, text_file, first_lines, REPO.
source "$(dirname "$0")/../common.sh"
example_help "$@"
example_needs fairseq-train "fairseq and fairseq_natbias"
SPM_TEXT=$REPO/examples/translation/spm_text.py
DATA_BIN=$TRANSLATION_WORK/data-bin
RUN=$WORK/runs/file

# --- what this needs -------------------------------------------------------------------
[[ -f $DATA_BIN/dict.$TGT.txt && -f $TRANSLATION_WORK/spm.model ]] ||
    die "TRANSLATION_WORK=$TRANSLATION_WORK has no data-bin/dict.$TGT.txt and spm.model: run examples/translation/run.sh first (same WORK, SRC, TGT)"
# The scores are printed beside the translation example's runs: one criterion for all.
for translation_run in "$TRANSLATION_WORK"/runs/*/; do
    trained_before "${translation_run%/}" || true
done
if [[ -z $EXTERNAL_TEXT ]]; then
    # The translation example's data, found the same way (DATA empty: as `make demo` does).
    DATA=${DATA-}
    example_data "$TGT"
    EXTERNAL_TEXT=$(text_file "$DATA/${TRAIN-train}.$TGT") ||
        die "DATA=$DATA has no ${TRAIN-train}.$TGT[.gz]: set EXTERNAL_TEXT to raw $TGT text, one sentence a line (.gz allowed)"
fi
[[ -f $EXTERNAL_TEXT ]] ||
    die "EXTERNAL_TEXT=$EXTERNAL_TEXT: no such file; set EXTERNAL_TEXT to raw $TGT text, one sentence a line (.gz allowed)"
mkdir -p "$WORK"

# --- 1. the external text as the model's pieces ----------------------------------------------
if [[ -f $WORK/spm/external.$TGT ]]; then
    say "sentencepiece: $WORK/spm/external.$TGT exists, skipped"
else
    say "sentencepiece: encoding $EXTERNAL_TEXT with $TRANSLATION_WORK/spm.model"
    mkdir -p "$WORK/raw"
    first_lines "$EXTERNAL_LINES" "$EXTERNAL_TEXT" >"$WORK/raw/external.$TGT"
    python "$SPM_TEXT" encode --model "$TRANSLATION_WORK/spm.model" --output-dir "$WORK/spm" \
        "$WORK/raw/external.$TGT"
fi

# --- 2. count it against the target dictionary (one EOS per line, unknown pieces as <unk>) ----------
if [[ -f $WORK/external.counts ]]; then
    say "natbias-count: $WORK/external.counts exists, skipped"
else
    natbias-count --dict "$DATA_BIN/dict.$TGT.txt" --text "$WORK/spm/external.$TGT" \
        --output "$WORK/external.counts.part" >&2
    mv "$WORK/external.counts.part" "$WORK/external.counts"
fi

# --- 3. train with b = log p_unigram of the external counts (add-one smoothed) ------------------------
if trained_before "$RUN"; then
    say "train [file]: finished before, skipped"
else
    mkdir -p "$RUN"
    say "train [file]: $MAX_UPDATE updates, --criterion $CRITERION, bias from $WORK/external.counts (log: $RUN/train.log)"
    train_translation "$RUN" "$DATA_BIN" --natbias-init file --natbias-counts "$WORK/external.counts"
    mark_trained "$RUN"
fi

# --- 4. translate and score, as examples/translation/run.sh does ---------------------------------------
if [[ -f $RUN/test.hyp ]]; then
    say "generate [file]: $RUN/test.hyp exists, skipped"
else
    say "generate [file]: beam $BEAM on the test set"
    generate_test "$DATA_BIN" "$RUN"
fi
sacrebleu "$TRANSLATION_WORK/raw/test.$TGT" -i "$RUN/test.hyp" -m bleu chrf -f text >"$RUN/test.scores"
say "test scores (best checkpoint, beam $BEAM), with the translation example's runs:"
for scores in "$RUN/test.scores" "$TRANSLATION_WORK"/runs/*/test.scores; do
    [[ -f $scores ]] || continue
    init=$(basename "$(dirname "$scores")")
    sed -e "s/^ */[$init] /" "$scores"
done
