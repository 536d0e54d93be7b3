"""The one table of the logged statistics (:mod:`natbias.statistics` computes
them), read by every engine's log and natbias-dynamics; torch-free, for the tools."""

from typing import NamedTuple


class Metric(NamedTuple):
    label: str  # what it measures, as a plot's axis says
    unit: str  # "bits", or "" for a norm or a scalar
    # Over ranks (and fairseq's micro-batches): "tokens", sums over target tokens
    # and their count added, divided once; "same", equal on every rank (gathered).
    reduce: str
    digits: int  # decimals on fairseq's log lines


METRICS = {  # in the order fairseq prints them
    "kl_unigram": Metric("KL(model || unigram)", "bits", "tokens", 3),  # Fig. 1
    "kl_uniform": Metric("KL(model || uniform)", "bits", "tokens", 3),  # Fig. 1
    "weight_norm": Metric("||g W||_F", "", "same", 4),
    "gain": Metric("gain g on W phi", "", "same", 4),
    "bias_norm": Metric("||b||_2", "", "same", 4),  # Fig. 14
    "bias_kl": Metric("KL(softmax(b) || unigram)", "bits", "same", 4),  # Fig. 13
    "bigram_weight": Metric("bigram residual's weight beta", "", "same", 4),  # order 2
}


def per_token() -> list[str]:
    """The statistics summed over target tokens (read when used: the table may grow)."""
    return [name for name, metric in METRICS.items() if metric.reduce == "tokens"]
