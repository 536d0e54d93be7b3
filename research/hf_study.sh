#!/usr/bin/env bash
# The learning-efficiency study in Hugging Face transformers: the arms of
# examples/huggingface/translate.py (stock, natbias, natbias+unigram-ls,
# stock+unigram-ls) on Multi30k PAIR (de-en or fr-en), 3 seeds:
#   the full corpus to 1,000 updates (validation every 50), then
#   the first 3,000 pairs (vocabulary 2,500) past the best: validation every
#   100 updates, stopped after 5 validations without a lower NLL (6,000 at most),
# the fairseq study's two settings at its model size (2+2 layers, d 128).
# With lm-en or lm-de: examples/huggingface/language_model.py on that side of
# Multi30k, stock and natbias, 3 seeds, 1,000 updates (validation every 50).
# One run at a time, one thread; finished runs are skipped, interrupted ones
# resume. Run two side by side:
#   research/hf_study.sh de-en & research/hf_study.sh fr-en &
# then the tables and plots:
#   python examples/huggingface/report.py WORK/de-en-full WORK/fr-en-full \
#       --out research/results/hf_full_1000.md
#   python examples/huggingface/report.py WORK/de-en-n3000 WORK/fr-en-n3000 \
#       --out research/results/hf_n3000.md
#   python examples/huggingface/report.py WORK/lm-en WORK/lm-de \
#       --out research/results/hf_lm_1000.md
set -euo pipefail
pair=$1
WORK=${WORK-work/hf_study}
MULTI30K=${MULTI30K-../shared/data/multi30k}
here=$(cd "$(dirname "$0")/.." && pwd)
export OMP_NUM_THREADS=1 HF_HUB_DISABLE_PROGRESS_BARS=1
src=${pair%-*}
mkdir -p "$WORK"
if [[ $pair == lm-* ]]; then
    for seed in 1 2 3; do
        for bias in none natural; do
            python "$here/examples/huggingface/language_model.py" --data "$MULTI30K" \
                --lang "${pair#lm-}" --work "$WORK/$pair" --bias $bias --seed "$seed" \
                >>"$WORK/log.$pair" 2>&1
        done
    done
    exit 0
fi
run() {  # WORK-NAME LOG ARGS...: one run of translate.py
    local name=$1; shift
    python "$here/examples/huggingface/translate.py" --data "$MULTI30K" --src "$src" --tgt en \
        --work "$WORK/$pair-$name" --test-sets test test_2017_flickr "$@" >>"$WORK/log.$pair-$name" 2>&1
}
arm() {  # ARM -> translate.py's --bias and --label-smoothing
    case $1 in
        stock) echo "--bias none --label-smoothing uniform" ;;
        natbias) echo "--bias natural --label-smoothing uniform" ;;
        natbias+unigram-ls) echo "--bias natural --label-smoothing unigram" ;;
        stock+unigram-ls) echo "--bias none --label-smoothing unigram" ;;
    esac
}
for seed in 1 2 3; do
    for a in stock natbias natbias+unigram-ls stock+unigram-ls; do
        # shellcheck disable=SC2046
        run full $(arm "$a") --seed "$seed" --max-steps 1000 --eval-every 50
    done
done
for seed in 1 2 3; do
    for a in stock natbias+unigram-ls stock+unigram-ls natbias; do
        # shellcheck disable=SC2046
        run n3000 $(arm "$a") --seed "$seed" --train-pairs 3000 --vocab 2500 \
            --max-steps 6000 --eval-every 100 --patience 5
    done
done
