#!/usr/bin/env bash
# WMT'14 German->English (Meister et al., 2023, sec. 4.1, App. A.2, Figs. 7-8):
# the natural-bias grid (unigram / zero / none x 5 seeds) on ~4.5M pairs,
# validated on newstest2013, scored on newstest2014 and on the IWSLT'14 test
# set (out of domain, A.5).
#
#   recipes/wmt14_de_en/run.sh                               # download (~1.5 GB), train, evaluate
#   recipes/wmt14_de_en/run.sh --help                        # every setting, as it would be used
#   sbatch --nodes=2 recipes/slurm.sbatch recipes/wmt14_de_en/run.sh   # 2 nodes, same batch
#   SMOKE=1 OOD_TEST= RAW_DIR=/data/multi30k RAW_VALID=val RAW_TEST=test_2016_flickr \
#       recipes/wmt14_de_en/run.sh                          # tiny CPU run, local text
#
# Below: only where this recipe departs from ../defaults.sh, which lists every
# setting. Any setting may be given in the environment instead; it wins over
# both. [smoke: x] is its value under SMOKE=1 unless given in the environment;
# "ours" marks choices the paper leaves open (fairseq's usual values for data
# of this size).
set -euo pipefail

# --- data ----------------------------------------------------------------------
PAIRS=${PAIRS-"de-en"}                  # directions, SRC-TGT (the paper: De->En; add en-de for both)
OOD_TEST=${OOD_TEST-iwslt14}            # out-of-domain test (A.5): iwslt14, wmt14, PATH/<name> prefix, or empty
CLEAN_RATIO=${CLEAN_RATIO-1.5}          # ... or a length ratio above this (prepare-wmt14en2de.sh)
SPM_VOCAB=${SPM_VOCAB-32000}            # joint vocabulary size (paper, footnote 8) [smoke: 1000]
SPM_SENTENCES=${SPM_SENTENCES-5000000}  # sentences SentencePiece trains on, sampled (ours: bounds its memory)
WORK_DIR=${WORK_DIR-work/wmt14_de_en}   # everything the recipe makes

# --- model and training ------------------------------------------------------------
ARCH=${ARCH-transformer_natbias_wmt_en_de}  # 6+6 layers, 8 heads, FFN 512 (sec. 4.1), d 512 (ours)
LR=${LR-7e-4}                           # peak learning rate (ours: fairseq's transformer-base WMT runs) [smoke: 1e-3]
WEIGHT_DECAY=${WEIGHT_DECAY-0.0}        # (ours: fairseq's WMT example)
TOKENS_PER_UPDATE=${TOKENS_PER_UPDATE-32768}  # tokens per update on any hardware (ours: 8 GPUs x 4096, ~Vaswani et al.'s 25k+25k) [smoke: 1000]
MAX_EPOCH=${MAX_EPOCH-0}                # upper bound on epochs (0: none) [smoke: 0]
MAX_UPDATE=${MAX_UPDATE-300000}         # upper bound on updates; early stopping ends runs sooner (ours) [smoke: 30]
SAVE_INTERVAL_UPDATES=${SAVE_INTERVAL_UPDATES-2000}  # validate and save every N updates too: an epoch is ~5k updates (ours) [smoke: 0]

# RECIPES_DIR: the repository's recipes/ (found from this file's place).
source "${RECIPES_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}/lib.sh" "$@"

RECIPE_NAME="WMT'14"
DATASET=wmt14
run_recipe
