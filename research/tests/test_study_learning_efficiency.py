"""research/study_learning_efficiency.py's arithmetic on runs written here:
the options of a --converge run, and the table of a converged study (stock's
best validation NLL as the target, the update of each run's best, the ratio to
stock's best update, both test sets), checked against values worked by hand.
The script holds the command line; its parts live in research/study/ (arms,
runs, summary) and are read here through the script."""

import json

import numpy as np
import pytest
from research_scripts import benchmark_script

SIGNATURES = {"bleu_signature": "nrefs:1|tok:13a", "chrf_signature": "nrefs:1|nc:6"}


@pytest.fixture(scope="module")
def study():
    return benchmark_script("study_learning_efficiency")


def _write_run(run_dir, curve, bleu_2016, bleu_2017, step0=8.0):
    """A finished --converge run: fairseq's json valid lines, update 0 and scores."""
    run_dir.mkdir(parents=True)
    (run_dir / "train.log").write_text(
        "".join(
            f'2026-11-23 16:34:33 | INFO | valid | {{"epoch": 1, "valid_loss": "{nll + 1}", '
            f'"valid_nll_loss": "{nll}", "valid_num_updates": "{update}"}}\n'
            for update, nll in curve
        )
    )
    (run_dir / "step0.json").write_text(json.dumps({"nll": step0, "unigram_ce": 8.1}))
    (run_dir / "test_scores.json").write_text(
        json.dumps({"bleu": bleu_2016, "chrf": 50.0, **SIGNATURES})
    )
    (run_dir / "test_2017_flickr_scores.json").write_text(
        json.dumps({"bleu": bleu_2017, "chrf": 45.0, **SIGNATURES})
    )
    (run_dir / "done").touch()


def test_converge_options_drop_bleu_and_pick_the_best_by_nll(study):
    options = study.converge_options(study.Translation.options, "nll_loss")
    assert not any(
        option.startswith("--eval-bleu") or option == "--maximize-best-checkpoint-metric"
        for option in options
    )
    assert "{" not in " ".join(options)  # --eval-bleu-args' value went with it
    assert options[-2:] == ["--best-checkpoint-metric", "nll_loss"]
    assert "--share-all-embeddings" in options  # the model's options stay


def test_converged_table_aims_at_stocks_best(study, tmp_path):
    # stock's seeds are best (4.0, 3.8) at updates 1000 and 1500, then worse:
    # the target is their mean, 3.9, and stock's mean best update 1250.
    stock = {
        1: [(500, 5.0), (1000, 4.0), (1500, 4.2)],
        2: [(500, 5.0), (1000, 4.2), (1500, 3.8), (2000, 3.9)],
    }
    # The natbias arm falls through 3.9 between 500 (4.3) and 750 (3.5): at
    # 500 + 250 * (4.3 - 3.9) / (4.3 - 3.5) = 625, in both seeds.
    natbias = {
        1: [(500, 4.3), (750, 3.5), (1000, 3.6)],
        2: [(500, 4.3), (750, 3.5), (1000, 3.4), (1250, 3.45)],
    }
    root = tmp_path / "short-converge"
    for seed in (1, 2):
        _write_run(root / "stock" / f"seed{seed}", stock[seed], 20.0 + seed, 18.0 + seed, 13.7)
        _write_run(root / "gain-unigram" / f"seed{seed}", natbias[seed], 23.0 + seed, 20.0 + seed)
    task = study.Translation("de-en", ("test_2017_flickr",))
    arms = [study.Arm.parse("stock"), study.Arm.parse("gain/unigram")]
    runs = study.collect_runs(task, root, arms, [1, 2])
    rows, target, _, _ = study.summarise(task, runs, converge=True)
    assert target == pytest.approx(3.9)
    by_arm = {row["arm"]: row for row in rows}
    assert by_arm["gain/unigram"]["reach"] == [pytest.approx(625.0)] * 2
    assert by_arm["stock"]["best_update"] == [1000, 1500]
    assert by_arm["stock"]["last_update"] == [1500, 2000]
    assert by_arm["gain/unigram"]["best_update"] == [750, 1000]
    assert by_arm["gain/unigram"]["best_nll"].mean == pytest.approx((3.5 + 3.4) / 2)
    assert by_arm["gain/unigram"]["bleu_test_2017_flickr"].mean == pytest.approx(21.5)
    table = study.markdown_converged(rows, target, "t", study.CONVERGE_TEST_SETS)
    assert "updates to reach stock's best valid NLL (3.900)" in table
    assert "is scored, beam 5." in table
    # the same rows as a language model's: scored by fairseq-eval-lm, no beam
    lm_rows = [
        {
            **{k: v for k, v in row.items() if not k.startswith(("bleu", "chrf"))},
            "test_nll": row["best_nll"],
            "test_ppl": row["best_nll"],
        }
        for row in rows
    ]
    lm_table = study.markdown_converged(lm_rows, target, "t", study.CONVERGE_TEST_SETS)
    assert "is scored, by fairseq-eval-lm on the test set." in lm_table
    assert "beam" not in lm_table
    assert (
        "| gain/unigram | 2 | 8.000 ± 0.000 (n=2) | 625, 625 | 3.450 ± 0.050 (n=2) | 750, 1000 | 1000, 1250 |"
        in table
    )
    # 625 of stock's 1250: 0.50x; BLEU 24.5 against 21.5 (2016), 21.5 against 19.5 (2017).
    assert "updates to reach stock: 0.50x of stock's 1250 to its best" in table
    assert "test BLEU +3.000" in table and "test_2017_flickr BLEU +2.000" in table
    # Differences are paired by seed: best NLL 3.5 - 4.0 and 3.4 - 3.8, so
    # -0.45 with s.e. |(-0.5) - (-0.4)| / 2 = 0.05 (unpaired it would be
    # sqrt(0.05^2 + 0.1^2) = 0.112); BLEU +3 on both seeds, s.e. 0.
    assert "best valid NLL -0.450 (paired over 2 seeds, s.e. 0.050, -9.0 s.e.)" in table
    assert "test BLEU +3.000 (paired over 2 seeds, s.e. 0.000)" in table
    # Reach by horizon, h = 1000 only (stock's shortest run ends at 1500):
    # stock's mean NLL there is (4.0 + 4.2) / 2 = 4.1, which the natbias arm
    # crosses at 500 + 250 * (4.3 - 4.1) / (4.3 - 3.5) = 562.5 in both seeds.
    horizons, ratios = study.reach_by_horizon(runs)["gain/unigram"]
    assert horizons == [1000] and ratios.tolist() == [[pytest.approx(0.5625)]] * 2
    assert "| gain/unigram | 0.56 ± 0.00 |" in study.markdown_reach_by_horizon(
        {"gain/unigram": (horizons, ratios)}
    )
    # A seed that never reaches stock at some h is shown seed by seed there.
    partly = np.array([[0.5625, 0.9], [0.5, np.inf]])
    assert "| gain/unigram | 0.53 ± 0.03 | 0.90, never |" in study.markdown_reach_by_horizon(
        {"gain/unigram": ([1000, 2000], partly)}
    )


def test_differences_pair_only_the_seeds_both_arms_have(study, tmp_path):
    """Seeds 1-3 against 1-2 pair seeds 1 and 2 alone; against seed 1 alone,
    that seed's difference, without a standard error; with no seed in
    common, the difference of the means."""
    root = tmp_path / "short-converge"
    curves = {"stock": {1: 4.0, 2: 3.8, 3: 3.0}, "gain-unigram": {1: 3.5, 2: 3.4}}
    for folder, bests in curves.items():
        for seed, best in bests.items():
            _write_run(root / folder / f"seed{seed}", [(500, 5.0), (1000, best)], 20.0, 18.0)
    task = study.Translation("de-en", ("test_2017_flickr",))
    arms = [study.Arm.parse("stock"), study.Arm.parse("gain/unigram")]

    def best_nll_line(stock_seeds, natbias_seeds):
        runs = study.collect_runs(task, root, arms, [1, 2, 3])
        runs = {
            arm: [
                r
                for r in records
                if r["seed"] in (stock_seeds if arm.name == "stock" else natbias_seeds)
            ]
            for arm, records in runs.items()
        }
        rows, target, _, _ = study.summarise(task, runs, converge=True)
        table = study.markdown_converged(rows, target, "t", study.CONVERGE_TEST_SETS)
        return table.split("best valid NLL ")[-1]

    # (3.5 + 3.4) / 2 - (4.0 + 3.8 + 3.0) / 3 = 3.45 - 3.6 = -0.15, but paired
    # over seeds 1-2: -0.45, s.e. 0.05.
    assert best_nll_line({1, 2, 3}, {1, 2}).startswith("-0.450 (paired over 2 seeds, s.e. 0.050")
    # seed 1 alone for the natbias arm: that seed's 3.5 - 4.0, not 3.5 - 3.6.
    assert best_nll_line({1, 2, 3}, {1}).startswith("-0.500 (seed 1 only: no s.e.)")
    # no seed in common: the difference of the means, 3.4 - 4.0, one seed each.
    assert best_nll_line({1}, {2}).startswith("-0.600 (one seed: no s.e.)")


def test_archived_records_stand_in_for_runs_whose_logs_are_gone(study, tmp_path):
    """Seeds 1 and 2 summarised with an archive, then their run folders
    deleted (a machine lost), seed 3 trained later: the summary over seeds
    1-3 reads 1 and 2 from the archive and equals one over all three logs."""
    stock = {
        1: [(500, 5.0), (1000, 4.0)],
        2: [(500, 5.2), (1000, 3.8)],
        3: [(500, 4.9), (1000, 3.9)],
    }
    natbias = {
        1: [(500, 4.3), (1000, 3.7)],
        2: [(500, 4.1), (1000, 3.9)],
        3: [(500, 4.2), (1000, 3.6)],
    }

    def write(root, seeds):
        for seed in seeds:
            _write_run(root / "stock" / f"seed{seed}", stock[seed], 20.0 + seed, 18.0, 13.7)
            _write_run(root / "gain-unigram" / f"seed{seed}", natbias[seed], 23.0 + seed, 20.0)

    task = study.Translation("de-en", ("test_2017_flickr",))
    arms = [study.Arm.parse("stock"), study.Arm.parse("gain/unigram")]
    lost, archive = tmp_path / "lost" / "short-converge", tmp_path / "results" / "runs"
    write(lost, [1, 2])
    assert [len(r) for r in study.collect_runs(task, lost, arms, [1, 2], archive).values()] == [
        2,
        2,
    ]
    kept = json.loads((archive / "gain-unigram" / "seed2.json").read_text())
    assert kept["nll"] == [8.0, 4.1, 3.9] and kept["scores"]["bleu"] == 25.0
    for arm in arms:
        for seed in (1, 2):
            for path in (lost / arm.folder / f"seed{seed}").iterdir():
                path.unlink()
    write(lost, [3])
    both = tmp_path / "whole" / "short-converge"
    write(both, [1, 2, 3])
    tables = []
    for root, archived in ((lost, archive), (both, None)):
        runs = study.collect_runs(task, root, arms, [1, 2, 3], archived)
        rows, target, _, _ = study.summarise(task, runs, converge=True)
        tables.append(
            study.markdown_converged(rows, target, "t", study.CONVERGE_TEST_SETS, 0)
            + study.markdown_reach_by_horizon(study.reach_by_horizon(runs))
        )
    assert tables[0] == tables[1]
    # stock's best, (4.0 + 3.8 + 3.9) / 3 = 3.9, crossed by the natbias arm
    # between 500 and 1000 at 500 + 500 * (v500 - 3.9) / (v500 - v1000):
    # seed 1 (4.3, 3.7) 833, seed 2 (4.1, 3.9) 1000, seed 3 (4.2, 3.6) 750.
    assert "updates to reach stock's best valid NLL (3.900)" in tables[0]
    assert "| gain/unigram | 3 | 8.000 ± 0.000 (n=3) | 833, 1000, 750 |" in tables[0]


def test_a_stopped_run_trains_on_to_a_raised_cap_or_a_fixed_budget(study, tmp_path):
    """Stopped at its cap (1500, no early stop): reopened for a 3000 cap, its
    scores kept aside. Stopped by its patience: reopened only for a fixed
    budget (patience 0). Already at the cap: left finished."""
    capped = tmp_path / "capped"
    _write_run(capped, [(1000, 4.0), (1500, 3.9)], 20.0, 18.0)
    (capped / "test.hyp").write_text("a hypothesis\n")
    assert study.reopen_to_train_on(capped, 3000, 6, "capped")
    assert not (capped / "done").exists() and not list(capped.glob("*scores.json"))
    kept = capped / "stopped1500"
    assert sorted(p.name for p in kept.iterdir()) == [
        "done",
        "test.hyp",
        "test_2017_flickr_scores.json",
        "test_scores.json",
    ]
    assert json.loads((kept / "test_scores.json").read_text())["bleu"] == 20.0
    assert not study.reopen_to_train_on(capped, 3000, 6, "capped")  # not finished: no-op

    stopped = tmp_path / "stopped"
    _write_run(stopped, [(1000, 4.0), (1500, 4.1)], 20.0, 18.0)
    with open(stopped / "train.log", "a") as log:
        log.write(
            "2026-11-23 19:13:57 | INFO | fairseq_cli.train | "
            + study.EARLY_STOP
            + " for last 6 runs\n"
        )
    assert not study.reopen_to_train_on(stopped, 3000, 6, "stopped")
    assert (stopped / "done").exists()
    assert study.reopen_to_train_on(stopped, 3000, 0, "stopped")
    assert (stopped / "stopped1500" / "done").exists() and not (stopped / "done").exists()

    at_cap = tmp_path / "at_cap"
    _write_run(at_cap, [(1000, 4.0), (1500, 3.9)], 20.0, 18.0)
    assert not study.reopen_to_train_on(at_cap, 1500, 0, "at_cap")
    assert (at_cap / "test_scores.json").exists()


def _as_fairseq_train_parses(argv):
    from fairseq import options

    from fairseq_natbias.in_process import this_plugin_as_user_dir

    return options.parse_args_and_arch(
        options.get_training_parser(), input_args=this_plugin_as_user_dir(argv)
    )


def _parsed_training_arguments(study, task, arm, tmp_path):
    from argparse import Namespace

    args = Namespace(max_tokens=4096, validate_every=250, schedule="paper", max_update=100)
    return _as_fairseq_train_parses(
        study.training_arguments(task, tmp_path, tmp_path / "run", study.Arm.parse(arm), 1, args)
    )


def _sizes(parsed):
    return tuple(
        getattr(parsed, f"{side}_{what}")
        for side in ("encoder", "decoder")
        for what in ("layers", "embed_dim", "ffn_embed_dim", "attention_heads")
    )


def test_iwslt_preset_against_stock_at_the_same_size(study, tmp_path):
    """--preset iwslt: the plugin's transformer_natbias_iwslt_de_en against
    stock fairseq's transformer spelt out at its sizes, as fairseq-train
    parses the study's arguments; the sizes spelt out are the preset's own
    (the preset parsed with no size given)."""
    task = study.Translation("de-en")
    task.use_preset("iwslt")
    stock = _parsed_training_arguments(study, task, "stock", tmp_path)
    natbias = _parsed_training_arguments(study, task, "gain/unigram", tmp_path)
    assert (stock.arch, natbias.arch) == ("transformer", "transformer_natbias_iwslt_de_en")
    task.options = [o for o in task.options if o in ("--share-all-embeddings",)]
    preset_alone = _parsed_training_arguments(study, task, "gain/unigram", tmp_path)
    assert _sizes(stock) == _sizes(natbias) == _sizes(preset_alone) == (6, 256, 256, 4) * 2
    for parsed in (stock, natbias):
        assert parsed.share_all_embeddings and parsed.max_tokens == 4096
        assert (parsed.lr, parsed.warmup_updates, parsed.warmup_init_lr) == ([5e-4], 4000, 1e-7)


def test_screening_arms_reach_fairseq_train(study, tmp_path):
    """An arm's gain settings as fairseq-train parses them."""
    parsed = _parsed_training_arguments(
        study, study.Translation("de-en"), "gain@0.1,50/unigram", tmp_path
    )
    assert (parsed.natbias_weight_init, parsed.natbias_gain_init, parsed.natbias_gain_speed) == (
        "gain",
        0.1,
        50.0,
    )


@pytest.mark.parametrize(
    "arm, folder",
    [
        ("gain@0.05,20,capped/unigram", "gain_0.05_20_capped-unigram"),
        ("gain@0.05,100,exp,peak/unigram", "gain_0.05_100_exp_peak-unigram"),
        ("gain@0.05,20,linear/unigram", "gain_0.05_20_linear-unigram"),
    ],
)
def test_a_retired_gain_form_names_records_but_trains_nothing(study, tmp_path, arm, folder):
    """gain@G0,C,FORM[,SCHED]/BIAS (--natbias-gain-form and -schedule, retired
    in 1.0) still names the records of the runs made with it, but no run of
    a form 1.0 lacks starts."""
    assert study.Arm.parse(arm).folder == folder
    with pytest.raises(
        SystemExit,
        match=r"which 1.0 does not have: its records can be "
        r"summarised \(--summarise-only\)",
    ):
        _parsed_training_arguments(study, study.Translation("de-en"), arm, tmp_path)


def test_the_abs_capped_form_trains_the_one_gain_under_its_old_name(study, tmp_path):
    """abs-capped (lr) was the one form a new model could have: 1.0's gain. An
    arm naming it trains that gain, the option left out, its seeds filed
    beside the earlier ones."""
    for arm in ("gain@0.05,20,abs-capped/unigram", "gain@0.05,20,abs-capped,lr/unigram"):
        assert study.Arm.parse(arm).model_arguments(study.Translation("de-en")) == study.Arm.parse(
            "gain@0.05,20/unigram"
        ).model_arguments(study.Translation("de-en"))
    assert (
        study.Arm.parse("gain@0.05,20,abs-capped/unigram").folder
        == "gain_0.05_20_abs-capped-unigram"
    )


def test_the_committed_records_of_retired_forms_are_summarised(study):
    """research/results/runs/ holds runs of forms 1.0 retired (capped, 0.4.0's
    default; exp under the peak schedule): the summary reads them, and gives
    the figures committed from them (small_corpora_3000.md: best validation
    NLL 4.254 ± 0.005 against stock's 4.319 ± 0.008, paired −0.066 ± 0.010)."""
    from natbias_testing import REPO

    task = study.Translation("de-en", ("test_2017_flickr",))
    names = ("stock", "gain@0.05,20,capped/unigram", "gain@0.05,100,exp,peak/unigram")
    runs = study.collect_runs(
        task,
        REPO / "nowhere",
        [study.Arm.parse(n) for n in names],
        [1, 2, 3],
        REPO / "research" / "results" / "runs" / "de-en_n3000_short-converge",
    )
    rows, _, _, _ = study.summarise(task, runs, converge=True)
    by_arm = {row["arm"]: row for row in rows}
    assert set(by_arm) == set(names)
    assert by_arm["stock"]["best_nll"].format(3) == "4.319 ± 0.008 (n=3)"
    assert by_arm[names[1]]["best_nll"].format(3) == "4.254 ± 0.005 (n=3)"
    from study import summary

    value, spread = summary.difference(by_arm[names[1]], by_arm["stock"], "best_nll")
    assert f"{value:+.3f}" == "-0.066" and "paired over 3 seeds, s.e. 0.010" in spread


@pytest.mark.parametrize(
    "arm, init, order, freeze, smoothing",
    [
        ("gain/unigram", "unigram", 1, False, 1.0),
        ("gain/bigram", "unigram", 2, False, 1.0),
        ("gain/frozen-unigram", "unigram", 1, True, 1.0),
        ("fairseq/zero", "zero", 1, False, 1.0),
        ("gain/unigram~2.42", "unigram", 1, False, 2.42),
    ],
)
def test_bias_of_an_arm_as_fairseq_train_parses_it(
    study, tmp_path, arm, init, order, freeze, smoothing
):
    parsed = _parsed_training_arguments(study, study.Translation("de-en"), arm, tmp_path)
    assert (
        parsed.natbias_init,
        parsed.natbias_order,
        parsed.natbias_freeze,
        parsed.natbias_smoothing,
    ) == (init, order, freeze, smoothing)


@pytest.mark.parametrize(
    "arm, architecture, criterion, epsilon",
    [
        ("stock", "transformer", "label_smoothed_cross_entropy", 0.1),
        ("stock+unigram-ls", "transformer", "unigram_label_smoothed_cross_entropy", 0.1),
        (
            "gain@0.05,20,abs-capped/unigram+unigram-ls",
            "transformer_natbias",
            "unigram_label_smoothed_cross_entropy",
            0.1,
        ),
        (
            "gain@0.05,20,abs-capped/unigram+unigram-ls@0.2",
            "transformer_natbias",
            "unigram_label_smoothed_cross_entropy",
            0.2,
        ),
    ],
)
def test_criterion_of_an_arm_as_fairseq_train_parses_it(
    study, tmp_path, arm, architecture, criterion, epsilon
):
    """ARM+unigram-ls replaces the task's criterion, its epsilon kept (0.1)
    unless the arm names its own (@EPS)."""
    parsed = _parsed_training_arguments(study, study.Translation("de-en"), arm, tmp_path)
    assert (parsed.arch, parsed.criterion, parsed.label_smoothing) == (
        architecture,
        criterion,
        epsilon,
    )
    if "gain@" in arm:
        assert (parsed.natbias_weight_init, parsed.natbias_gain_init) == ("gain", 0.05)


@pytest.mark.parametrize(
    "arm", ["stock+uniform-ls", "stock+unigram-ls@2", "stock+unigram-ls@", "stock+unigram-ls@0.0"]
)
def test_an_unknown_criterion_suffix_is_refused(study, arm):
    with pytest.raises(SystemExit, match="after \\+ give one of unigram-ls, optionally @EPS"):
        study.Arm.parse(arm)


def test_zoomed_panel_keeps_the_line_from_its_first_update(study):
    import numpy as np

    line = {
        "label": "stock",
        "x": np.array([0, 1000, 2000, 3000]),
        "mean": np.array([13.0, 4.0, 3.0, 2.5]),
        "low": np.array([12.0, 3.9, 2.9, 2.4]),
        "high": np.array([14.0, 4.1, 3.1, 2.6]),
    }
    zoomed = study.from_update(line, 2000)
    assert zoomed["label"] == "stock"
    assert zoomed["x"].tolist() == [2000, 3000] and zoomed["mean"].tolist() == [3.0, 2.5]
    assert zoomed["low"].tolist() == [2.9, 2.4] and zoomed["high"].tolist() == [3.1, 2.6]


def test_timing_arguments_train_n_updates_without_validation_or_checkpoints(study, tmp_path):
    from argparse import Namespace

    task = study.Translation("de-en")
    args = Namespace(
        max_tokens=1500, validate_every=50, schedule="short", max_update=1000, time_updates=40
    )
    parsed = _as_fairseq_train_parses(
        study.timing_arguments(
            task, tmp_path, tmp_path / "run", study.Arm.parse("gain/unigram"), args
        )
    )
    assert (parsed.max_update, parsed.log_interval) == (40, 10)
    assert parsed.disable_validation and parsed.no_save
    assert args.max_update == 1000  # the study's own settings are left as they were


def test_vocabulary_scales_with_the_square_root_of_the_pairs(study):
    """8,000 * sqrt(N / 29,000), rounded to 500, by hand: 3,000 pairs ->
    2,573 -> 2,500; 10,000 -> 4,698 -> 4,500; 29,000 -> 8,000; more than
    Multi30k has is held at 8,000."""
    assert [study.vocabulary_for(n) for n in (3000, 10000, 29000, 100000)] == [
        2500,
        4500,
        8000,
        8000,
    ]


def test_first_pairs_keeps_both_sides_aligned_and_links_the_rest(study, tmp_path):
    import gzip

    raw = tmp_path / "raw"
    raw.mkdir()
    with gzip.open(raw / "train.de.gz", "wt", encoding="utf-8") as out:
        out.write("".join(f"de line {i}\n" for i in range(10)))
    (raw / "train.en").write_text("".join(f"en line {i}\n" for i in range(10)))  # plain
    for lang in ("de", "en"):
        for split in ("val", "test_2016_flickr", "test_2017_flickr"):
            (raw / f"{split}.{lang}").write_text(f"{split} {lang}\n")
    small = study.first_pairs(raw, tmp_path / "small", ("de", "en"), 3)
    for lang in ("de", "en"):
        with gzip.open(small / f"train.{lang}.gz", "rt", encoding="utf-8") as handle:
            assert handle.read().splitlines() == [f"{lang} line {i}" for i in range(3)]
        assert (small / f"val.{lang}").read_text() == f"val {lang}\n"
        assert (small / f"test_2017_flickr.{lang}").is_symlink()
    with pytest.raises(SystemExit, match="--train-pairs 11: .* has only 10 lines"):
        study.first_pairs(raw, tmp_path / "too_many", ("de", "en"), 11)


def _small_corpus_training(study, task, tmp_path):
    """fairseq-train's parse of the study's command for ``task`` at --train-pairs 3000."""
    from argparse import Namespace

    args = Namespace(
        max_tokens=1500, validate_every=100, schedule="short", max_update=2000, train_pairs=3000
    )
    return _as_fairseq_train_parses(
        study.training_arguments(
            task, tmp_path, tmp_path / "run", study.Arm.parse("stock"), 1, args
        )
    )


def test_a_small_corpus_validates_on_the_update_grid_alone(study, tmp_path):
    """With --train-pairs, fairseq's validation and save at every epoch's end
    (a few dozen updates at 3,000 pairs) are switched off."""
    parsed = _small_corpus_training(study, study.Translation("de-en"), tmp_path)
    assert parsed.validate_interval == parsed.save_interval == study.EPOCHS_NEVER
    assert parsed.validate_interval_updates == 100


def test_a_small_language_model_corpus_is_its_first_sentences(study, tmp_path):
    """--task lm --train-pairs N: the first N sentences of the one language,
    validated on the update grid alone, as for translation."""
    import gzip

    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "train.en").write_text("".join(f"en line {i}\n" for i in range(10)))
    for split in ("val", "test_2016_flickr"):
        (raw / f"{split}.en").write_text(f"{split} en\n")
    small = study.first_pairs(raw, tmp_path / "small", ("en",), 4)
    with gzip.open(small / "train.en.gz", "rt", encoding="utf-8") as handle:
        assert handle.read().splitlines() == [f"en line {i}" for i in range(4)]
    assert not list(small.glob("*.de*"))
    parsed = _small_corpus_training(study, study.LanguageModel("en"), tmp_path)
    assert parsed.validate_interval == parsed.save_interval == study.EPOCHS_NEVER
    assert parsed.task == "language_modeling"


def test_the_command_line_runs_as_users_run_it():
    """``python research/study_learning_efficiency.py`` from the repository
    root finds its parts (research/study/) and says its docstring as --help."""
    import subprocess

    from natbias_testing import REPO, script_python

    script = REPO / "research" / "study_learning_efficiency.py"
    shown = subprocess.run(
        [script_python(), str(script.relative_to(REPO)), "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert shown.startswith("usage: study_learning_efficiency.py")
    assert "The paper's learning-efficiency claim, measured on real data" in shown
    assert "--summarise-only" in shown and "--train-pairs N" in shown


def test_each_of_the_studys_files_is_at_most_500_lines():
    from natbias_testing import REPO

    files = [
        REPO / "research" / "study_learning_efficiency.py",
        *sorted((REPO / "research" / "study").glob("*.py")),
    ]
    assert len(files) >= 4
    assert {
        path.name: len(path.read_text(encoding="utf-8").splitlines())
        for path in files
        if len(path.read_text(encoding="utf-8").splitlines()) > 500
    } == {}


def test_the_zoomed_panel_starts_at_a_quarter_of_a_short_budget(study):
    """2,000 for the 20,000-update runs (as before), 500 for 2,000-update ones."""
    from study import summary

    def line(last):
        return {"label": "stock", "x": [0, last // 2, last], "mean": [1, 2, 3]}

    assert summary.zoom_start([line(20000), line(19000)]) == 2000
    assert summary.zoom_start([line(2000), line(1800)]) == 500


def test_the_cuda_device_drops_cpu_from_training_and_scoring(study, tmp_path, monkeypatch):
    """--device cuda: fairseq-train, fairseq-generate and fairseq-eval-lm
    without --cpu (fairseq then uses the GPU); the default keeps --cpu."""
    import pipeline

    for task in (study.Translation("de-en"), study.LanguageModel("en")):
        assert _parsed_training_arguments(study, task, "gain/unigram", tmp_path).cpu
        task.device = "cuda"
        assert not _parsed_training_arguments(study, task, "gain/unigram", tmp_path).cpu

    generated = []
    monkeypatch.setattr(
        pipeline, "evaluate", lambda *args, **kwargs: generated.append(kwargs["cpu"])
    )
    translation = study.Translation("de-en", ("test_2017_flickr",))
    translation.evaluate(tmp_path, tmp_path, tmp_path, "cpu run")
    translation.device = "cuda"
    translation.evaluate(tmp_path, tmp_path, tmp_path, "cuda run")
    assert generated == [True, True, False, False]  # test_2016, then test_2017, per device

    commands = []

    def eval_lm(argv):
        commands.append(argv)
        return "| Loss (base 2): 5.0000, Perplexity: 32.00"

    monkeypatch.setattr(pipeline, "run", eval_lm)
    for device in ("cpu", "cuda"):
        run_dir = tmp_path / f"lm_{device}"
        run_dir.mkdir()
        lm = study.LanguageModel("en")
        lm.device = device
        lm.evaluate(tmp_path, tmp_path, run_dir, device)
        assert json.loads((run_dir / "test_scores.json").read_text()) == {"nll": 5.0, "ppl": 32.0}
    assert ["--cpu" in argv for argv in commands] == [True, False]
