#!/usr/bin/env bash
# WMT'14 German->English (Meister et al., 2023, sec. 4.1, App. A.2, Figs. 7-8):
# the natural-bias grid (unigram / zero / none x 5 seeds) on ~4.5M pairs,
# scored on newstest2014 and on the IWSLT'14 test set (out of domain, A.5).
#
#   recipes/wmt14_de_en/run.sh                               # download (~1.5 GB), train, evaluate
#   sbatch --nodes=2 recipes/slurm.sbatch recipes/wmt14_de_en/run.sh   # 2 nodes, same batch
#   SMOKE=1 OOD_TEST= RAW_DIR=/data/multi30k RAW_VALID=val RAW_TEST=test_2016_flickr \
#       recipes/wmt14_de_en/run.sh                          # tiny CPU run, local text
#
# Every setting below may be given in the environment instead. [smoke: x] is
# its value under SMOKE=1 unless given; "ours" marks choices the paper leaves
# open (fairseq's usual values for data of this size).
set -euo pipefail
# RECIPES_DIR: the repository's recipes/ (found from this file's place).
source "${RECIPES_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}/lib.sh"

# --- data ----------------------------------------------------------------------
PAIRS=${PAIRS-"de-en"}                  # directions, SRC-TGT (the paper: De->En; add en-de for both)
RAW_DIR=${RAW_DIR-}                     # local raw text instead of the download: RAW_DIR[/<pair>]/<name>.<lang>[.gz]
RAW_TRAIN=${RAW_TRAIN-train}            # <name> of the training text
RAW_VALID=${RAW_VALID-valid}            # <name> of the validation text (download: newstest2013)
RAW_TEST=${RAW_TEST-test}               # <name> of the test text (download: newstest2014)
OOD_TEST=${OOD_TEST-iwslt14}            # out-of-domain test (A.5): iwslt14, wmt14, PATH/<name> prefix, or empty
TRAIN_LINES=${TRAIN_LINES-0}            # first N training pairs only (0: all) [smoke: 3000]
EVAL_LINES=${EVAL_LINES-0}              # first N validation/test pairs only (0: all) [smoke: 50]
CLEAN_MAX_WORDS=${CLEAN_MAX_WORDS-250}  # drop training pairs with a side longer than this (prepare-wmt14en2de.sh)
CLEAN_RATIO=${CLEAN_RATIO-1.5}          # ... or a length ratio above this (prepare-wmt14en2de.sh)
SPM_MODEL=${SPM_MODEL-}                 # SentencePiece model to use; empty: train a joint one
SPM_VOCAB=${SPM_VOCAB-32000}            # joint vocabulary size (paper, footnote 8) [smoke: 1000]
SPM_SENTENCES=${SPM_SENTENCES-5000000}  # sentences SentencePiece trains on, sampled (ours: bounds its memory)
WORK_DIR=${WORK_DIR-work/wmt14_de_en}   # everything the recipe makes

# --- model and training ------------------------------------------------------------
ARCH=${ARCH-transformer_natbias_wmt_en_de}  # 6+6 layers, 8 heads, FFN 512 (sec. 4.1), d 512 (ours)
MODEL_ARGS=${MODEL_ARGS-}               # extra model options [smoke: 2+2 layers, d 64, 2 heads]
INITS=${INITS-"unigram zero none"}      # output-bias inits compared (sec. 4.1)
SEEDS=${SEEDS-"1 2 3 4 5"}              # seeds per init (paper: 5) [smoke: 1 2]
LR=${LR-7e-4}                           # peak learning rate (ours: fairseq's transformer-base WMT runs) [smoke: 1e-3]
WARMUP=${WARMUP-4000}                   # inverse-sqrt warm-up updates (ours: fairseq's) [smoke: 10]
WEIGHT_DECAY=${WEIGHT_DECAY-0.0}        # (ours: fairseq's WMT example)
TOKENS_PER_UPDATE=${TOKENS_PER_UPDATE-32768}  # tokens per update on any hardware (ours: 8 GPUs x 4096, ~Vaswani et al.'s 25k+25k) [smoke: 1000]
MAX_TOKENS=${MAX_TOKENS-4096}           # tokens per GPU (or CPU worker) per step [smoke: 1000]
UPDATE_FREQ=${UPDATE_FREQ-}             # steps per update; empty: TOKENS_PER_UPDATE / (MAX_TOKENS x workers), rounded up
MAX_EPOCH=${MAX_EPOCH-0}                # upper bound on epochs (0: none) [smoke: 0]
MAX_UPDATE=${MAX_UPDATE-300000}         # upper bound on updates; early stopping ends runs sooner (ours) [smoke: 30]
PATIENCE=${PATIENCE-10}                 # stop after N validations without a better BLEU (ours)
SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES-2000}  # validate and save every N updates too: an epoch is ~5k updates (ours) [smoke: 0]
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

RECIPE_NAME="WMT'14"
DATASET=wmt14
run_recipe
