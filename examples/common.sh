# The plumbing shared by the example scripts, examples/*/run.sh: each sources
# it right after its settings block. Only plumbing lives here (--help, messages,
# finding the tools, logs); the fairseq commands stay in the scripts, to be read
# and copied. Sourced, not run: "$0" is the script that sources it.

# This script's folder, the repository root, and the example's name (its
# folder's), which say and die put in front of every message.
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$(dirname "$0")/../.." && pwd)
EXAMPLE=$(basename "$HERE")

# example_help "$@": on -h or --help, print the script's opening comment and
# its settings lines (NAME=${NAME-default}  # meaning), then exit. The settings
# stay in each script, so a reader sees them there, and this list cannot go stale.
example_help() {
    if [[ ${1-} == -h || ${1-} == --help ]]; then
        sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0"
        echo; echo "Settings (environment variable, default, meaning):"
        grep -E '^[A-Z_]+=\$\{' "$0"
        exit 0
    fi
}

# Progress to stderr, stamped; an error as one line naming the script, then exit 1.
say() { printf '[%s %(%H:%M:%S)T] %s\n' "$EXAMPLE" -1 "$*" >&2; }
die() { printf 'examples/%s/run.sh: error: %s\n' "$EXAMPLE" "$*" >&2; exit 1; }

# example_needs TOOL PACKAGES: use the repository's virtual environment when
# TOOL is not on PATH (as after `make install` without activating it); without
# either, say in one line how to get it rather than fail later with a traceback.
example_needs() {
    command -v "$1" >/dev/null || PATH=$REPO/.venv/bin:$PATH
    command -v "$1" >/dev/null || die "$1 not found: activate the environment with $2 (make install; source .venv/bin/activate)"
}

# example_data LANG...: set DATA, the folder of raw text the example reads.
# DATA given: it must be a folder (the script itself then checks the file
# names, which TRAIN, VALID, TEST make configurable). DATA empty: the folder
# `make demo` would use, found by the same code (examples/paper/multi30k.py):
# $NATBIAS_MULTI30K, Multi30k downloaded into
# DATA_CACHE, or a synthetic corpus there, announced as such.
example_data() {
    if [[ -n ${DATA-} ]]; then
        [[ ! -f $DATA ]] || die "DATA=$DATA is a file, not a folder: set DATA to the folder holding the text files (see --help), or leave it empty to use Multi30k"
        [[ -d $DATA ]] || die "DATA=$DATA: no such folder; set DATA to your raw text (see --help), or leave it empty to use Multi30k"
        return 0
    fi
    # The script prints the folder on stdout, its progress on stderr, and on
    # bad input one error line naming this script.
    DATA=$(python "$REPO/examples/paper/multi30k.py" --langs "$@" --prog "examples/$EXAMPLE/run.sh" \
        "$DATA_CACHE") || exit 1
}

# logged LOG COMMAND...: a command's output goes to LOG (fairseq is verbose);
# on failure its last lines are shown, with the log's name.
logged() {
    local log=$1; shift
    "$@" >"$log" 2>&1 || { tail -n 15 "$log" >&2; die "$(basename "$1") failed; its log: $log"; }
}

# fairseq-train of the small translation model both translation examples
# train (the sizes and schedule are their settings): RUN DATA_BIN, then the
# --natbias-* options of the run. What a user would type, in one place.
train_translation() {
    local run=$1 data_bin=$2
    shift 2
    # shellcheck disable=SC2086  # TRAIN_ARGS is a list of options
    logged "$run/train.log" fairseq-train "$data_bin" --user-dir fairseq_natbias \
        --arch transformer_natbias "$@" \
        --encoder-layers "$LAYERS" --decoder-layers "$LAYERS" \
        --encoder-embed-dim "$EMBED_DIM" --decoder-embed-dim "$EMBED_DIM" \
        --encoder-ffn-embed-dim "$FFN_DIM" --decoder-ffn-embed-dim "$FFN_DIM" \
        --encoder-attention-heads "$HEADS" --decoder-attention-heads "$HEADS" \
        --share-all-embeddings --dropout 0.1 \
        --optimizer adam --adam-betas '(0.9, 0.997)' --lr "$LR" \
        --lr-scheduler inverse_sqrt --warmup-updates "$WARMUP" \
        --criterion "$CRITERION" --label-smoothing 0.1 \
        --max-tokens "$MAX_TOKENS" --max-update "$MAX_UPDATE" --seed "$SEED" \
        --save-dir "$run" --no-epoch-checkpoints --num-workers 0 \
        --log-format simple --log-interval 25 --no-progress-bar $TRAIN_ARGS
}

# trained_before RUN: whether RUN's training finished before (its train.done),
# which records the CRITERION it was trained with. Another CRITERION now stops
# the script: its runs would be compared with runs of the other criterion
# unnoticed; the message names the CRITERION that keeps RUN. An empty
# train.done is from before CRITERION existed, when the examples always
# trained with label_smoothed_cross_entropy.
trained_before() {
    local run=$1 trained_with
    [[ -f $run/train.done ]] || return 1
    trained_with=$(<"$run/train.done")
    trained_with=${trained_with:-label_smoothed_cross_entropy}
    [[ $trained_with == "$CRITERION" ]] ||
        die "$run was trained with --criterion $trained_with, not CRITERION=$CRITERION: give CRITERION=$trained_with to keep using it, set WORK to another folder, or remove $run to train it again"
}

# mark_trained RUN: its training finished, with this CRITERION.
mark_trained() { echo "$CRITERION" >"$1/train.done"; }

# text_file STEM: STEM or STEM.gz, whichever exists (status 1 if neither, for
# the script's own message).
text_file() {
    local path
    for path in "$1" "$1.gz"; do
        [[ -f $path ]] && { echo "$path"; return; }
    done
    return 1
}

# first_lines N FILE: FILE's first N lines (0: all), FILE plain or .gz.
# awk, not head: head would close the pipe early, which pipefail reports.
first_lines() {
    if [[ $2 == *.gz ]]; then gzip -dc "$2"; else cat "$2"; fi |
        awk -v n="$1" 'n == 0 || NR <= n'
}

# stage_text LANG...: the raw text the example trains on, in WORK/raw/
# {train,valid,test}.LANG: the first TRAIN_LINES (training) and EVAL_LINES
# (validation, test) lines of DATA/{TRAIN,VALID,TEST}.LANG[.gz] (0: all), DATA
# as example_data sets it. The last language's test file is written last: its
# presence means the staging is complete, and a second run skips it.
stage_text() {
    local last=${*: -1} split name lines lang path
    # Staged before from the default data: done, without looking for it again.
    [[ -z ${DATA-} && -f $WORK/raw/test.$last ]] && { say "raw text: $WORK/raw exists, skipped"; return; }
    example_data "$@"
    for split in TRAIN VALID TEST; do
        for lang in "$@"; do
            text_file "$DATA/${!split}.$lang" >/dev/null ||
                die "DATA=$DATA has no ${!split}.$lang[.gz]: set DATA to a folder with $TRAIN, $VALID and $TEST .{${*// /,}}[.gz] (file names: TRAIN, VALID, TEST)"
        done
    done
    [[ -f $WORK/raw/test.$last ]] && { say "raw text: $WORK/raw exists, skipped"; return; }
    mkdir -p "$WORK/raw"
    for split in train valid test; do
        name=${split^^} && name=${!name}  # TRAIN, VALID, TEST
        lines=$([[ $split == train ]] && echo "$TRAIN_LINES" || echo "$EVAL_LINES")
        for lang in "$@"; do
            path=$(text_file "$DATA/$name.$lang")
            first_lines "$lines" "$path" >"$WORK/raw/$split.$lang.part"
            mv "$WORK/raw/$split.$lang.part" "$WORK/raw/$split.$lang"
        done
    done
    say "raw text: $(wc -l <"$WORK/raw/train.$1") training lines staged in $WORK/raw"
}

# in_id_order GEN HYP: the detokenised hypotheses (D-<id> lines) of
# fairseq-generate's output GEN, one a line in the order of the input (fairseq
# prints them by length), written to HYP (whole, or not at all).
in_id_order() {
    grep '^D-' "$1" | cut -c3- | LC_ALL=C sort -n -k1,1 | cut -f3 >"$2.part"
    mv "$2.part" "$2"
}

# generate_test DATA_BIN RUN: fairseq-generate of RUN/checkpoint_best.pt on the test split,
# beam $BEAM, into RUN/test.gen and, in sentence order, RUN/test.hyp.
# --required-batch-size-multiple 1: fairseq 0.12 drops a last partial batch otherwise.
# --max-len-a/-b: a barely trained model would otherwise ramble up to 200 tokens.
generate_test() {
    local data_bin=$1 run=$2
    logged "$run/generate.log" fairseq-generate "$data_bin" --user-dir fairseq_natbias \
        --path "$run/checkpoint_best.pt" --gen-subset test --beam "$BEAM" --lenpen 1 \
        --max-len-a 1.2 --max-len-b 10 --batch-size 128 --required-batch-size-multiple 1 \
        --remove-bpe sentencepiece --num-workers 0
    mv "$run/generate.log" "$run/test.gen"
    in_id_order "$run/test.gen" "$run/test.hyp"
}
