"""research/study/arms.py and the fairseq-train arguments of research/study/runs.py,
read through research/study_learning_efficiency.py: each arm's options as
fairseq-train parses them, the --preset sizes, the retired gain forms, the
--train-pairs corpus and vocabulary, and the cuda device."""

import json

import pytest
from research_scripts import benchmark_script


@pytest.fixture(scope="module")
def study():
    return benchmark_script("study_learning_efficiency")


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
    if "gain@" in arm:  # the screening arm's gain settings reach fairseq-train too
        assert (
            parsed.natbias_weight_init,
            parsed.natbias_gain_init,
            parsed.natbias_gain_speed,
        ) == ("gain", 0.05, 20.0)


@pytest.mark.parametrize(
    "arm", ["stock+uniform-ls", "stock+unigram-ls@2", "stock+unigram-ls@", "stock+unigram-ls@0.0"]
)
def test_an_unknown_criterion_suffix_is_refused(study, arm):
    with pytest.raises(SystemExit, match="after \\+ give one of unigram-ls, optionally @EPS"):
        study.Arm.parse(arm)


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


@pytest.mark.parametrize("task_name", ["translation", "language_modeling"])
def test_a_small_corpus_validates_on_the_update_grid_alone(study, tmp_path, task_name):
    """With --train-pairs, fairseq's validation and save at every epoch's end
    (a few dozen updates at 3,000 pairs) are switched off, for either task."""
    from argparse import Namespace

    task = study.Translation("de-en") if task_name == "translation" else study.LanguageModel("en")
    args = Namespace(
        max_tokens=1500, validate_every=100, schedule="short", max_update=2000, train_pairs=3000
    )
    parsed = _as_fairseq_train_parses(
        study.training_arguments(
            task, tmp_path, tmp_path / "run", study.Arm.parse("stock"), 1, args
        )
    )
    assert parsed.validate_interval == parsed.save_interval == study.EPOCHS_NEVER
    assert (parsed.validate_interval_updates, parsed.task) == (100, task_name)


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
