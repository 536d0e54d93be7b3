"""The core's head configuration and subclass factory, which every engine's
adapter uses: the configuration builds the head the keywords built, checks
its settings once and refuses a keyword that contradicts it; the factory
makes a class once, under one name, that pickle finds again."""

import argparse
import pickle

import numpy as np
import pytest
import torch

from natbias.errors import NaturalBiasError
from natbias.head_config import HeadConfig
from natbias.subclasses import natural_bias_subclass


class Stock(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.width = width


class Mixin:
    def doubled(self):
        return 2 * self.width


def test_the_configuration_builds_b_as_the_smoothed_log_unigram():
    counts = np.array([5, 0, 3, 12])
    config = HeadConfig(smoothing=0.5, gain_init=0.01, gain_speed=4.0)
    projection = config.build(torch.nn.Parameter(torch.randn(4, 3)), counts)
    # Computed apart in float64: log((c + alpha) / (N + alpha |V|)); b and the
    # prior are float32, whose rounding of values near -4 is below 1e-6.
    expected = np.log((counts + 0.5) / (counts.sum() + 0.5 * 4))
    np.testing.assert_allclose(projection.bias.detach().double().numpy(), expected, atol=1e-6)
    assert torch.equal(projection.natbias_log_prior, projection.bias.detach())
    assert projection.gain().item() == pytest.approx(0.01)  # g = min(|C u|, 1) with u = 0.01 / C
    saved = projection.natbias_settings
    assert (saved["smoothing"], saved["prior_tokens"], saved["gain_init"], saved["gain_speed"]) == (
        0.5,
        20,
        0.01,
        4.0,
    )
    assert HeadConfig(gain=False).saved(7)["gain_init"] is None


def test_settings_are_checked_once_and_a_contradicting_keyword_is_refused():
    for bad in (dict(smoothing=0.0), dict(gain_init=1.5), dict(gain_speed=-1.0)):
        with pytest.raises(NaturalBiasError) as error:
            HeadConfig(**bad)
        assert "\n" not in str(error.value)
    HeadConfig(gain=False, gain_init=1.5)  # no gain: its start is not used
    config = HeadConfig(smoothing=0.5)
    assert HeadConfig.of(config, smoothing=0.5, gain=None) is config
    assert HeadConfig.of(None, smoothing=0.5) == config
    with pytest.raises(NaturalBiasError, match="smoothing differ from config="):
        HeadConfig.of(config, smoothing=1.0)


def test_the_factory_makes_each_class_once_and_pickle_finds_it():
    made = natural_bias_subclass(Stock, Mixin)
    assert made is natural_bias_subclass(Stock, Mixin)
    assert made.__name__ == "NaturalBiasStock" and made.__mro__[1:3] == (Mixin, Stock)
    model = made(3)
    again = pickle.loads(pickle.dumps(model))
    assert type(again) is made and again.doubled() == 6


def test_hf_takes_a_configuration_as_it_takes_the_keywords():
    pytest.importorskip("transformers")
    from hf_tiny import build, zipf_targets

    from natbias.hf import add_natural_bias

    config = HeadConfig(smoothing=0.25, gain_init=0.02, gain_speed=10.0)
    by_config = add_natural_bias(build("llama"), zipf_targets(), config=config)
    by_keywords = add_natural_bias(build("llama"), zipf_targets(), smoothing=0.25,
                                   gain_init=0.02, gain_speed=10.0)  # fmt: skip
    assert torch.equal(by_config.output_bias(), by_keywords.output_bias())
    assert by_config.output_gain().item() == pytest.approx(0.02)
    assert {**by_config.config.natural_bias, "written_by": None} == {
        **by_keywords.config.natural_bias,
        "written_by": None,
    }
    stock = build("llama")
    with pytest.raises(NaturalBiasError, match="gain_speed differ") as error:
        add_natural_bias(stock, zipf_targets(), config=config, gain_speed=20.0)
    assert "\n" not in str(error.value) and not hasattr(stock, "natbias_slot")


def test_fairseq_builds_its_head_from_a_configuration(
    toy_bin, toy_log_unigram, tmp_path, monkeypatch
):
    pytest.importorskip("fairseq")
    from natbias_testing import build_in_process

    from fairseq_natbias import options
    from fairseq_natbias.natural_bias import use_head_config
    from fairseq_natbias.transformer_natbias import TransformerNatbiasModel

    config = HeadConfig(gain_init=0.02, gain_speed=4.0)
    build = TransformerNatbiasModel.build_model.__func__
    given = classmethod(lambda cls, args, task: build(cls, args, task, config=config))
    monkeypatch.setattr(TransformerNatbiasModel, "build_model", given)
    _, model, _ = build_in_process(toy_bin, tmp_path)  # as fairseq-train builds it
    head = model.decoder.output_projection
    assert head.gain().item() == pytest.approx(0.02) and head.gain_speed == 4.0
    # b = the float64 log-unigram of the toy targets (alpha 1), rounded to float32
    np.testing.assert_allclose(head.bias.detach().double().numpy(), toy_log_unigram, atol=1e-6)
    saved = model.natbias_args  # what a checkpoint saves
    assert (saved.natbias_weight_init, saved.natbias_gain_init, saved.natbias_gain_speed) == (
        "gain",
        0.02,
        4.0,
    )
    args = argparse.Namespace(natbias_smoothing=0.5)  # given on the command line
    options.set_defaults(args)
    with pytest.raises(NaturalBiasError, match="smoothing differ") as error:
        use_head_config(args, HeadConfig())
    assert "\n" not in str(error.value)


def test_olmo_core_takes_a_configuration_as_it_takes_the_keywords():
    pytest.importorskip("olmo_core")
    import olmo_tiny

    from natbias.olmo_core import add_natural_bias

    counts = np.random.default_rng(0).integers(0, 50, 1024)
    config = HeadConfig(smoothing=0.25, gain=False)
    head = add_natural_bias(olmo_tiny.model_1m(meta=False), counts=counts, config=config).lm_head
    by_keywords = add_natural_bias(olmo_tiny.model_1m(meta=False), counts=counts, smoothing=0.25,
                                   gain=False).lm_head  # fmt: skip
    assert torch.equal(head.w_out.bias, by_keywords.w_out.bias) and head.w_out.gain() is None
    assert head.w_out.natbias_settings == by_keywords.w_out.natbias_settings
    with pytest.raises(NaturalBiasError, match="gain differ"):  # before the model is looked at
        add_natural_bias(object(), counts=counts, config=config, gain=True)
