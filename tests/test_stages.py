"""Stages taking turns in memory (``loaders/stages.py``): one stage at a time, the one before it out of the way
first; dropped modules keep their objects and get their tensors back from a fresh load."""
import pytest
import torch

from spec_ar.loaders import stages


def tied_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    m[1].weight = m[0].weight  # tied, as heads often are
    m.register_buffer("table", torch.arange(3.0), persistent=False)  # a buffer no file stores
    return m


def test_a_dropped_module_keeps_its_objects_and_gets_a_fresh_loads_tensors_with_their_ties():
    model = tied_model(0)
    layer = model[1]
    expected = model[0].weight.detach().clone()
    stages.drop(model)
    assert stages.on_meta(model) and model[1] is layer
    stages.adopt(model, tied_model(0))
    assert not stages.on_meta(model) and model[1] is layer
    assert torch.equal(model[0].weight, expected) and model[1].weight is model[0].weight
    assert torch.equal(model.table, torch.arange(3.0))
    with pytest.raises(ValueError, match="another structure"):
        stages.adopt(model, torch.nn.Linear(4, 4))


def test_one_stage_at_a_time_the_one_before_out_of_the_way_first():
    log = []

    def stage(name):
        return stages.Stage(name, 1, lambda: log.append(f"{name} in"), lambda: log.append(f"{name} parked"),
                            lambda: log.append(f"{name} dropped"))

    turns = stages.Turns([stage("sampling"), stage("decoding")], "system", active="sampling")
    turns.turn("sampling")  # already there: nothing moves
    turns.turn("decoding")
    turns.turn("sampling")
    assert log == ["sampling parked", "decoding in", "decoding parked", "sampling in"]
    assert turns.moves == {"enter": 2, "park": 2, "drop": 0}
    log.clear()
    together = stages.Turns([stage("sampling"), stage("decoding")], "none", active="sampling")
    together.turn("decoding")
    assert log == ["decoding in"]  # nothing leaves
    with pytest.raises(ValueError, match="wait must be one of none, system, files"):
        stages.Turns([], "swap")
