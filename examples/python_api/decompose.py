"""Load a natural-bias model with fairseq's hub, translate a sentence, and split
each output token's log-probability into what the output bias (frequency)
and what the contextual logits g W phi contribute (Meister et al., 2023, eq. 4,
made exact by fairseq_natbias.analysis.decomposition):

    log p(y) = log p_Wphi(y) + log p_b(y) - log sum_v p_Wphi(v) p_b(v)
               [context]        [frequency]  [normaliser]

    python examples/python_api/decompose.py             # the model of examples/translation
    python examples/python_api/decompose.py --sentence "Ein Hund rennt über die Wiese."
    python examples/python_api/decompose.py --reference "A dog runs across the meadow."
    python examples/python_api/decompose.py --checkpoint LM/checkpoint_best.pt \\
        --data-bin LM/data-bin --spm-model LM/spm.model --sentence "A dog runs."

With a language-model checkpoint (transformer_lm_natbias) the sentence itself
is decomposed, teacher-forced. Paths default to those examples/translation/run.sh
writes under $WORK (default work/examples/translation).
"""

import argparse
import logging
import os
import sys
import warnings

# examples/paper: the paper's analyses and the demo's helpers, not installed
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "paper"))

DEFAULT_SENTENCE = "Zwei Männer spielen Fußball auf einer grünen Wiese."
LEGEND = """log p(y) = context + frequency + normaliser   (eq. 4, exact; natural logarithms)
  context    = log softmax(g W phi)_y            what the context alone says
  frequency  = log softmax(b)_y                  how frequent y is: the bias alone
  normaliser = -log sum_v p_Wphi(v) p_b(v) >= 0  the same for every candidate y at a position"""


def parse_args(argv=None):
    work = os.environ.get("WORK", "work/examples/translation")
    parser = argparse.ArgumentParser(
        prog="decompose.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--checkpoint",
        default=f"{work}/runs/unigram/checkpoint_best.pt",
        help="transformer_natbias or transformer_lm_natbias checkpoint (default: %(default)s)",
    )
    parser.add_argument(
        "--data-bin",
        default=f"{work}/data-bin",
        help="the model's fairseq data directory, for its dictionaries (default: %(default)s)",
    )
    parser.add_argument(
        "--spm-model",
        default=f"{work}/spm.model",
        help="SentencePiece model of the training text (default: %(default)s)",
    )
    parser.add_argument(
        "--sentence",
        default=DEFAULT_SENTENCE,
        help="source sentence to translate (language model: the text to score)",
    )
    parser.add_argument(
        "--reference",
        help="decompose this target text (teacher-forced) instead of the model's own translation",
    )
    parser.add_argument("--beam", type=int, default=5, help="beam size (default: %(default)s)")
    parser.add_argument("--cpu", action="store_true", help="stay on the CPU even with a GPU")
    return parser.parse_args(argv)


def run(args):
    import decomposition
    import torch
    from fairseq.models import FairseqEncoderDecoderModel

    hub = decomposition.load_model(args.checkpoint, args.data_bin, args.spm_model)
    if torch.cuda.is_available() and not args.cpu:
        hub.cuda()
    model = hub.models[0]
    is_translation = isinstance(model, FairseqEncoderDecoderModel)
    print(f"checkpoint: {args.checkpoint} ({describe(hub)})")
    if is_translation:
        source = hub.encode(args.sentence)
        if args.reference:
            target = hub.tgt_dict.encode_line(
                hub.apply_bpe(hub.tokenize(args.reference)), add_if_not_exist=False
            ).long()
            label, beam_scores = "reference (teacher-forced)", None
        else:
            best = hub.generate(source, beam=args.beam)[0]
            target, beam_scores = best["tokens"], best["positional_scores"]
            label = f"translation (beam {args.beam})"
        print(f"source:      {args.sentence}")
        print(f"{label}: {hub.decode(target)}")
    else:
        source, beam_scores = None, None
        target = hub.encode(args.reference or args.sentence)
        print(f"text (teacher-forced): {hub.decode(target)}")
    result = decomposition.decompose(model, target.to(hub.device), source)
    print()
    print(LEGEND)
    print()
    print(result.format_table())
    print()
    print(
        f"largest |log p - (context + frequency + normaliser)|: "
        f"{float(result.residual().abs().max()):.1e}"
    )
    if beam_scores is not None:
        print(
            f"beam search's own log p of the translation: {float(beam_scores.sum()):.4f} "
            f"(teacher-forced above: {float(result.log_p.double().sum()):.4f})"
        )
    return result


def describe(hub):
    model_cfg = hub.cfg.model
    gain = getattr(hub.models[0].decoder.output_projection, "gain", None)
    parts = [
        getattr(model_cfg, "arch", "?"),
        f"--natbias-init {getattr(model_cfg, 'natbias_init', '?')}",
    ]
    if gain is not None:
        parts.append(f"gain g = {float(gain()):.4f}")
    return ", ".join(parts)


def main(argv=None):
    args = parse_args(argv)
    # Checked before fairseq is imported (seconds). A missing default path
    # means the translation example has not run (with this WORK).
    if not os.path.exists(args.checkpoint):
        hint = (
            "run examples/translation/run.sh first (same WORK), or give --checkpoint"
            if args.checkpoint == parse_args([]).checkpoint
            else "train a model first or give the path of one"
        )
        sys.exit(f"decompose.py: error: {args.checkpoint}: no such checkpoint; {hint}")
    warnings.filterwarnings("ignore")  # hydra's and torch's deprecation notices inside fairseq
    from natbias.errors import NaturalBiasError

    logging.getLogger().setLevel(logging.WARNING)  # fairseq logs every loaded option at INFO
    try:
        run(args)
    except NaturalBiasError as error:
        sys.exit(f"decompose.py: error: {error}")


if __name__ == "__main__":
    main()
