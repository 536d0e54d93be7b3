#!/usr/bin/env bash
# The paper's Fig. 4 on your own models (Meister et al., 2023, sec. 4.2): each
# reference token's average log-probability against its log-unigram frequency
# in the training data, in equal-width bins, for a zero-bias and a
# unigram-bias model; upper row with all parameters, lower row with the bias
# dropped (W phi alone, the contextual part of eq. 4).
#
#   examples/translation/run.sh                      # first: trains runs/unigram and runs/zero
#   examples/frequency_analysis/run.sh
#   MODELS="zero=ckpt/zero.pt unigram=ckpt/uni.pt" DATA_BIN=data-bin examples/frequency_analysis/run.sh
#
# Runs examples/paper/frequency.py, which writes to
# OUT: frequency.png (the figure), frequency_bins.csv (one row per model and
# bin) and frequency_tokens.csv (one row per model and token type); then
# prints the bins as a table. Skipped when OUT/frequency.png exists.
set -euo pipefail

TRANSLATION_WORK=${TRANSLATION_WORK-work/examples/translation}  # WORK of examples/translation/run.sh
DATA_BIN=${DATA_BIN-$TRANSLATION_WORK/data-bin}  # the data directory the models were trained on
MODELS=${MODELS-"zero=$TRANSLATION_WORK/runs/zero/checkpoint_best.pt unigram=$TRANSLATION_WORK/runs/unigram/checkpoint_best.pt"}  # LABEL=CHECKPOINT ..., one column of the figure each
SPLIT=${SPLIT-test}                 # binarised split whose reference tokens are scored
BINS=${BINS-20}                     # equal-width bins of log-unigram frequency
OUT=${OUT-work/examples/frequency_analysis}  # where the figure and tables go

# The examples' shared plumbing: --help, say, die.
source "$(dirname "$0")/../common.sh"
example_help "$@"
example_needs fairseq-train fairseq_natbias

# --- what this needs: a data directory, natural-bias checkpoints ----------------------------
[[ -d $DATA_BIN ]] || die "DATA_BIN=$DATA_BIN: no such data directory; run examples/translation/run.sh first, or set DATA_BIN to the models' fairseq data directory"
model_args=()
checkpoints=()
for spec in $MODELS; do
    [[ $spec == *=* ]] || die "MODELS: '$spec' is not LABEL=CHECKPOINT"
    checkpoint=${spec#*=}
    [[ -f $checkpoint ]] || die "$checkpoint: no such checkpoint; run examples/translation/run.sh first (INITS=\"unigram zero\"), or set MODELS=\"LABEL=CHECKPOINT ...\""
    model_args+=(--model "$spec")
    checkpoints+=("$checkpoint")
done
[[ ${#checkpoints[@]} -gt 0 ]] || die "MODELS is empty: give LABEL=CHECKPOINT pairs"
# One line, no traceback, for a file that is not a natural-bias checkpoint.
python - "${checkpoints[@]}" <<'EOF' || exit 1
import sys, warnings
warnings.filterwarnings("ignore")
from natbias.errors import NaturalBiasError
from fairseq_natbias.natural_bias import check_natbias_checkpoint
try:
    for path in sys.argv[1:]:
        check_natbias_checkpoint(path)
except NaturalBiasError as error:
    sys.exit(f"examples/frequency_analysis/run.sh: error: {error}")
EOF

# --- the figure and its tables ---------------------------------------------------------------------
if [[ -f $OUT/frequency.png ]]; then
    say "frequency.py: $OUT/frequency.png exists, skipped (remove it to redo)"
else
    say "frequency.py: scoring the $SPLIT split of $DATA_BIN with ${#checkpoints[@]} models"
    mkdir -p "$OUT"
    python "$REPO/examples/paper/frequency.py" "$DATA_BIN" "${model_args[@]}" --gen-subset "$SPLIT" --bins "$BINS" \
        --out-dir "$OUT" 2>"$OUT/frequency.log" ||
        { tail -n 5 "$OUT/frequency.log" >&2; exit 1; }
fi

# --- the bins side by side: mean log-probability (natural log) by log-unigram bin -------------------------
python - "$OUT/frequency_bins.csv" <<'EOF'
import csv, sys
from collections import defaultdict

rows = list(csv.DictReader(open(sys.argv[1], encoding="utf-8")))
models = list(dict.fromkeys(row["model"] for row in rows))
by_bin = defaultdict(dict)
for row in rows:
    by_bin[int(row["bin"])][row["model"]] = row
print("mean log p of reference tokens by log-unigram bin (full model / bias dropped):")
print(f"{'bin centre':>10}" + "".join(f"{m + ' full':>16}{m + ' -b':>14}" for m in models))
for b in sorted(by_bin):
    centre = float(next(iter(by_bin[b].values()))["bin_center"])
    cells = ""
    for m in models:
        row = by_bin[b].get(m)
        cells += (f"{float(row['mean_logprob_full']):>16.3f}{float(row['mean_logprob_without_bias']):>14.3f}"
                  if row else f"{'':>16}{'':>14}")
    print(f"{centre:>10.2f}" + cells)
EOF
say "figure: $OUT/frequency.png; tables: $OUT/frequency_bins.csv, $OUT/frequency_tokens.csv"
