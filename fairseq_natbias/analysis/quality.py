"""Translation quality of detokenised text: sacreBLEU's corpus BLEU and chrF,
each with its signature (Post, 2018: a score is reported with the settings
that produced it, so that two papers' numbers can be compared).

BLEU (Papineni et al., 2002), with one reference per sentence::

    BLEU = BP * exp( 1/4 sum_{n=1}^{4} log p_n ),  BP = min(1, exp(1 - r / c))

p_n the corpus-level clipped n-gram precision, r and c the reference and
hypothesis lengths in ``13a`` tokens. chrF (Popović, 2015) is the character
n-gram F-score with beta = 2. Both are sacreBLEU's defaults, untouched.

Its own module, free of torch and fairseq: the orchestrators that run fairseq
only in subprocesses (``natbias-demo``, the learning-efficiency study) score
with it without importing either (``TEXT_ONLY_PROGRAMS``).
"""

from typing import TYPE_CHECKING, Dict, List, Tuple, Union

from fairseq_natbias.analysis import AnalysisError

if TYPE_CHECKING:  # sacreBLEU is imported where it scores, not on import
    from sacrebleu.metrics.bleu import BLEUScore


def check_pairs(hypotheses: List[str], references: List[str]) -> None:
    """Refuse a corpus whose sides differ in length, or an empty one."""
    if len(hypotheses) != len(references):
        raise AnalysisError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: each "
            "hypothesis needs the reference of the same sentence (was an output cut short?)")
    if not hypotheses:
        raise AnalysisError("no sentences to score: the hypotheses and references are empty")


def bleu_score(hypotheses: List[str], references: List[str]) -> Tuple["BLEUScore", str]:
    """sacreBLEU's corpus BLEU (its defaults) and its signature. The score
    keeps the parts BLEU is made of, ``.score``, ``.bp`` (BP), ``.sys_len``
    (c), ``.ref_len`` (r) and ``.precisions`` (p_1..p_4, x 100), so that a
    caller can split a BLEU difference into length and words."""
    check_pairs(hypotheses, references)
    from sacrebleu.metrics import BLEU

    bleu = BLEU()
    score = bleu.corpus_score(hypotheses, [references])
    return score, str(bleu.get_signature())  # the signature is known once it has scored


def quality(hypotheses: List[str], references: List[str]) -> Dict[str, Union[float, str]]:
    """``{"BLEU", "chrF", "bleu_signature", "chrf_signature"}`` of a corpus."""
    bleu, bleu_signature = bleu_score(hypotheses, references)
    from sacrebleu.metrics import CHRF

    chrf = CHRF()
    return {
        "BLEU": bleu.score,
        "chrF": chrf.corpus_score(hypotheses, [references]).score,
        "bleu_signature": bleu_signature,
        "chrf_signature": str(chrf.get_signature()),
    }
