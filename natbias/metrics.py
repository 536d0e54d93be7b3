"""The one table of the statistics every engine logs (defined in
docs/options.md#the-training-log; :mod:`natbias.statistics` computes them):
fairseq's log hook and option help, the transformers and OLMo-core callbacks
and natbias-dynamics read it, and none names a statistic itself. Without
torch, so that the text-only tools can read it.
"""

from dataclasses import dataclass

# How ranks (and fairseq's micro-batches) combine a statistic:
TOKENS = "tokens"  # sums over target tokens and their count added, then divided once
SAME = "same"  # of b, W, g or beta, gathered: every rank holds the same value, not reduced


@dataclass(frozen=True)
class Metric:
    name: str
    label: str  # what it measures, as a plot's axis says
    unit: str  # "bits", or "" for a norm or a scalar
    reduce: str  # TOKENS or SAME
    digits: int  # decimals on fairseq's log lines


METRICS = {  # in the order fairseq prints them
    m.name: m
    for m in (
        Metric("kl_unigram", "KL(model || unigram)", "bits", TOKENS, 3),  # Fig. 1
        Metric("kl_uniform", "KL(model || uniform)", "bits", TOKENS, 3),  # Fig. 1
        Metric("weight_norm", "||g W||_F", "", SAME, 4),
        Metric("gain", "gain g on W phi", "", SAME, 4),
        Metric("bias_norm", "||b||_2", "", SAME, 4),  # Fig. 14
        Metric("bias_kl", "KL(softmax(b) || unigram)", "bits", SAME, 4),  # Fig. 13
        Metric("bigram_weight", "bigram residual's weight beta", "", SAME, 4),  # order 2
    )
}
# The statistics summed over target tokens (with a probe, or a forward pass).
PER_TOKEN = [name for name, metric in METRICS.items() if metric.reduce == TOKENS]
