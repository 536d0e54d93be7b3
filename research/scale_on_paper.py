"""What the plugin adds at the paper's WMT'14 scale, next to fairseq's model.

Builds, as fairseq-train would (from two 32k dictionaries and a synthetic
Zipfian target split of 1M tokens written by bench_counting.py's writer), three
models with tied embeddings:

* fairseq's own ``transformer_wmt_en_de`` (Transformer base, FFN 2048);
* ``transformer_natbias`` with the same sizes, ``--natbias-init unigram``;
* ``transformer_natbias_wmt_en_de`` (the paper's WMT model: FFN 512).

and prints their parameters and buffers and the training-state memory they
imply (fp32 weights + gradients + Adam's two moments = 4 copies of the
parameters; buffers once): the results page's "|V| + 1 more [parameters]
than stock ... plus the |V|-entry buffer of the log-unigram". The time side
comes from the measured per-update ratios (bench_overhead.py) and the
counting benchmark (bench_counting.py); this script measures only sizes.

    .venv/bin/python research/scale_on_paper.py [--vocab 32000]
"""

import argparse
import logging
import sys
import tempfile
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_counting import write_synthetic_split  # noqa: E402

from fairseq_natbias.in_process import build_from_training_args  # noqa: E402


def make_data(folder: Path, vocab: int) -> None:
    """A joined dictionary of ``vocab`` entries (fairseq's 4 specials included)
    and a Zipfian target training split over it."""
    from fairseq.data import Dictionary

    dictionary = Dictionary()
    for i in range(vocab - len(dictionary)):
        dictionary.add_symbol(f"piece{i}", n=vocab - i)
    for lang in ("de", "en"):
        dictionary.save(str(folder / f"dict.{lang}.txt"))
    write_synthetic_split(str(folder / "train.de-en.en"), 1_000_000, len(dictionary))


def sizes(model):
    parameters = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() for b in model.buffers())
    return parameters, buffers, 4 * (4 * parameters + buffers)  # fp32 bytes


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")  # hydra's deprecation notices at every build
    common = ["--task", "translation", "-s", "de", "-t", "en", "--share-all-embeddings", "--cpu"]
    with tempfile.TemporaryDirectory() as tmp:
        make_data(Path(tmp), args.vocab)
        natbias = [tmp, "--user-dir", "fairseq_natbias", "--natbias-init", "unigram", *common]
        models = {
            "fairseq transformer_wmt_en_de": [tmp, "--arch", "transformer_wmt_en_de", *common],
            "transformer_natbias (same sizes)": [*natbias, "--arch", "transformer_natbias"],
            "transformer_natbias_wmt_en_de (paper: FFN 512)": [
                *natbias,
                "--arch",
                "transformer_natbias_wmt_en_de",
            ],
        }
        logging.disable(logging.INFO)  # fairseq's per-build log lines
        rows = {name: sizes(build_from_training_args(argv)[2]) for name, argv in models.items()}
    stock = rows["fairseq transformer_wmt_en_de"]
    print(
        f"| model ({args.vocab} vocabulary, tied) | parameters | buffers | "
        "training state (fp32 W + grad + Adam, MiB) |"
    )
    print("|---|---|---|---|")
    for name, (parameters, buffers, state) in rows.items():
        print(f"| {name} | {parameters:,} | {buffers:,} | {state / 2**20:.1f} |")
    same = rows["transformer_natbias (same sizes)"]
    extra_parameters, extra_buffers = same[0] - stock[0], same[1] - stock[1]
    print(
        f"\nplugin vs stock at equal sizes: +{extra_parameters:,} parameters, "
        f"+{extra_buffers:,} buffer entries, +{(same[2] - stock[2]) / 2**20:.2f} MiB "
        f"of training state ({100 * (same[2] - stock[2]) / stock[2]:.3f}% of the stock model's)"
    )


if __name__ == "__main__":
    main()
