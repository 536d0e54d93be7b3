"""research/study_multilingual.py's pure logic on logs and records written
here (no training): the per-direction validation curves read off fairseq's
json log lines, the updates to reach stock's NLL at update 1,000, the
converged table at each run's best checkpoint, and the empty validation
datasets fairseq's multilingual task reads for the other pairs."""

import json

import pytest
from research_scripts import benchmark_script


@pytest.fixture(scope="module")
def study():
    return benchmark_script("study_multilingual")


def _line(subset, update, nll):
    prefix = f"{subset}_"  # fairseq's json keys carry the subset's name
    return (
        f'2026-12-06 11:41:31 | INFO | {subset} | {{"epoch": 1, "{prefix}loss": "{nll + 1}", '
        f'"{prefix}nll_loss": "{nll}", "{prefix}num_updates": "{update}"}}'
    )


def _log(curves):
    """fairseq-train's json validation lines: ``{subset: [(update, nll), ...]}``."""
    lines = ['2026-12-06 11:42:02 | INFO | train_inner | {"epoch": 1, "num_updates": "25"}']
    for subset, points in curves.items():
        lines += [_line(subset, u, v) for u, v in points]
    return lines


def test_curves_are_read_per_direction_and_a_resumed_run_keeps_the_last(study):
    lines = _log(
        {
            "valid": [(50, 7.0), (100, 6.0), (100, 5.9)],  # resumed: 100 validated again
            "valid_en_de": [(50, 7.2), (100, 6.1)],
            "valid_en_fr": [(50, 6.8), (100, 5.7)],
        }
    )
    curves = study.curves_from_log(lines)
    assert curves == {
        "all": {50: 7.0, 100: 5.9},
        "en-de": {50: 7.2, 100: 6.1},
        "en-fr": {50: 6.8, 100: 5.7},
    }
    assert study.pair_of(study.subset_name("de-en")) == "de-en"


def _record(curves, best, bleu=None, **extra):
    return {
        "curves": {k: {str(u): v for u, v in c} for k, c in curves.items()},
        "best_update": best,
        "last_update": max(u for u, _ in curves["all"]),
        "stopped_early": True,
        "bleu": bleu or {},
        **extra,
    }


def _keep(results, part, setup, arm, seed, record):
    path = results / "runs" / f"multilingual_{part}" / setup / arm / f"seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def test_updates_to_reach_stocks_nll_at_1000_per_direction(study, tmp_path):
    stock = {
        "all": [(500, 5.0), (1000, 4.0)],
        "en-de": [(500, 5.2), (1000, 4.2)],
        "en-fr": [(500, 4.8), (1000, 3.8)],
    }
    # 4.5 at 500, 3.5 at 1000: reaches 4.0 at 750 (overall); en-de 4.7 -> 3.7
    # reaches 4.2 at 750; en-fr never gets to 3.8 (4.0 at 1000)
    natbias = {
        "all": [(500, 4.5), (1000, 3.5)],
        "en-de": [(500, 4.7), (1000, 3.7)],
        "en-fr": [(500, 4.3), (1000, 4.0)],
    }
    _keep(tmp_path, "full", "one-to-many", "stock", 1, _record(stock, 1000))
    bleu = {"en-de": {"bleu": 12.5, "bleu_signature": "s", "chrf_signature": "c"}}
    _keep(tmp_path, "full", "one-to-many", "pooled", 1, _record(natbias, 1000, bleu))
    found = study.load_records(tmp_path, "full", [1, 2])
    table = "\n".join(study.reach_table(found, "one-to-many"))
    assert "| all (both directions) | stock | 1 | 4.000 | 1000 | 1.00× | – |" in table
    assert "| all (both directions) | pooled | 1 | 3.500 | 750 | 0.75× | – |" in table
    assert "| en-de | pooled | 1 | 3.700 | 750 | 0.75× | 12.50 |" in table
    assert "| en-fr | pooled | 1 | 4.000 | never | – | – |" in table
    assert "all 4.000, en-de 4.200, en-fr 3.800" in table


def test_the_converged_table_reads_each_direction_at_the_overall_best(study, tmp_path):
    bleu = {
        "de-en": {"bleu": 30.0, "bleu_signature": "nrefs:1|tok:13a", "chrf_signature": "c"},
        "fr-en": {"bleu": 35.0, "bleu_signature": "nrefs:1|tok:13a", "chrf_signature": "c"},
    }
    for seed, shift in ((1, 0.0), (2, 0.2)):
        curves = {
            "all": [(100, 5.0 + shift), (200, 4.0 + shift), (300, 4.1 + shift)],
            "de-en": [(100, 5.1), (200, 4.1 + shift), (300, 3.9)],  # its own minimum later
            "fr-en": [(100, 4.9), (200, 3.9 + shift), (300, 4.3)],
        }
        _keep(tmp_path, "n3000", "many-to-one", "stock", seed, _record(curves, 200, bleu))
    found = study.load_records(tmp_path, "n3000", [1, 2])
    table = "\n".join(study.converged_table(found, "many-to-one"))
    # mean ± standard error of 4.1 and 4.3: 4.2 ± 0.1
    assert (
        "| stock | 1, 2 | 200 (300, patience), 200 (300, patience) | 4.100 ± 0.100 | 4.200 ± 0.100 | "
        "4.000 ± 0.100 | 30.00 ± 0.00 | 35.00 ± 0.00 |" in table
    )
    assert study.signatures(found) == ("nrefs:1|tok:13a", "c")


def test_the_empty_validation_datasets_read_as_zero_sentences(study, tmp_path):
    import torch
    from fairseq.data import data_utils, indexed_dataset

    for pair, tokens in (("en-de", [5, 2]), ("en-fr", [6, 7, 2])):
        for lang in pair.split("-"):
            stem = str(tmp_path / f"valid.{pair}.{lang}")
            builder = indexed_dataset.make_builder(f"{stem}.bin", "mmap")
            builder.add_item(torch.tensor(tokens, dtype=torch.int32))
            builder.finalize(f"{stem}.idx")

    def read(name):
        return data_utils.load_indexed_dataset(str(tmp_path / name), None, "mmap")

    for _ in range(2):  # a second call keeps what the first made
        study.add_direction_subsets(tmp_path, ["en-de", "en-fr"])
        assert [read("valid_en_de.en-de.de")[0].tolist(), len(read("valid_en_de.en-fr.fr"))] == [
            [5, 2],
            0,
        ]
        assert [read("valid_en_fr.en-fr.fr")[0].tolist(), len(read("valid_en_fr.en-de.en"))] == [
            [6, 7, 2],
            0,
        ]
