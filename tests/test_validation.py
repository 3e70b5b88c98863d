"""Bad input gets one clear error, naming the input and what is allowed, before
the model runs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from spec_ar.sampling import ConfigError, DecodeConfig, SpeculativeDecoder, generate

from .fakes import TabularAdapter


@pytest.mark.parametrize("settings,message", [
    (dict(window=0), "window must be an integer in [1, 256]; none is auto (got 0)"),
    (dict(mode="gsd", group_size=0), "group_size must be an integer in [1, 1000] (got 0)"),
    (dict(gsd_delta=1.5), "gsd_delta must be a number in [0, 1] (got 1.5)"),
    (dict(gsd_delta=-0.1), "gsd_delta must be a number in [0, 1] (got -0.1)"),
    (dict(lantern_delta=float("nan")), "lantern_delta must be a number in [0, 1] (got nan)"),
    (dict(mode="lantern", lantern_k=4), "lantern_k must be an integer in [1, 3] for this model's codebook of 4 codes (got 4)"),
    (dict(top_k=0), "top_k must be an integer in [1, the vocabulary size] (got 0)"),
    (dict(top_p=0.0), "top_p must be a number in [1e-06, 1] (got 0.0)"),
    (dict(temperature=-1.0), "temperature must be a number in [0, 100] (got -1.0)"),
    (dict(skip_interval=1), "skip_interval must be an integer in [2, 64] (got 1)"),
    (dict(mode="fast"), "mode must be one of 'ar', 'sjd', 'gsd', 'lantern', 'vvs' (got 'fast')"),
    (dict(init="diagonal"), "init must be one of 'random', 'repeat-left', 'repeat-above', 'sample-left', 'sample-above' (got 'diagonal')"),
    (dict(window=2.5), "window must be an integer in [1, 256]; none is auto (got 2.5)"),
    (dict(mode="ar", acceptance="grouped"), "mode 'ar' has no drafts"),
    (dict(lantern_k=2_000_000), "lantern_k must be an integer in [1, the model's codebook size - 1] (got 2000000)"),
    (dict(init="x" * 10_000), "(got 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx... (10002 characters))"),
])
def test_bad_settings(settings, message):
    model = TabularAdapter()
    with pytest.raises(ConfigError) as err:
        SpeculativeDecoder(model, DecodeConfig(**settings)).generate([0])
    assert message in str(err.value)
    assert model.calls == [], "no model work before the error"


@pytest.mark.parametrize("call,message", [
    (dict(conditions=[]), "conditions must hold at least one prompt"),
    (dict(conditions=[0, 1], negatives=[0, 1, 1]), "negatives must hold one negative prompt, or one per prompt (2), got 3"),
    (dict(conditions=[0, "a cat"]), "conditions must all be of one type"),
    (dict(conditions=[0, 1], seeds=[1]), "seeds must be an integer (image i gets seed + i) or one integer per prompt (2), got [1]"),
])
def test_mismatched_batches(call, message):
    model = TabularAdapter()
    with pytest.raises(ConfigError, match=None) as err:
        SpeculativeDecoder(model, DecodeConfig()).generate(**call)
    assert message in str(err.value)
    assert model.calls == []


def test_unknown_setting_names_are_listed():
    with pytest.raises(ConfigError, match=r"unknown decoding setting\(s\) \['windw'\]"):
        DecodeConfig.from_dict({"windw": 3})


def test_relaxed_rules_need_codebook_vectors():
    model = TabularAdapter()
    model.token_vectors = lambda: None
    with pytest.raises(ConfigError, match="needs codebook vectors"):
        SpeculativeDecoder(model, DecodeConfig(mode="lantern", lantern_k=2))
    SpeculativeDecoder(model, DecodeConfig(mode="gsd"))  # GSD without d does not


class WrongShapes(TabularAdapter):
    def __init__(self, where):
        super().__init__()
        self.where = where

    def prefill(self, *a):
        out = super().prefill(*a)
        return out[0] if self.where == "prefill" else out

    def forward(self, tokens):
        out = super().forward(tokens)
        return out[..., :-1] if self.where == "forward" else out


@pytest.mark.parametrize("where,message", [
    ("prefill", "adapter.prefill() must return logits of shape [branches, batch, vocab] = [2, 1, 5], got (1, 5)"),
    ("forward", "adapter.forward() must return logits of shape [branches, batch, window, vocab] = [2, 1, 5, 5], got (2, 1, 5, 4)"),
])
def test_adapter_returning_the_wrong_shape(where, message):
    with pytest.raises(ValueError) as err:
        SpeculativeDecoder(WrongShapes(where), DecodeConfig(window=4, cfg_scale=2.0)).generate([0])
    assert message in str(err.value)


def test_the_adapter_vets_its_prompts_before_prefill():
    from spec_ar.loaders.synthetic import SyntheticAdapter

    model = SyntheticAdapter(classes=3)
    with pytest.raises(ValueError, match=r"class id in \[0, 2\].*got 7"):
        SpeculativeDecoder(model, DecodeConfig()).generate([1, 7])
    assert model.hist is None


def test_a_group_larger_than_the_vocabulary_is_the_whole_ranking():
    model = TabularAdapter()  # 5 ids
    runs = [SpeculativeDecoder(model, DecodeConfig(mode="gsd", window=3, group_size=g)).generate([0, 1], seeds=2)
            for g in (9, 1000)]
    assert torch.equal(runs[0].tokens, runs[1].tokens)


@pytest.mark.parametrize("seeds", [np.int64(3), np.uint8(3), torch.tensor(3), [np.int32(3), torch.tensor(4)],
                                   np.array([3, 4]), torch.tensor([3, 4]), (3, 4)])
def test_integer_like_seeds_are_seeds(seeds):
    model = TabularAdapter()
    want = generate(model, [0, 1], DecodeConfig(window=3), seeds=3).tokens
    assert torch.equal(generate(model, [0, 1], DecodeConfig(window=3), seeds=seeds).tokens, want)


@pytest.mark.parametrize("seeds", [3.0, np.float64(3), torch.tensor(3.0), "3", [1.5, 2], [True, 2], True, None,
                                   torch.tensor([[3, 4]]), object()])
def test_anything_else_is_one_error_naming_seeds(seeds):
    model = TabularAdapter()
    with pytest.raises(ConfigError, match=r"^seeds must be an integer \(image i gets seed \+ i\) or one integer per "
                                          r"prompt \(2\), got "):
        generate(model, [0, 1], DecodeConfig(window=3), seeds=seeds)
    assert model.calls == []
