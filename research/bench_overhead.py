"""Cost of the plugin against stock fairseq, side by side in one process.

On Multi30k (De-En translation, joint SentencePiece 8k; English for the
language model, SentencePiece 8k; binarised once into --workdir), the same
model sizes, seed and batches:

* training update (forward, backward, Adam step through task.train_step):
  stock ``transformer`` vs ``transformer_natbias`` with its DEFAULT settings
  (unigram bias, weight init ``gain``, the logging hook computing its
  statistics every --log-interval = 100 updates, as in fairseq-train), with
  the hook every update (the worst case), and the ``fairseq`` weight init with
  the hook off (the bias alone); the same for stock ``transformer_lm`` vs
  ``transformer_lm_natbias`` (--suites lm);
* generation, beam 5, sentences per second (fairseq's SequenceGenerator, all
  hypotheses forced to 40 tokens so that both models do the same work);
* checkpoint load for generation (checkpoint_utils.load_model_ensemble).

Runs are interleaved (A B C A B C ...) so drifts of this shared machine hit
all variants alike; the figures are medians and the ratios are against stock.

    .venv/bin/python research/bench_overhead.py [--multi30k DIR] [--rounds 5]
"""

import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

# Use this checkout's fairseq_natbias (also the one --user-dir fairseq_natbias names).
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples" / "paper"))  # make demo's pipeline

import pipeline  # noqa: E402
from study import parser_for  # noqa: E402  (research/, the script's folder, is on the path)

from fairseq_natbias import in_process  # noqa: E402

SIZES = (
    "--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 256 --decoder-embed-dim 256 "
    "--encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024 "
    "--encoder-attention-heads 4 --decoder-attention-heads 4 --share-all-embeddings"
).split()
COMMON = (
    "--cpu --seed 1 --optimizer adam --adam-betas (0.9,0.997) --lr 5e-4 "
    "--lr-scheduler inverse_sqrt --warmup-updates 100 "
    "--criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 2048"
).split()
STOCK = "stock"
DEFAULT = "natbias default"


def variants_of(stock_arch, natbias_arch):
    return {
        STOCK: ["--arch", stock_arch],
        DEFAULT: ["--arch", natbias_arch],  # hook every --log-interval (100) updates
        "natbias default, hook every update": [
            "--arch",
            natbias_arch,
            "--natbias-stats-interval",
            "1",
        ],
        "natbias bias only (fairseq init, no hook)": [
            "--arch",
            natbias_arch,
            "--natbias-weight-init",
            "fairseq",
            "--no-natbias-logging",
        ],
    }


# Dims and pre-norm explicit so stock transformer_lm builds the same network
# (see LanguageModel.options in research/study/arms.py).
LM_SIZES = (
    "--decoder-layers 2 --decoder-embed-dim 256 --decoder-ffn-embed-dim 1024 "
    "--decoder-input-dim 256 --decoder-output-dim 256 --decoder-normalize-before "
    "--decoder-attention-heads 4 --share-decoder-input-output-embed"
).split()
LM_COMMON = (
    "--cpu --seed 1 --optimizer adam --adam-betas (0.9,0.98) --lr 5e-4 "
    "--lr-scheduler inverse_sqrt --warmup-updates 100 --task language_modeling "
    "--tokens-per-sample 64 --criterion cross_entropy --max-tokens 2048"
).split()
SUITES = {
    "translation": (SIZES, COMMON, variants_of("transformer", "transformer_natbias")),
    "lm": (LM_SIZES, LM_COMMON, variants_of("transformer_lm", "transformer_lm_natbias")),
}


class Variant:
    """One model with its own task, criterion and optimizer."""

    def __init__(self, data_bin, sizes, common, options, save_dir):
        from fairseq import optim

        argv = [
            str(data_bin),
            "--user-dir",
            "fairseq_natbias",
            *sizes,
            *common,
            *options,
            "--save-dir",
            str(save_dir),
        ]
        self.cfg, self.task, self.model = in_process.build_from_training_args(argv)
        self.criterion = self.task.build_criterion(self.cfg.criterion)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = optim.build_optimizer(self.cfg.optimizer, params)
        self.task.load_dataset("train", combine=True, epoch=1)
        self.task.load_dataset("test", combine=False, epoch=1)
        self.updates = 0

    def batches(self, split, count, max_tokens):
        iterator = self.task.get_batch_iterator(
            self.task.dataset(split), max_tokens=max_tokens, seed=1
        ).next_epoch_itr(shuffle=(split == "train"))
        return [next(iterator) for _ in range(count)]

    def train_update(self, sample):
        self.model.train()
        self.optimizer.zero_grad()
        self.task.train_step(sample, self.model, self.criterion, self.optimizer, self.updates)
        self.optimizer.step()
        self.updates += 1

    def generate(self, samples, generator):
        self.model.eval()
        with torch.no_grad():
            for sample in samples:
                self.task.inference_step(generator, [self.model], sample)


def timed(function, *args):
    start = time.perf_counter()
    function(*args)
    return time.perf_counter() - start


def bench_training(variants, batches, rounds):
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, variant in variants.items():
            for sample in batches:  # per-update times, interleaved per round
                times[name].append(timed(variant.train_update, sample))
    return {name: statistics.median(values) for name, values in times.items()}


def bench_generation(variants, samples, rounds):
    from fairseq.sequence_generator import SequenceGenerator

    sentences = sum(len(s["id"]) for s in samples)
    rates = {name: [] for name in variants}
    for _ in range(rounds):
        for name, variant in variants.items():
            # min_len = max_len: every hypothesis has 40 tokens, so both models
            # do the same work (untrained models stop at different lengths)
            generator = SequenceGenerator(
                [variant.model],
                variant.task.target_dictionary,
                beam_size=5,
                max_len_a=0,
                max_len_b=40,
                min_len=40,
            )
            rates[name].append(sentences / timed(variant.generate, samples, generator))
    return {name: statistics.median(values) for name, values in rates.items()}


def bench_loading(checkpoints, rounds):
    from fairseq import checkpoint_utils

    times = {name: [] for name in checkpoints}
    for _ in range(rounds):
        for name, path in checkpoints.items():
            times[name].append(timed(checkpoint_utils.load_model_ensemble, [str(path)]))
    return {name: statistics.median(values) for name, values in times.items()}


def save_checkpoint(variant, path):
    from fairseq import checkpoint_utils
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(variant.cfg, resolve=True, enum_to_str=True)
    history = [
        {
            "criterion_name": type(variant.criterion).__name__,
            "optimizer_name": type(variant.optimizer).__name__,
            "lr_scheduler_state": {},
            "num_updates": 0,
        }
    ]
    state = {
        "cfg": cfg,
        "model": variant.model.state_dict(),
        "args": None,
        "optimizer_history": history,
        "extra_state": {},
        "last_optimizer_state": {},
    }
    checkpoint_utils.torch_persistent_save(state, str(path))


def print_table(title, figures, unit, higher_is_better=False):
    stock = figures[STOCK]
    print(f"\n{title}", flush=True)
    for name, value in figures.items():
        ratio = (stock / value) if higher_is_better else (value / stock)
        print(f"  {name:42s} {value:10.4f} {unit}   cost ratio vs stock {ratio:.3f}x")


def run_suite(name, data_bin, workdir, args):
    sizes, common, options_by_variant = SUITES[name]
    variants = {
        variant: Variant(data_bin, sizes, common, options, workdir / "ckpt")
        for variant, options in options_by_variant.items()
    }
    first = next(iter(variants.values()))
    batches = first.batches("train", args.updates, 2048)
    for variant in variants.values():  # warm-up: allocator, Adam state
        variant.train_update(batches[0])
    stock_arch = options_by_variant[STOCK][1]
    print(f"\n=== {name}: stock = --arch {stock_arch}", flush=True)
    print_table(
        "training update (median s/update)", bench_training(variants, batches, args.rounds), "s"
    )
    if name != "translation":
        return
    samples = first.batches("test", 4, 1024)
    generation = bench_generation(
        {k: variants[k] for k in (STOCK, DEFAULT)}, samples, max(3, args.rounds // 2)
    )
    print_table(
        "generation, beam 5 (median sentences/s)", generation, "sent/s", higher_is_better=True
    )
    checkpoints = {}
    for variant in (STOCK, DEFAULT):
        checkpoints[variant] = workdir / f"{variant.replace(' ', '_')}.pt"
        save_checkpoint(variants[variant], checkpoints[variant])
    print_table(
        "checkpoint load for generation (median s)", bench_loading(checkpoints, args.rounds), "s"
    )


def main():
    parser = parser_for(__doc__)
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "natbias-bench"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--updates", type=int, default=10, help="batches per round")
    parser.add_argument("--suites", nargs="+", default=list(SUITES), choices=list(SUITES))
    parser.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1))
    args = parser.parse_args()
    multi30k = Path(args.multi30k)
    if not (multi30k / "train.de.gz").exists():
        sys.exit(f"bench_overhead: Multi30k not found at {multi30k}; pass --multi30k DIR")
    torch.set_num_threads(args.threads)
    logging.disable(logging.INFO)  # fairseq's per-model INFO lines would bury the tables
    workdir = Path(args.workdir)
    print(
        f"machine: {os.cpu_count()} CPU threads ({args.threads} used), torch {torch.__version__}",
        flush=True,
    )
    for name in args.suites:
        if name == "translation":
            data_bin = pipeline.prepare(multi30k, workdir, vocab_size=8000, langs=("de", "en"))
        else:
            data_bin = pipeline.prepare_lm(multi30k, workdir / "lm", vocab_size=8000, lang="en")
        run_suite(name, data_bin, workdir, args)
    print(f"\ncommand: {sys.executable} {' '.join(sys.argv)}")


if __name__ == "__main__":
    main()
