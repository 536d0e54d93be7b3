#!/usr/bin/env bash
# IWSLT'14 German<->English (Meister et al., 2023, sec. 4.1, Figs. 2-6, 9-16):
# the natural-bias grid (unigram / zero / none x 5 seeds) in both directions,
# scored on the IWSLT test set and on WMT'14 newstest2014 (out of domain, A.5).
#
#   recipes/iwslt14_de_en/run.sh                               # download, train, evaluate
#   recipes/iwslt14_de_en/run.sh --help                        # every setting, as it would be used
#   sbatch recipes/slurm.sbatch recipes/iwslt14_de_en/run.sh    # the same on a cluster
#   SMOKE=1 OOD_TEST= RAW_DIR=/data/multi30k RAW_VALID=val RAW_TEST=test_2016_flickr \
#       recipes/iwslt14_de_en/run.sh                           # tiny CPU run, local text
#
# Below: only where this recipe departs from ../defaults.sh, which lists every
# setting (the model and training defaults there are this recipe's). Any
# setting may be given in the environment instead; it wins over both.
set -euo pipefail

# --- data ----------------------------------------------------------------------
PAIRS=${PAIRS-"de-en en-de"}            # directions, SRC-TGT
OOD_TEST=${OOD_TEST-wmt14}              # out-of-domain test (A.5): wmt14 (newstest2014), iwslt14, PATH/<name> prefix, or empty
CLEAN_MAX_WORDS=${CLEAN_MAX_WORDS-175}  # drop training pairs with a side longer than this (prepare-iwslt14.sh)
WORK_DIR=${WORK_DIR-work/iwslt14_de_en} # everything the recipe makes

# RECIPES_DIR: the repository's recipes/ (found from this file's place).
source "${RECIPES_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}/lib.sh" "$@"

RECIPE_NAME="IWSLT'14"
DATASET=iwslt14
run_recipe
