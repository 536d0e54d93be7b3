"""Issue 93, item 4: the natural bias in fairseq's multilingual translation
(``--task translation_multi_simple_epoch``) against stock fairseq, trained
through the real fairseq-train on Multi30k: docs/results.md's "Multilingual
models" (research/results/multilingual_full.md, multilingual_n3000.md).

Setups: one-to-many (``--lang-pairs en-de,en-fr``) and many-to-one
(``de-en,fr-en``), ``--encoder-langtok src --decoder-langtok
--share-all-embeddings``, one joint SentencePiece model (4,000 pieces;
examples/multilingual/prepare.py). Arms: ``stock`` (``--arch transformer``),
``pooled`` and ``per-language`` (``--arch transformer_natbias --natbias-prior
...``); label-smoothed cross-entropy 0.1, Adam, lr 1e-3, 100 warm-up updates,
2+2 layers, d 64 and ``--max-tokens 1024`` (what the shared 2-core machine
could train by a deadline).

``full``   all 29,000 pairs per direction, 1,000 updates: the updates each arm
           needs to reach stock's validation NLL at update 1,000, per direction.
``n3000``  the first 3,000 pairs per direction, validated every 100 updates,
           ``--patience`` 3 on the overall NLL, capped at ``--cap`` (2,500):
           the best checkpoint's NLL and test_2016_flickr BLEU per direction.

Per direction: for each pair P the data-bin gets a split ``valid_P`` with P's
validation sentences and an empty dataset for every other pair, so that
fairseq-train logs each direction's NLL (``--valid-subset valid,valid_en_de,...``;
the first, all directions, picks the best checkpoint). NLL: fairseq's
``nll_loss`` in bits per target token, the language token included. Finished
runs are skipped, an interrupted one resumes; each finished run's record is
kept in --results/runs/multilingual_<part>/<setup>/<arm>/seed<k>.json, and the
tables and plots are written from the records.

    OMP_NUM_THREADS=1 .venv/bin/python research/study_multilingual.py \\
        --parts full n3000 --seeds 1 --results research/results
"""

import argparse
import itertools
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "paper"))
sys.path.insert(0, str(REPO / "examples" / "multilingual"))
sys.path.insert(0, str(REPO / "research"))

import pipeline  # noqa: E402
from prepare import prepare  # noqa: E402
from study.arms import EPOCHS_NEVER  # noqa: E402
from study.summary import reach  # noqa: E402

from natbias.tools import fairseq_logs  # noqa: E402
from natbias.tools.generate_output import parse_generate_output  # noqa: E402
from natbias.tools.stats import mean_stderr  # noqa: E402

TASK = "translation_multi_simple_epoch"
SETUPS = {"one-to-many": ["en-de", "en-fr"], "many-to-one": ["de-en", "fr-en"]}
ARMS = {
    "stock": ["--arch", "transformer"],
    "per-language": ["--arch", "transformer_natbias", "--natbias-prior", "per-language"],
    "pooled": ["--arch", "transformer_natbias", "--natbias-prior", "pooled"],
}
REFERENCE = "stock"
PARTS = {"full": None, "n3000": 3000}  # training pairs per direction (None: all)
ALL = "valid"  # the subset of every direction
EARLY_STOP = "early stop since valid performance hasn't improved"


def model_arguments(dim):
    return (
        f"--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim {dim} "
        f"--decoder-embed-dim {dim} --encoder-ffn-embed-dim {2 * dim} "
        f"--decoder-ffn-embed-dim {2 * dim} --encoder-attention-heads 4 "
        "--decoder-attention-heads 4 --share-all-embeddings --dropout 0.1"
    ).split()


def task_arguments(pairs):
    """The task and its language tokens, as training, generation and update 0
    (multilingual_step0.py) give them."""
    langtoks = ["--encoder-langtok", "src", "--decoder-langtok"]
    return ["--task", TASK, "--lang-pairs", ",".join(pairs), *langtoks]


def subset_name(pair):
    return "valid_" + pair.replace("-", "_")


def pair_of(subset):
    """``valid_en_de`` -> ``en-de``; ``valid`` -> ``all``."""
    return "all" if subset == ALL else subset[len("valid_") :].replace("_", "-")


def add_direction_subsets(data, pairs):
    """For each pair P, the split ``valid_P``: P's validation files (linked)
    and an empty dataset for each other pair, so that the task (which loads
    a split for every pair of --lang-pairs) validates P alone."""
    from fairseq.data import indexed_dataset

    for pair in pairs:
        subset = subset_name(pair)
        for other in pairs:
            for lang in other.split("-"):
                stem = data / f"{subset}.{other}.{lang}"
                if Path(f"{stem}.bin").exists() and Path(f"{stem}.bin").stat().st_size:
                    continue
                if other == pair:
                    for ext in ("bin", "idx"):
                        target = data / f"valid.{other}.{lang}.{ext}"
                        os.link(target, data / f"{subset}.{other}.{lang}.{ext}")
                else:
                    builder = indexed_dataset.make_builder(f"{stem}.bin", impl="mmap")
                    builder.finalize(f"{stem}.idx")
                    # numpy cannot map an empty file: a few bytes no item points to
                    Path(f"{stem}.bin").write_bytes(bytes(8))


def prepare_part(raw, work, part, vocab_size):
    pairs = sorted({p for ps in SETUPS.values() for p in ps})
    lines = PARTS[part]
    name = "data-full" if lines is None else f"data-n{lines}"
    data = prepare(raw, work / name, [p.split("-") for p in pairs], lines, None, vocab_size)
    add_direction_subsets(data, pairs)
    return data


def training_arguments(data, run_dir, setup, arm, seed, part, args):
    pairs = SETUPS[setup]
    converge = PARTS[part] is not None
    every = 100 if converge else args.validate_every
    options = [
        *task_arguments(pairs), *ARMS[arm], *model_arguments(args.dim),
        "--cpu", "--seed", str(seed), "--optimizer", "adam", "--adam-betas", "(0.9,0.997)",
        "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--max-tokens", str(args.max_tokens), "--log-format", "json", "--log-interval", "25",
        "--num-workers", "0", "--no-progress-bar", "--no-epoch-checkpoints",
        "--validate-interval-updates", str(every), "--save-interval-updates", str(every),
        "--keep-interval-updates", "1",
        "--validate-interval", str(EPOCHS_NEVER), "--save-interval", str(EPOCHS_NEVER),
        "--valid-subset", ",".join([ALL, *map(subset_name, pairs)]),
    ]  # fmt: skip
    if converge:
        options += ["--patience", str(args.patience)]
    max_update = args.cap if converge else 1000
    return pipeline.train_command(data, run_dir, options, max_update), max_update


def train(data, run_dir, setup, arm, seed, part, args):
    name = f"{part} {setup} {arm} seed{seed}"
    if (run_dir / "done").exists():
        pipeline.say(f"{name}: trained before, skipped")
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    arguments, max_update = training_arguments(data, run_dir, setup, arm, seed, part, args)
    resumed = (run_dir / "checkpoint_last.pt").exists()
    pipeline.say(f"{name}: training to {max_update} updates" + (" (resumed)" if resumed else ""))
    started = time.time()
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    pipeline.run([*pipeline.tool("fairseq-train"), *arguments], log_path=run_dir / "train.log")
    (run_dir / "done").touch()
    pipeline.say(f"{name}: trained in {time.time() - started:.0f} s")


def generate_bleu(data, run_dir, setup, pair, checkpoint):
    """BLEU/chrF of ``checkpoint`` on test_2016_flickr for one direction
    (fairseq-generate, beam 5, sacreBLEU), kept in run_dir/bleu_<pair>.json."""
    from quality import quality

    path = run_dir / f"bleu_{pair}.json"
    if path.exists():
        return json.loads(path.read_text())
    src, tgt = pair.split("-")
    arguments = [str(data), "--user-dir", "fairseq_natbias", *task_arguments(SETUPS[setup])]
    arguments += ["--source-lang", src, "--target-lang", tgt]
    arguments += ["--path", str(run_dir / checkpoint), *pipeline.TEST_DECODING, "--cpu"]
    output = pipeline.run([*pipeline.tool("fairseq-generate"), *arguments])
    sentences = parse_generate_output(output.splitlines())
    hypotheses = [sentences[i].detokenized or "" for i in range(len(sentences))]
    references = (data / "text" / f"test.{tgt}").read_text(encoding="utf-8").splitlines()
    scores = quality(hypotheses, references)
    (run_dir / f"test_{pair}.hyp").write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
    result = {"checkpoint": checkpoint, "bleu": round(scores["BLEU"], 2)}
    result.update(bleu_signature=scores["bleu_signature"], chrf=round(scores["chrF"], 2))
    result["chrf_signature"] = scores["chrf_signature"]
    path.write_text(json.dumps(result, indent=1) + "\n")
    return result


def curves_from_log(lines):
    """``{subset pair ("all", "en-de", ...): {update: nll}}`` of a train.log's
    validation lines (a resumed run's repeats: the last wins)."""
    curves = {}
    for record in fairseq_logs.parse_lines(lines):
        if record.tag.startswith(ALL) and "nll_loss" in record.values and record.num_updates:
            curves.setdefault(pair_of(record.tag), {})[record.num_updates] = record.values[
                "nll_loss"
            ]
    return curves


def run_record(run_dir, setup):
    """What the summary reads of a finished run."""
    text = (run_dir / "train.log").read_text(encoding="utf-8", errors="replace").splitlines()
    curves = curves_from_log(text)
    overall = curves[pair_of(ALL)]
    best = min(overall, key=lambda u: (overall[u], u))
    record = {
        "curves": {k: {str(u): v for u, v in sorted(c.items())} for k, c in curves.items()},
        "best_update": best,
        "last_update": max(overall),
        "stopped_early": any(EARLY_STOP in line for line in text),
        "bleu": {},
    }
    for pair in SETUPS[setup]:
        path = run_dir / f"bleu_{pair}.json"
        if path.exists():
            record["bleu"][pair] = json.loads(path.read_text())
    return record


def run_one(data, work, results, part, setup, arm, seed, args):
    run_dir = work / "runs" / part / setup / arm / f"seed{seed}"
    kept = results / "runs" / f"multilingual_{part}" / setup / arm / f"seed{seed}.json"
    train(data, run_dir, setup, arm, seed, part, args)
    checkpoint = "checkpoint_best.pt" if PARTS[part] is not None else "checkpoint_last.pt"
    if args.bleu:
        for pair in SETUPS[setup]:
            scores = generate_bleu(data, run_dir, setup, pair, checkpoint)
            pipeline.say(f"{part} {setup} {arm} seed{seed}: {pair} BLEU {scores['bleu']:.2f}")
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(json.dumps(run_record(run_dir, setup), indent=1) + "\n")
    for interval in run_dir.glob("checkpoint_*_*.pt"):
        interval.unlink()


def load_records(results, part, seeds):
    """``{(setup, arm): [(seed, record), ...]}`` of the kept records."""
    found = {}
    for setup in SETUPS:
        for arm in ARMS:
            for seed in seeds:
                path = results / "runs" / f"multilingual_{part}" / setup / arm / f"seed{seed}.json"
                if path.exists():
                    found.setdefault((setup, arm), []).append((seed, json.loads(path.read_text())))
    return found


def curve(record, key):
    points = sorted((int(u), v) for u, v in record["curves"][key].items())
    return [u for u, _ in points], [v for _, v in points]


def value_at(record, key, update):
    return record["curves"][key].get(str(update))


def cell(values, digits=3):
    return mean_stderr([v for v in values if v is not None]).format(digits, False, "–")


def reach_table(found, setup, horizon=1000):
    """Rows: per direction and overall, each arm's NLL at ``horizon`` and the
    updates it needs to reach stock's (mean over stock's seeds)."""
    keys = ["all", *SETUPS[setup]]
    stock = found.get((setup, REFERENCE), [])
    lines = [
        "| direction | arm | seeds | valid NLL at 1,000 | updates to reach stock's NLL at 1,000 "
        "(per seed) | × stock's | test BLEU at 1,000 |",
        "|---|---|---|---|---|---|---|",
    ]
    aims = []
    for key in keys:
        targets = [value_at(r, key, horizon) for _, r in stock]
        targets = [t for t in targets if t is not None]
        target = sum(targets) / len(targets) if targets else None
        if target is not None:
            aims.append(f"{key} {target:.3f}")
        for arm in ARMS:
            runs = found.get((setup, arm), [])
            if not runs:
                continue
            at = [value_at(r, key, horizon) for _, r in runs]
            curves = [dict(zip(("updates", "nll"), curve(r, key))) for _, r in runs]
            reached = [reach(c, target) for c in curves] if target else []
            finite = [x for x in reached if x != float("inf")]
            per_seed = ", ".join("never" if x == float("inf") else f"{x:.0f}" for x in reached)
            ratio = (
                f"{sum(finite) / len(finite) / horizon:.2f}×" if finite and len(finite) == len(reached)
                else "–"
            )  # fmt: skip
            seeds = ", ".join(str(s) for s, _ in runs)
            label = "all (both directions)" if key == "all" else key
            bleu = cell([r["bleu"].get(key, {}).get("bleu") for _, r in runs], 2)
            lines.append(
                f"| {label} | {arm} | {seeds} | {cell(at)} | {per_seed or '–'} | {ratio} | {bleu} |"
            )
    lines.append("")
    lines.append(
        f"Targets (stock's validation NLL at update {horizon:,}, mean over its seeds): "
        + (", ".join(aims) if aims else "none yet (stock unfinished)")
        + ("; a stock seed above the mean never reaches it by then" if len(stock) > 1 else "")
        + "."
    )
    return lines


def stopped_by(record):
    return "patience" if record["stopped_early"] else "cap"


def converged_table(found, setup):
    """Rows: each arm's best checkpoint (by the overall validation NLL): its
    update, its NLL overall and per direction, its BLEU per direction."""
    pairs = SETUPS[setup]
    head = " | ".join(f"valid NLL {p}" for p in pairs)
    bleu_head = " | ".join(f"BLEU {p}" for p in pairs)
    lines = [
        f"| arm | seeds | best update (last update, stopped by) | valid NLL all | {head} | "
        f"{bleu_head} |",
        "|---|---|---|---|" + "---|" * (2 * len(pairs)),
    ]
    for arm in ARMS:
        runs = found.get((setup, arm), [])
        if not runs:
            continue
        best = [r["best_update"] for _, r in runs]
        stops = [r["last_update"] for _, r in runs]
        cells = [cell([value_at(r, "all", r["best_update"]) for _, r in runs])]
        cells += [cell([value_at(r, p, r["best_update"]) for _, r in runs]) for p in pairs]
        cells += [cell([r["bleu"].get(p, {}).get("bleu") for _, r in runs], 2) for p in pairs]
        where = ", ".join(f"{b} ({s}, {stopped_by(r)})" for b, s, (_, r) in zip(best, stops, runs))
        seeds = ", ".join(str(s) for s, _ in runs)
        lines.append(f"| {arm} | {seeds} | {where} | " + " | ".join(cells) + " |")
    if len(lines) == 2:
        lines.append("\n(no run yet)")
    return lines


def signatures(found):
    for runs in found.values():
        for _, record in runs:
            for scores in record["bleu"].values():
                return scores["bleu_signature"], scores["chrf_signature"]
    return None


def plot(found, path, title):
    from natbias.tools import plots

    panels = [(setup, key) for setup in SETUPS for key in ["all", *SETUPS[setup]]]
    fig, axes = plots.grid(panels, str(path), rows=len(SETUPS), cols=3)
    for ax, (setup, key) in zip(axes.flat, panels):
        for color, arm in zip(("black", "tab:blue", "tab:red"), ARMS):
            for i, (_, record) in enumerate(found.get((setup, arm), [])):
                if key in record["curves"]:
                    ax.plot(*curve(record, key), color=color, lw=1, label=None if i else arm)
        ax.set_title(f"{setup}: {'all directions' if key == 'all' else key}", fontsize=9)
        ax.set_xlabel("update")
        ax.set_ylabel("valid NLL (bits/token)")
        ax.legend(fontsize=7)
        ys = [v for line in ax.get_lines() for v in line.get_ydata()]
        if ys:
            ax.set_ylim(min(ys) - 0.1, min(max(ys), min(ys) + 4))
    plots.save(fig, str(path), title)


def write_results(results, part, seeds, args, command):
    import torch

    found = load_records(results, part, seeds)
    if not found:
        return None
    done_seeds = sorted({s for runs in found.values() for s, _ in runs})
    n = PARTS[part]
    title = (
        "Multilingual translation, all 29,000 pairs per direction, 1,000 updates"
        if n is None
        else f"Multilingual translation, {n:,} pairs per direction, patience {args.patience} "
        f"capped at {args.cap:,} updates"
    )
    lines = [
        f"# {title} (issue 93)",
        "",
        f"`{command}`",
        "",
        f"Machine: the 2-core CPU development machine (torch {torch.__version__}, ve-fairseq "
        "0.12.3), shared with other engineers' work while these ran (load above 2): two "
        "trainings side by side, one thread each. Seeds finished: "
        f"{', '.join(map(str, done_seeds))} (n per row in its `seeds` cell; ± is the "
        "standard error over seeds where there are several).",
        "",
        "Set-up: Multi30k, `--task translation_multi_simple_epoch --encoder-langtok src "
        "--decoder-langtok --share-all-embeddings`, joint SentencePiece (4,000 pieces, trained "
        f"on the part's training text), 2+2 layers, d {args.dim}, FFN {2 * args.dim}, 4 heads, "
        "dropout 0.1, label-smoothed cross-entropy 0.1, Adam (0.9, 0.997), lr 1e-3, inverse-sqrt "
        f"warm-up 100 updates, `--max-tokens {args.max_tokens}`. Arms: `stock` = `--arch "
        "transformer`; `pooled` / `per-language` = `--arch transformer_natbias --natbias-prior "
        "pooled / per-language`. Validation NLL: fairseq's `nll_loss` (bits per target token, "
        "the language token included) on Multi30k's validation set (1,014 sentences a "
        "direction), per direction from a split per direction logged by fairseq-train itself.",
        "",
    ]
    for setup in SETUPS:
        table = reach_table(found, setup) if n is None else converged_table(found, setup)
        lines += [f"## {setup} ({', '.join(SETUPS[setup])})", "", *table, ""]
    capped = [r for runs in found.values() for _, r in runs if stopped_by(r) == "cap"]
    if n is not None and capped:
        total = sum(len(runs) for runs in found.values())
        lines += [
            f"**Not converged:** {len(capped)} of {total} runs were stopped by the cap with "
            "their validation NLL still falling (best update = last update): these are the "
            f"arms after {args.cap:,} updates on {n:,} pairs, not at convergence.",
            "",
        ]
    if n is not None:
        lines += [
            f"Training: validation every 100 updates, `--patience {args.patience}` on the "
            f"validation NLL of all directions, capped at {args.cap:,} updates; the best "
            "checkpoint is the one with the lowest NLL over all directions. BLEU: "
            "`fairseq-generate --task translation_multi_simple_epoch --source-lang X "
            "--target-lang Y --beam 5 --lenpen 1.0 --remove-bpe sentencepiece` on "
            "test_2016_flickr (1,000 sentences) of the best checkpoint, scored by sacreBLEU.",
            "",
        ]
    signed = signatures(found)
    if signed:
        lines += [f"sacreBLEU: `{signed[0]}`; chrF `{signed[1]}`.", ""]
    png = results / f"multilingual_{part}_valid_nll.png"
    plot(found, png, title)
    lines += [f"![validation NLL]({png.name})", ""]
    out = results / f"multilingual_{part}.md"
    out.write_text("\n".join(lines))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS))
    parser.add_argument("--setups", nargs="+", choices=list(SETUPS), default=list(SETUPS))
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--work", type=Path, default=REPO / "work" / "multilingual")
    parser.add_argument("--raw", type=Path, default=os.environ.get("NATBIAS_MULTI30K"))
    parser.add_argument("--results", type=Path, default=REPO / "research" / "results")
    parser.add_argument("--jobs", type=int, default=2, help="trainings side by side")
    parser.add_argument("--dim", type=int, default=64, help="model width")
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--validate-every", type=int, default=100, help="full part")
    parser.add_argument("--patience", type=int, default=3, help="n3000 part, validations")
    parser.add_argument("--cap", type=int, default=2500, help="n3000 part, updates")
    parser.add_argument("--no-bleu", dest="bleu", action="store_false")
    parser.add_argument("--summary-only", action="store_true", help="write the results only")
    parser.add_argument("--vocab-size", type=int, default=4000)
    args = parser.parse_args(argv)
    if args.raw is None and not args.summary_only:
        parser.error("give --raw DIR (Multi30k) or set NATBIAS_MULTI30K")
    # The training command (a summary's own options left out: it trains nothing).
    given = argv if argv is not None else sys.argv[1:]
    kept = [a for a in given if a != "--summary-only"]
    command = "OMP_NUM_THREADS=1 .venv/bin/python research/study_multilingual.py " + " ".join(kept)
    if not args.summary_only:
        os.environ["OMP_NUM_THREADS"] = "1"
        data = {p: prepare_part(args.raw, args.work, p, args.vocab_size) for p in args.parts}
        # Seed by seed, setup by setup, stock first: a study cut short still compares.
        order = itertools.product(args.seeds, args.setups, args.parts, args.arms)
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            jobs = [
                pool.submit(run_one, data[p], args.work, args.results, p, u, a, s, args)
                for s, u, p, a in order
            ]
        for job in jobs:
            job.result()
    for part in args.parts:
        out = write_results(args.results, part, args.seeds, args, command)
        if out:
            print(out.read_text())


if __name__ == "__main__":
    main()
