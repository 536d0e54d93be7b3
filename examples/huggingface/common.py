"""What the transformers examples share: raw text in (🤗 datasets, as
transformers' own examples load it), a tokenizer trained locally, validation
NLL over training (with early stopping and the best model kept), and the run
record the report reads.

A run's folder holds ``record.json`` (its settings, validation NLL in bits by
update, update 0 included, the best, the test scores), ``best/`` (the model of
lowest validation NLL, ``save_pretrained``), ``checkpoints/`` (the Trainer's,
so that an interrupted run resumes) and ``done`` once it is scored.
"""

import json
import math
import os
import sys
import time
from pathlib import Path

# examples/paper: the Multi30k finder and sacreBLEU scores, shared with the demo
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "paper"))

import datasets  # noqa: E402
import torch  # noqa: E402
from multi30k import raw_file, read_lines  # noqa: E402
from tokenizers import SentencePieceUnigramTokenizer
from tokenizers.processors import TemplateProcessing
from transformers import PreTrainedTokenizerFast, TrainerCallback

from natbias.hf import (
    BiasStatisticsCallback,
    UnigramLabelSmoothingLoss,
    count_targets,
    from_pretrained,
)
from natbias.prior import log_unigram

LN2 = math.log(2.0)
SPECIALS = ["<pad>", "</s>", "<unk>"]  # ids 0, 1, 2


def say(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def add_run_arguments(parser, layers_help=None):
    """The model size and schedule both examples take: the fairseq study's
    (2 layers, d 128, FFN 256, 4 heads; lr 1e-3, inverse square root after
    100 updates of warm-up), one seed and one run at a time."""
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--layers", type=int, default=2, help=layers_help)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--ffn", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--max-steps", type=int, default=1000)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--patience", type=int, default=0)
    parser.add_argument(
        "--keep",
        type=int,
        nargs="*",
        default=[],
        metavar="UPDATE",
        help="also keep the model of these updates (multiples of --eval-every) in RUN/update-N",
    )
    parser.add_argument("--threads", type=int, default=1)


def read_split(folder, split, lang, limit=0):
    """The stripped lines of ``split`` (train, valid, test or a file stem such
    as test_2017_flickr) in ``lang``, found as the demo finds them; the first
    ``limit`` only (0: all)."""
    path = raw_file(folder, split, lang)
    if path is None:
        raise SystemExit(f"error: no {split}.{lang}[.gz] in {folder} (see --help)")
    lines = read_lines(path)
    return lines[:limit] if limit else lines


def load_text(folder, lang, splits, cache, limits=None):
    """The lines of ``splits`` in ``lang`` (found as :func:`read_split` finds
    them) as a 🤗 ``DatasetDict`` with one column, ``text``, stripped; loaded
    as transformers' run_clm.py loads its files, ``load_dataset("text")`` on
    local files (nothing fetched), cached in ``cache``. ``limits``: the first
    N lines of a split only (0 or absent: all)."""
    files = {}
    for split in splits:
        path = raw_file(folder, split, lang)
        if path is None:
            raise SystemExit(f"error: no {split}.{lang}[.gz] in {folder} (see --help)")
        files[split] = str(path)
    datasets.disable_progress_bars()
    text = datasets.load_dataset("text", data_files=files, cache_dir=str(cache))
    for split, limit in (limits or {}).items():
        if limit:
            text[split] = text[split].select(range(min(limit, len(text[split]))))
    return text.map(lambda batch: {"text": [line.strip() for line in batch["text"]]}, batched=True)


def train_tokenizer(texts, vocab_size, folder):
    """A SentencePiece-style unigram tokenizer (Hugging Face tokenizers),
    trained on ``texts`` and saved in ``folder``; loaded from there when
    trained before. Every encoding ends in ``</s>``."""
    folder = Path(folder)
    if not (folder / "tokenizer.json").exists():
        model = SentencePieceUnigramTokenizer()
        model.train_from_iterator(
            texts,
            vocab_size=vocab_size,
            special_tokens=SPECIALS,
            unk_token="<unk>",
            show_progress=False,
        )
        model.post_processor = TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=model, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
        )
        tokenizer.save_pretrained(folder)
    return PreTrainedTokenizerFast.from_pretrained(folder)


@torch.no_grad()
def validation_nll(model, batches, causal=False):
    """Bits per target token of ``model`` on ``batches`` (dicts with labels)."""
    training = model.training
    model.eval()
    total = tokens = 0.0
    device = next(model.parameters()).device
    for batch in batches:
        labels = batch["labels"].to(device)
        inputs = {k: v.to(device) for k, v in batch.items() if k != "labels"}
        logits = model(**inputs).logits.float()
        if causal:
            logits, labels = logits[:, :-1], labels[:, 1:]
        mask = labels.ne(-100)
        nll = torch.nn.functional.cross_entropy(logits[mask], labels[mask], reduction="sum")
        total += nll.item()
        tokens += mask.sum().item()
    model.train(training)
    return total / tokens / LN2


def cross_entropy_bits(log_prior: torch.Tensor, counts) -> float:
    """The prior's cross-entropy on held-out ``counts``, bits a token: what a
    model that predicts the prior everywhere scores (a fresh natural-bias
    model's target)."""
    counts = torch.as_tensor(counts, dtype=torch.float64)
    return float(-(counts * log_prior.double()).sum() / counts.sum() / LN2)


def record_prior_nll(record, train, valid, vocab, causal=False):
    """The prior's cross-entropy on the validation targets (bits), once per run:
    what a model that predicts the smoothed training unigram scores."""
    if record.get("unigram_nll") is None:
        targets = [count_targets(split, vocab, causal) for split in (train, valid)]
        record.update(unigram_nll=round(cross_entropy_bits(log_unigram(targets[0]), targets[1]), 4))


class Record:
    """``run/record.json``, written after every change."""

    def __init__(self, run, settings):
        self.path = Path(run) / "record.json"
        self.data = {"settings": settings, "updates": [], "nll": []}
        if self.path.exists():
            self.data = json.loads(self.path.read_text())

    def __getitem__(self, key):
        return self.data[key]

    def get(self, key, default=None):
        return self.data.get(key, default)

    def update(self, **values):
        self.data.update(values)
        self.save()

    def save(self):
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.path)


class ValidationCallback(TrainerCallback):
    """Validation NLL at update 0 and every ``every`` updates into the record;
    the model of lowest NLL saved to ``run/best``; training stopped after
    ``patience`` validations without a lower NLL (0: never)."""

    def __init__(self, record, batches, every, patience, run, tokenizer, causal=False, keep=()):
        self.record, self.batches, self.every, self.patience = record, batches, every, patience
        self.best_dir, self.tokenizer, self.causal = Path(run) / "best", tokenizer, causal
        self.run, self.keep = Path(run), set(keep)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        # A resumed run forgets validations after its checkpoint: they are redone.
        keep = [i for i, u in enumerate(self.record["updates"]) if u <= state.global_step]
        self.record.update(
            updates=[self.record["updates"][i] for i in keep],
            nll=[self.record["nll"][i] for i in keep],
        )
        if not self.record["updates"]:
            self.validate(model, 0)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every == 0 or state.global_step == state.max_steps:
            self.validate(model, state.global_step)
            if self.patience and self.since_best() >= self.patience:
                say(f"no lower validation NLL in {self.patience} validations: stopping")
                control.should_training_stop = True

    def validate(self, model, update):
        if update in self.keep and not (self.run / f"update-{update}").exists():
            model.save_pretrained(self.run / f"update-{update}")  # e.g. the head start, to score
            self.tokenizer.save_pretrained(self.run / f"update-{update}")
        nll = validation_nll(model, self.batches, self.causal)
        if update in self.record["updates"]:
            return
        best = min(self.record["nll"], default=math.inf)
        self.record["updates"].append(update)
        self.record["nll"].append(round(nll, 4))
        if nll < best:
            model.save_pretrained(self.best_dir)
            self.tokenizer.save_pretrained(self.best_dir)
            self.record.data.update(best_update=update, best_nll=round(nll, 4))
        self.record.save()
        say(f"update {update}: validation NLL {nll:.3f} bits" + (" (best)" if nll < best else ""))

    def since_best(self):
        updates = self.record["updates"]
        return len(updates) - 1 - updates.index(self.record["best_update"])


def last_checkpoint(folder):
    """The Trainer's latest checkpoint in ``folder``, to resume from; None if none."""
    checkpoints = sorted(Path(folder).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    return str(checkpoints[-1]) if checkpoints else None


def arm_name(args):
    """The run's arm: stock or natbias, +unigram-ls with --label-smoothing unigram."""
    base = "natbias" if args.bias == "natural" else "stock"
    return base + ("+unigram-ls" if args.label_smoothing == "unigram" else "")


def run_folder(args):
    """WORK/runs/<arm>/seed<k>, made; None when that run is done."""
    run = Path(args.work) / "runs" / arm_name(args) / f"seed{args.seed}"
    if (run / "done").exists():
        say(f"{run}: done before, skipped")
        return None
    run.mkdir(parents=True, exist_ok=True)
    return run


def training_arguments(args, run, **extra):
    """The Trainer's arguments both examples share: the study's schedule, no
    clipping, a checkpoint at every validation (to resume), the CPU."""
    return dict(
        output_dir=str(run / "checkpoints"),
        max_steps=args.max_steps,
        seed=args.seed,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr,
        lr_scheduler_type="inverse_sqrt",
        warmup_steps=args.warmup,
        adam_beta2=0.997,
        weight_decay=0.0,
        max_grad_norm=0.0,
        save_strategy="steps",
        save_steps=args.eval_every,
        save_total_limit=1,
        logging_steps=args.eval_every,
        eval_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        dataloader_num_workers=0,
        **extra,
    )


def train_model(args, run, record, model, train, collator, valid_batches, tokenizer, trainer):
    """Train ``model`` with ``trainer`` (the Trainer class with its arguments
    given, e.g. ``partial(Trainer, args=...)``), resuming from the run's last
    checkpoint, and return it. Besides the data it is given the unigram label
    smoothing loss (--label-smoothing unigram; the model's own prior with the
    natural bias, else the counted targets), the validation callback, and the
    bias's statistics with the natural bias."""
    causal = not getattr(model.config, "is_encoder_decoder", False)
    loss = None
    if args.label_smoothing == "unigram":
        loss = (
            UnigramLabelSmoothingLoss.from_model(model)
            if args.bias == "natural"
            else UnigramLabelSmoothingLoss.from_counts(
                count_targets(train, len(tokenizer), causal), model
            )
        )
    if any(update % args.eval_every for update in args.keep):
        raise SystemExit(f"error: --keep {args.keep}: each must be a multiple of --eval-every")
    callback = ValidationCallback(
        record, valid_batches, args.eval_every, args.patience, run, tokenizer, causal, args.keep
    )
    callbacks = [callback]
    if args.bias == "natural":
        callbacks.append(BiasStatisticsCallback(probe=valid_batches[0]))
    trained = trainer(
        model=model,
        train_dataset=train,
        data_collator=collator,
        compute_loss_func=loss,
        callbacks=callbacks,
    )
    trained.train(resume_from_checkpoint=last_checkpoint(run / "checkpoints"))
    return trained


def best_model(args, run, stock_class):
    """The run's model of lowest validation NLL, as saved in run/best."""
    return (
        from_pretrained(run / "best")
        if args.bias == "natural"
        else stock_class.from_pretrained(run / "best")
    )
