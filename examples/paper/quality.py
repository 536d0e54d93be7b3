"""sacreBLEU's corpus BLEU and chrF (its defaults) of detokenised text, each with
its signature (Post, 2018), without torch or fairseq."""

from typing import TYPE_CHECKING, Union

from natbias.errors import NaturalBiasError

if TYPE_CHECKING:  # sacreBLEU is imported where it scores, not on import
    from sacrebleu.metrics.bleu import BLEUScore


def check_pairs(hypotheses: list[str], references: list[str]) -> None:
    """Refuse a corpus whose sides differ in length, or an empty one."""
    if len(hypotheses) != len(references):
        raise NaturalBiasError(
            f"{len(hypotheses)} hypotheses but {len(references)} references: each "
            "hypothesis needs the reference of the same sentence (was an output cut short?)"
        )
    if not hypotheses:
        raise NaturalBiasError("no sentences to score: the hypotheses and references are empty")


def bleu_score(hypotheses: list[str], references: list[str]) -> tuple["BLEUScore", str]:
    """sacreBLEU's corpus BLEU (with ``.bp``, ``.sys_len``, ``.ref_len``,
    ``.precisions``) and its signature."""
    check_pairs(hypotheses, references)
    from sacrebleu.metrics import BLEU

    bleu = BLEU()
    score = bleu.corpus_score(hypotheses, [references])
    return score, str(bleu.get_signature())  # the signature is known once it has scored


def quality(hypotheses: list[str], references: list[str]) -> dict[str, Union[float, str]]:
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
