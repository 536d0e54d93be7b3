#!/usr/bin/env bash
# AfroMT Rundi<->English and Afrikaans<->English (Meister et al., 2023,
# sec. 4.1, Fig. 2): the natural-bias grid (unigram / zero / none x 5 seeds)
# on AfroMT as Reid et al. (2021) ship it, with their SentencePiece model. No
# out-of-domain test (the paper has none for AfroMT).
#
#   pip install gdown && recipes/afromt/run.sh               # download, train, evaluate
#   recipes/afromt/run.sh --help                             # every setting, as it would be used
#   sbatch recipes/slurm.sbatch recipes/afromt/run.sh         # the same on a cluster
#   SMOKE=1 PAIRS=de-en RAW_DIR=/data/multi30k RAW_VALID=val RAW_TEST=test_2016_flickr \
#       recipes/afromt/run.sh                                # tiny CPU run, local text
#
# RAW_DIR=<the extracted afromt/> uses a local copy of the data instead of the
# download. Below: only where this recipe departs from ../defaults.sh, which
# lists every setting. Any setting may be given in the environment instead; it
# wins over both. [smoke: x] is its value under SMOKE=1 unless given in the
# environment; "ours" marks choices the paper leaves open (fairseq's usual
# values for data of this size).
set -euo pipefail

# --- data ----------------------------------------------------------------------
PAIRS=${PAIRS-"run-en en-run af-en en-af"}  # directions, SRC-TGT
CLEAN_RATIO=${CLEAN_RATIO-0}            # ... or a length ratio above this (0: none; AfroMT is cleaned already)
SPM_MODEL=${SPM_MODEL-afromt}           # afromt: the authors' model (paper, footnote 8); a path; empty: train a joint one [smoke: empty]
WORK_DIR=${WORK_DIR-work/afromt}        # everything the recipe makes

# --- model and training ------------------------------------------------------------
ARCH=${ARCH-transformer_natbias_afromt}  # 6+6 layers, 8 heads (4 for Rundi, below), FFN 256 (sec. 4.1), d 256 (ours)
TOKENS_PER_UPDATE=${TOKENS_PER_UPDATE-8192}  # tokens per update on any hardware (ours: the AfroMT authors' 4096 x update-freq 2) [smoke: 1000]
UNIGRAM_LS_INITS=${UNIGRAM_LS_INITS-unigram}  # also unigram-unigram-ls runs: the small-corpus setting (docs/criteria.md; not in the paper; UNIGRAM_LS_INITS= skips them)

# RECIPES_DIR: the repository's recipes/ (found from this file's place).
source "${RECIPES_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}/lib.sh" "$@"

# The Rundi models have 4 attention heads per layer, the others 8 (sec. 4.1).
recipe_model_args() {
    if [[ $SRC == run || $TGT == run ]]; then
        echo --encoder-attention-heads 4 --decoder-attention-heads 4
    fi
}

RECIPE_NAME=AfroMT
DATASET=afromt
run_recipe
