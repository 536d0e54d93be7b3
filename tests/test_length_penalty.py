"""benchmarks/length_penalty.py: the lenpen screened on validation, chosen by
its BLEU, then used on the test sets; decodes kept and not redone. The
decoder is replaced by one whose outputs are known, so every BLEU and
length ratio below is worked by hand."""

import json

import pytest

from natbias_testing import benchmark_script

VALID = ["a man rides a red bike", "two dogs play in the snow"]
TEST = ["a woman sings on a stage", "the child eats an apple"]
TEST_2017 = ["people walk down a busy street"]


@pytest.fixture(scope="module")
def length_penalty():
    return benchmark_script("length_penalty")


def write(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def fake_study(root, study_bleu=(37.5, 31.25)):
    """WORK/de-en/paper-converge/stock/seed1 as the study leaves it: the best
    checkpoint, its test scores at lenpen 1.0, the references."""
    work = root / "de-en"
    write(work / "text" / "valid.raw.en", VALID)
    write(work / "text" / "test.raw.en", TEST)
    write(work / "text-test_2017_flickr" / "test.raw.en", TEST_2017)
    run_dir = work / "paper-converge" / "stock" / "seed1"
    run_dir.mkdir(parents=True)
    (run_dir / "checkpoint_best.pt").write_bytes(b"")
    (run_dir / "test_scores.json").write_text(json.dumps({"bleu": study_bleu[0]}))
    (run_dir / "test_2017_flickr_scores.json").write_text(json.dumps({"bleu": study_bleu[1]}))
    return work / "paper-converge"


def decoder_exact_at(best, calls):
    """A stand-in for pipeline.translate: the reference itself at lenpen
    ``best``, the reference less its last word below it, one word more above."""
    def translate(data_bin, checkpoint, subset, lenpen):
        calls.append((data_bin.name, subset, lenpen))
        folder = "text" if data_bin.name == "data-bin" else "text-" + data_bin.name[len("data-bin-"):]
        references = (data_bin.parent / folder / f"{subset}.raw.en").read_text().splitlines()
        if lenpen < best:
            return [" ".join(line.split()[:-1]) for line in references]
        if lenpen > best:
            return [line + " again" for line in references]
        return references
    return translate


def test_length_ratio_counts_13a_tokens(length_penalty):
    # "a dog" is 2 tokens, "a dog runs ." 4 (13a splits the full stop off): c / r = 0.5
    scores = length_penalty.bleu_and_length(["a dog"], ["a dog runs ."])
    assert scores["length_ratio"] == pytest.approx(0.5)
    assert scores["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")


def test_the_best_validation_bleu_wins_and_a_tie_goes_to_the_lower_lenpen(length_penalty):
    scores = {0.8: {"bleu": 30.0}, 1.0: {"bleu": 30.0}, 1.2: {"bleu": 29.9}}
    assert length_penalty.best_lenpen(scores) == 0.8
    scores[1.2]["bleu"] = 30.01
    assert length_penalty.best_lenpen(scores) == 1.2


def test_a_run_is_tuned_on_validation_and_scored_on_both_test_sets(length_penalty, tmp_path,
                                                                    monkeypatch):
    setting = fake_study(tmp_path)
    calls = []
    monkeypatch.setattr(length_penalty.pipeline, "translate", decoder_exact_at(1.4, calls))
    out = tmp_path / "lenpen.md"
    length_penalty.main([str(setting), "--arms", "stock", "--seeds", "1",
                         "--grid", "0.8", "1.0", "1.4", "2.0", "--out", str(out)])
    # every grid point on validation, then the two test sets at the chosen 1.4 only
    assert [(split, lenpen) for _, split, lenpen in calls] == \
        [("valid", 0.8), ("valid", 1.0), ("valid", 1.4), ("valid", 2.0), ("test", 1.4), ("test", 1.4)]
    kept = json.loads((setting / "stock" / "seed1" / "lenpen" / "valid_1.json").read_text())
    # below 1.4 each sentence loses its last word: 5 + 5 tokens of 6 + 6
    assert kept["length_ratio"] == pytest.approx(10 / 12, abs=1e-4)  # kept to 4 decimals
    # the validation translation at the study's lenpen is kept where the study keeps its own
    assert (setting / "stock" / "seed1" / "valid.hyp").read_text().splitlines() == \
        [" ".join(line.split()[:-1]) for line in VALID]
    text = out.read_text()
    # at 1.4 the outputs are the references: BLEU 100 on validation and both test sets,
    # against the study's own 37.50 / 31.25 at lenpen 1.0
    assert "| stock | 1 | 1.4 | " in text and " / 100.00 | 0.833 / 1.000 | 37.50 / 100.00 | 31.25 / 100.00 |" in text
    assert "| stock | test_2016_flickr | 37.50 | 100.00 | +62.50 |" in text
    calls.clear()
    length_penalty.main([str(setting), "--arms", "stock", "--seeds", "1",
                         "--grid", "0.8", "1.0", "1.4", "2.0"])
    assert calls == []  # every decode was kept


def test_arms_are_compared_seed_by_seed(length_penalty):
    def row(study, tuned):
        valid = {1.0: {"bleu": 30.0, "length_ratio": 1.0}}
        tests = {name: {"study": s, "tuned": t}
                 for name, s, t in zip(("test_2016_flickr", "test_2017_flickr"), study, tuned)}
        return {"lenpen": 1.0, "valid": valid, "test": tests}
    rows = {"stock": {1: row((40.0, 30.0), (40.0, 30.0)), 2: row((41.0, 31.0), (41.0, 31.0))},
            "criterion": {1: row((39.0, 30.0), (39.5, 30.0)), 2: row((41.0, 31.0), (41.5, 31.0))}}
    text = length_penalty.markdown("t", rows, ["stock", "criterion"])
    # test_2016: tuning adds 0.5 to both seeds; the differences to stock at 1.0 are
    # -1, 0 (mean -0.50, s.e. 0.50), tuned -0.5, +0.5 (mean 0, s.e. 0.50)
    assert "| criterion | test_2016_flickr | 40.00 ± 1.00 | 40.50 ± 1.00 | +0.50 ± 0.00 | " \
           "-0.50 ± 0.50 | +0.00 ± 0.50 |" in text


def test_a_grid_without_the_studys_lenpen_is_refused(length_penalty, tmp_path):
    setting = fake_study(tmp_path)
    with pytest.raises(SystemExit, match="must hold the study's lenpen 1.0"):
        length_penalty.main([str(setting), "--arms", "stock", "--seeds", "1", "--grid", "1.2"])


def test_a_missing_checkpoint_is_named(length_penalty, tmp_path):
    setting = fake_study(tmp_path)
    with pytest.raises(SystemExit, match="no .*seed2/checkpoint_best.pt"):
        length_penalty.main([str(setting), "--arms", "stock", "--seeds", "2"])


def test_the_last_checkpoint_decodes_the_test_sets_itself(length_penalty, tmp_path, monkeypatch):
    """--checkpoint last: checkpoint_last.pt decodes every split, the test
    sets at 1.0 too (the study's scores are the best checkpoint's); kept
    apart from the best checkpoint's decodes, and valid.hyp left to those."""
    setting = fake_study(tmp_path)
    run_dir = setting / "stock" / "seed1"
    (run_dir / "checkpoint_last.pt").write_bytes(b"")
    calls, checkpoints = [], []
    exact = decoder_exact_at(1.0, calls)

    def translate(data_bin, checkpoint, subset, lenpen):
        checkpoints.append(checkpoint.name)
        return exact(data_bin, checkpoint, subset, lenpen)

    monkeypatch.setattr(length_penalty.pipeline, "translate", translate)
    out = tmp_path / "last.md"
    length_penalty.main([str(setting), "--arms", "stock", "--seeds", "1", "--grid", "1.0",
                         "--checkpoint", "last", "--out", str(out)])
    assert [(split, lenpen) for _, split, lenpen in calls] == \
        [("valid", 1.0), ("test", 1.0), ("test", 1.0)]
    assert set(checkpoints) == {"checkpoint_last.pt"}
    assert sorted(p.name for p in (run_dir / "lenpen").iterdir()) == \
        ["test_2016_flickr_1_last.json", "test_2017_flickr_1_last.json", "valid_1_last.json"]
    assert not (run_dir / "valid.hyp").exists()
    text = out.read_text()
    # the outputs are the references: 100 everywhere, not the study's 37.50 / 31.25
    assert "(checkpoint_last.pt): length penalty" in text
    assert "| stock | 1 | 1 | 100.00 / 100.00 | 1.000 / 1.000 | 100.00 / 100.00 | 100.00 / 100.00 |" in text
    (run_dir / "checkpoint_last.pt").unlink()
    with pytest.raises(SystemExit, match="no .*seed1/checkpoint_last.pt"):
        length_penalty.main([str(setting), "--arms", "stock", "--seeds", "1", "--grid", "1.0",
                             "--checkpoint", "last"])
