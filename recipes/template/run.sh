#!/usr/bin/env bash
# Template for a new language pair: copy this folder, set SRC, TGT and RAW_DIR
# (and add RAW_VALID/RAW_TEST lines if your files are named otherwise), run it.
#
#   cp -r recipes/template recipes/fr_en && $EDITOR recipes/fr_en/run.sh
#   recipes/fr_en/run.sh --help                              # every setting, as it would be used
#   recipes/fr_en/run.sh                                     # train, evaluate
#   sbatch recipes/slurm.sbatch recipes/fr_en/run.sh          # the same on a cluster
#   SMOKE=1 recipes/fr_en/run.sh                              # tiny CPU run first
#
# RAW_DIR holds plain (or gzipped) untokenised text, one sentence a line, the
# two sides line-aligned: <name>.<SRC> and <name>.<TGT> for train, validation
# and test. The defaults (../defaults.sh) suit ~30k-300k pairs (an IWSLT-size
# model); for millions of pairs add the lines of recipes/wmt14_de_en/run.sh.
#
# Any other setting of ../defaults.sh may be added below in the same form,
# e.g. RAW_VALID=${RAW_VALID-val}; it then wins over the default. Any setting
# may also be given in the environment instead; it wins over both.
# [smoke: x] is its value under SMOKE=1 unless given in the environment.
set -euo pipefail

# --- data: set these three -------------------------------------------------------
SRC=${SRC-}                             # source language, as in the file names (e.g. fr)
TGT=${TGT-}                             # target language (e.g. en)
RAW_DIR=${RAW_DIR-}                     # folder with <name>.<lang>[.gz], or with <SRC>-<TGT>/ holding them
# --- data: the rest ---------------------------------------------------------------
SPM_VOCAB=${SPM_VOCAB-8000}             # joint vocabulary (ours; the paper: 20480 for IWSLT's 160k pairs, 32000 for WMT's 4.5M) [smoke: 1000]

# RECIPES_DIR: the repository's recipes/ (found from this file's place; set it
# if this copy lives outside the repository).
source "${RECIPES_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}/lib.sh" "$@"

[[ -n $SRC && -n $TGT && -n $RAW_DIR ]] ||
    die "set SRC, TGT and RAW_DIR at the top of $0 (or in the environment)"
RECIPE_NAME="$SRC-$TGT"
DATASET=""   # no download: the text is in RAW_DIR
run_recipe
