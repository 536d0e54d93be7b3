#!/usr/bin/env bash
# One multilingual model: AfroMT's Rundi<->English and Afrikaans<->English
# (the four directions of ../afromt, there four models) trained as ONE model
# with fairseq's multilingual task (--task translation_multi_simple_epoch
# --encoder-langtok src --decoder-langtok), the natural bias with one prior per
# target language (NATBIAS_PRIOR), against stock fairseq's transformer with the
# same sizes and task; each direction decoded with fairseq-generate
# --source-lang X --target-lang Y and scored with sacreBLEU.
#
#   pip install gdown && recipes/multilingual/run.sh         # download, train, evaluate
#   recipes/multilingual/run.sh --help                       # every setting, as it would be used
#   sbatch recipes/slurm.sbatch recipes/multilingual/run.sh   # the same on a cluster
#   SMOKE=1 PAIRS="en-de en-fr" RAW_DIR=/data/multi30k RAW_VALID=val \
#       RAW_TEST=test_2016_flickr recipes/multilingual/run.sh  # tiny CPU run, local text
#
# Any PAIRS over local text (RAW_DIR) make one model the same way; any other
# recipe does too with MULTILINGUAL=1 (ARCH=transformer_natbias and the sizes
# in MODEL_ARGS for its stock runs). Below: only where this recipe departs from
# ../defaults.sh, which lists every setting; the environment wins over both.
# [smoke: x] is its value under SMOKE=1 unless given in the environment.
set -euo pipefail

# --- data ----------------------------------------------------------------------
PAIRS=${PAIRS-"run-en af-en en-run en-af"}  # directions, SRC-TGT, all in one model
CLEAN_RATIO=${CLEAN_RATIO-0}            # ... or a length ratio above this (0: none; AfroMT is cleaned already)
SPM_MODEL=${SPM_MODEL-afromt}           # afromt: the authors' model, one for all its languages; a path; empty: train one on every language [smoke: empty]
WORK_DIR=${WORK_DIR-work/multilingual}  # everything the recipe makes

# --- model and training ------------------------------------------------------------
ARCH=${ARCH-transformer_natbias}        # 6+6 layers, 8 heads (fairseq's base; ../afromt gives Rundi 4), sizes in MODEL_ARGS: stock's transformer gets the same
MODEL_ARGS=${MODEL_ARGS-"--encoder-embed-dim 256 --decoder-embed-dim 256 --encoder-ffn-embed-dim 256 --decoder-ffn-embed-dim 256"}  # d 256 (ours), FFN 256 (sec. 4.1, AfroMT) [smoke: 2+2 layers, d 64, 2 heads]
INITS=${INITS-"unigram stock"}          # the natural bias, and stock fairseq with the same task and sizes
MULTILINGUAL=${MULTILINGUAL-1}          # one model over all PAIRS (translation_multi_simple_epoch), scored per direction
TOKENS_PER_UPDATE=${TOKENS_PER_UPDATE-8192}  # tokens per update on any hardware (ours: the AfroMT authors' 4096 x update-freq 2) [smoke: 1000]

# RECIPES_DIR: the repository's recipes/ (found from this file's place).
source "${RECIPES_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}/lib.sh" "$@"

RECIPE_NAME=Multilingual
DATASET=afromt
run_recipe
