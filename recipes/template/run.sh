#!/usr/bin/env bash
# Template for a new language pair: copy this folder, set SRC, TGT and RAW_DIR
# (and RAW_VALID/RAW_TEST if your files are named otherwise), run it.
#
#   cp -r recipes/template recipes/fr_en && $EDITOR recipes/fr_en/run.sh
#   recipes/fr_en/run.sh                                     # train, evaluate
#   sbatch recipes/slurm.sbatch recipes/fr_en/run.sh          # the same on a cluster
#   SMOKE=1 recipes/fr_en/run.sh                              # tiny CPU run first
#
# RAW_DIR holds plain (or gzipped) untokenised text, one sentence a line, the
# two sides line-aligned: <name>.<SRC> and <name>.<TGT> for train, validation
# and test. The defaults suit ~30k-300k pairs (an IWSLT-size model); for
# millions of pairs take the values of recipes/wmt14_de_en/run.sh.
#
# Every setting below may be given in the environment instead. [smoke: x] is
# its value under SMOKE=1 unless given; "ours" marks choices the paper leaves
# open (fairseq's usual values for data of this size).
set -euo pipefail
# RECIPES_DIR: the repository's recipes/ (found from this file's place; set it
# if this copy lives outside the repository).
source "${RECIPES_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}/lib.sh"

# --- data: set these three -------------------------------------------------------
SRC=${SRC-}                             # source language, as in the file names (e.g. fr)
TGT=${TGT-}                             # target language (e.g. en)
RAW_DIR=${RAW_DIR-}                     # folder with <name>.<lang>[.gz], or with <SRC>-<TGT>/ holding them
# --- data: the rest ---------------------------------------------------------------
PAIRS=${PAIRS-"$SRC-$TGT"}              # directions, SRC-TGT ("$SRC-$TGT $TGT-$SRC" for both)
RAW_TRAIN=${RAW_TRAIN-train}            # <name> of the training text
RAW_VALID=${RAW_VALID-valid}            # <name> of the validation text (early stopping)
RAW_TEST=${RAW_TEST-test}               # <name> of the test text
OOD_TEST=${OOD_TEST-}                   # out-of-domain test (A.5): PATH/<name> prefix, wmt14, iwslt14, or empty
TRAIN_LINES=${TRAIN_LINES-0}            # first N training pairs only (0: all) [smoke: 3000]
EVAL_LINES=${EVAL_LINES-0}              # first N validation/test pairs only (0: all) [smoke: 50]
CLEAN_MAX_WORDS=${CLEAN_MAX_WORDS-250}  # drop training pairs with a side longer than this
CLEAN_RATIO=${CLEAN_RATIO-9}            # ... or a length ratio above this (clean-corpus-n.perl's default)
SPM_MODEL=${SPM_MODEL-}                 # SentencePiece model to use; empty: train a joint one
SPM_VOCAB=${SPM_VOCAB-8000}             # joint vocabulary (ours; the paper: 20480 for IWSLT's 160k pairs, 32000 for WMT's 4.5M) [smoke: 1000]
SPM_SENTENCES=${SPM_SENTENCES-0}        # sentences SentencePiece trains on (0: all)
WORK_DIR=${WORK_DIR-work/${SRC}_${TGT}} # everything the recipe makes

# --- model and training ------------------------------------------------------------
ARCH=${ARCH-transformer_natbias_iwslt_de_en}  # 6+6 layers, 4 heads, FFN 256 (the paper's IWSLT model), d 256 (ours)
MODEL_ARGS=${MODEL_ARGS-}               # extra model options [smoke: 2+2 layers, d 64, 2 heads]
INITS=${INITS-"unigram zero none"}      # output-bias inits compared (sec. 4.1)
SEEDS=${SEEDS-"1 2 3 4 5"}              # seeds per init (paper: 5) [smoke: 1 2]
LR=${LR-5e-4}                           # peak learning rate (ours: fairseq's IWSLT'14 example) [smoke: 1e-3]
WARMUP=${WARMUP-4000}                   # inverse-sqrt warm-up updates (ours: fairseq's) [smoke: 10]
WEIGHT_DECAY=${WEIGHT_DECAY-0.0001}     # (ours: fairseq's IWSLT'14 example)
TOKENS_PER_UPDATE=${TOKENS_PER_UPDATE-4096}  # tokens per update on any hardware (ours: fairseq's example, 1 GPU x 4096) [smoke: 1000]
MAX_TOKENS=${MAX_TOKENS-4096}           # tokens per GPU (or CPU worker) per step [smoke: 1000]
UPDATE_FREQ=${UPDATE_FREQ-}             # steps per update; empty: TOKENS_PER_UPDATE / (MAX_TOKENS x workers), rounded up
MAX_EPOCH=${MAX_EPOCH-100}              # upper bound; early stopping ends runs sooner [smoke: 0 = none]
MAX_UPDATE=${MAX_UPDATE-0}              # upper bound on updates (0: none) [smoke: 30]
PATIENCE=${PATIENCE-10}                 # stop after N validations without a better BLEU (ours)
SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES-0}  # also validate and save every N updates (0: once per epoch)
LOG_INTERVAL=${LOG_INTERVAL-100}        # training log every N updates [smoke: 5]
FP16=${FP16-1}                          # mixed precision on GPUs (1/0)
TRAIN_ARGS=${TRAIN_ARGS-}               # extra fairseq-train options, given last
EXTERNAL_TEXT=${EXTERNAL_TEXT-}         # A.7: add --natbias-init file runs, counted on this raw text ({lang}: TGT) or c4[:N] (N C4 English shards)
UNIGRAM_REG_WEIGHT=${UNIGRAM_REG_WEIGHT-}     # A.4: lambda; when set, add <init>-unireg runs
UNIGRAM_REG_UPDATES=${UNIGRAM_REG_UPDATES-4000}  # A.4: regularised updates before the standard objective (ours)
UNIGRAM_REG_INITS=${UNIGRAM_REG_INITS-none}   # A.4: inits it is tried with

# --- evaluation ------------------------------------------------------------------------
BEAM=${BEAM-5}                          # beam size for validation BLEU and test (sec. 4.1)
LENPEN=${LENPEN-1}                      # 1: beam scores divided by length, i.e. length-normalised (sec. 4.1)
MAX_LEN_A=${MAX_LEN_A-0}                # decode at most MAX_LEN_A x source length + MAX_LEN_B tokens [smoke: 1.2]
MAX_LEN_B=${MAX_LEN_B-200}              # (fairseq's defaults, validation and test alike) [smoke: 10]

# --- hardware ---------------------------------------------------------------------------
NGPUS=${NGPUS-}                         # GPUs per node; empty: all visible; 0: CPU [smoke: 0]
NNODES=${NNODES-1}                      # nodes (GPUs only)
NODE_RANK=${NODE_RANK-0}                # this node's rank, 0..NNODES-1
MASTER_ADDR=${MASTER_ADDR-127.0.0.1}    # node 0's address
MASTER_PORT=${MASTER_PORT-}             # node 0's port; empty: a free one (1 node) or 29500
CPU_WORKERS=${CPU_WORKERS-1}            # training processes when NGPUS=0 (gloo)

# --- what to run ---------------------------------------------------------------------------
STEPS=${STEPS-"prepare train evaluate report"}  # any of these, in this order
GRID_TASK=${GRID_TASK-}                 # only the k-th run of the grid, 0-based (job arrays)
RUNS_NAME=${RUNS_NAME-runs}             # runs go to WORK_DIR/<pair>/RUNS_NAME/<init>/seed<k>
SMOKE=${SMOKE-0}                        # 1: the same steps, tiny, on CPU

[[ -n $SRC && -n $TGT && -n $RAW_DIR ]] ||
    die "set SRC, TGT and RAW_DIR at the top of $0 (or in the environment)"
RECIPE_NAME="$SRC-$TGT"
DATASET=""   # no download: the text is in RAW_DIR
run_recipe
