"""Finished images leave the batch (``sampling/engine.py``, ``LEAVE_SHARE``): once a quarter of a
batch has finished, the adapter drops those images' cache rows and the engine their state, so the
forwards narrow.  Every image is the one it would have been riding along (each draws its own numbers),
with the same report; step events still describe the whole batch."""
from __future__ import annotations

import pytest
import torch

from spec_ar.loaders import embedded
from spec_ar.loaders.synthetic import SyntheticAdapter
from spec_ar.sampling import DecodeConfig, SpeculativeDecoder
from spec_ar.sampling import engine

PROMPTS = ["a red circle", "a blue square on a striped background", "a green star", "a yellow ring at the top",
           "a purple triangle", "an orange cross on the left", "a white circle on a black background", "a red star"]


@pytest.fixture(scope="module")
def model():
    return embedded.load()


def riding(adapter, config, conditions, seeds, drafter=None):
    """The batch decoded with no image leaving (the host step)."""
    decoder = SpeculativeDecoder(adapter, config, drafter=drafter)
    decoder.leaves = False
    return decoder.generate(conditions, seeds=seeds)


@pytest.fixture(scope="module")
def ridden():
    """:func:`riding`, decoded once a setting (``key``) on the host step: the step on the device gives the
    host step's images and reports (test_device_step.py), so one decode serves both step kinds."""
    decoded = {}

    def once(key, *args, **kwargs):
        if key not in decoded:
            decoded[key] = riding(*args, **kwargs)
        return decoded[key]

    return once


def both(adapter, config, conditions, seeds, device_step=False, events=None, first=None):
    """The batch riding along (``first``, if decoded already), then leaving: results, and the batch sizes
    each forward of the second saw."""
    first = riding(adapter, config, conditions, seeds) if first is None else first
    leaving = SpeculativeDecoder(adapter, config, device_step=device_step)
    assert leaving.leaves
    widths = []
    forward, tree = type(adapter).forward, getattr(type(adapter), "forward_tree", None)

    def counted(self, tokens, *rest):
        widths.append(tokens.shape[0])
        return (forward if not rest else tree)(self, tokens, *rest)

    type(adapter).forward = counted
    if tree is not None:  # (proactive drafts score a tree beside the window)
        type(adapter).forward_tree = counted
    try:
        second = leaving.generate(conditions, seeds=seeds, callback=events.append if events is not None else None)
    finally:
        type(adapter).forward = forward
        if tree is not None:
            type(adapter).forward_tree = tree
    return first, second, widths


def same(first, second):
    assert torch.equal(first.tokens, second.tokens)
    for a, b in zip(first.reports, second.reports):
        assert (a.nfe, a.origins, a.accepted_length_histogram, a.seed) == (b.nfe, b.origins,
                                                                          b.accepted_length_histogram, b.seed)
        assert a.draft_stability == pytest.approx(b.draft_stability)


@pytest.mark.parametrize("config", [dict(mode="sjd", window=6), dict(mode="gsd", window=6),
                                    dict(mode="lantern", window=6, lantern_k=4),
                                    dict(mode="sjd", window=6, draft_coupling="none"),
                                    dict(mode="sjd", window=6, draft_coupling="gumbel"),
                                    dict(mode="sjd", window=6, proactive=3), dict(mode="vvs", window=6),
                                    dict(mode="vvs", window=3, skip_interval=3),
                                    dict(mode="sjd", window=6, rows=3, row_lead=2)])
@pytest.mark.parametrize("device_step", [False, True])
def test_images_that_leave_are_the_images_that_rode_along(model, ridden, config, device_step):
    events = []
    first = ridden(repr(config), model.adapter, DecodeConfig(**config), PROMPTS, 11)
    first, second, widths = both(model.adapter, DecodeConfig(**config), PROMPTS, 11, device_step, events, first)
    same(first, second)
    # not vacuous: the images ended apart and the forwards narrowed in steps of a quarter or more
    assert widths[0] == 8 and widths[-1] < 8 and widths == sorted(widths, reverse=True)
    assert all(b - a == 0 or (a - b) * engine.LEAVE_SHARE >= a for a, b in zip(widths, widths[1:]))
    assert sum(widths) < 8 * len(widths)
    # every event tells of the whole batch; the images that left are finished there
    assert all(len(e.committed) == 8 and e.tokens.shape[0] == 8 for e in events)
    assert events[-1].committed == [events[-1].length] * 8
    assert torch.equal(events[-1].tokens[:, : events[-1].length], second.tokens)


def test_the_next_batch_starts_whole_again(model):
    decoder = SpeculativeDecoder(model.adapter, DecodeConfig(mode="sjd", window=6))
    a = decoder.generate(PROMPTS, seeds=5)
    b = decoder.generate(PROMPTS, seeds=5)  # the adapter's cache rows were narrowed by the first
    assert torch.equal(a.tokens, b.tokens)


def test_the_stand_in_model_too():
    ad = SyntheticAdapter(codebook=64, rows=6, cols=6, end_of_line=True)
    first, second, widths = both(ad, DecodeConfig(mode="sjd", window=4), list(range(8)), 3)
    same(first, second)
    assert widths[-1] < 8
    # image b of a batch that left is the batch of one with seed s + b: checked on the stand-in, whose
    # forward gives a row the same logits in any batch (the embedded model's float matmuls need not: on
    # an AVX-512 CPU a row of a batch of 8 and of 1 differ in the last bits, and a near tie can flip)
    alone = SpeculativeDecoder(ad, DecodeConfig(mode="sjd", window=4)).generate([3], seeds=6)
    assert torch.equal(alone.tokens[0], second.tokens[3])


def test_what_keeps_its_own_per_image_state_rides_along(model):
    ad = model.adapter
    # the similarity schedule decides its skips from the paths of the whole batch, on the host
    assert not SpeculativeDecoder(ad, DecodeConfig(mode="vvs", window=6, schedule="similarity")).leaves
    assert not SpeculativeDecoder(ad, DecodeConfig(mode="ar")).leaves  # every image ends at the same step


@pytest.mark.parametrize("source,config", [
    ("embedded-sibling", dict(mode="sjd", depth=3)), ("embedded-sibling", dict(mode="lantern", depth=2, lantern_k=4)),
    ("embedded-sibling", dict(mode="vvs", depth=3)), ("embedded", dict(mode="sjd", depth=3)),
    ("embedded", dict(mode="lantern", depth=3, tree="static", tree_tokens=12, lantern_k=4)),
    ("embedded", dict(mode="sjd", depth=3, tree="dynamic", tree_tokens=10))])
@pytest.mark.parametrize("device_step", [False, True])
def test_a_draft_model_or_head_leaves_with_the_images(model, ridden, source, config, device_step):
    """A sibling draft model, or a draft head, drops the finished images' rows with the target's: the
    same images."""
    from spec_ar.loaders.detect import load_drafter

    drafter = load_drafter(source, model)
    first = ridden(f"{source} {config}", model.adapter, DecodeConfig(**config), PROMPTS, 4, drafter)
    leaving = SpeculativeDecoder(model.adapter, DecodeConfig(**config), drafter=drafter, device_step=device_step)
    assert leaving.leaves
    rows = []
    keep = type(drafter).keep_samples
    type(drafter).keep_samples = lambda self, kept: rows.append(len(kept)) or keep(self, kept)
    try:
        second = leaving.generate(PROMPTS, seeds=4)
    finally:
        type(drafter).keep_samples = keep
    same(first, second)
    assert rows and rows == sorted(rows, reverse=True) and rows[-1] < 8  # (not vacuous: the drafter's rows went)


FOUR = ["a cat", "a dog on a hill at night", "a red house", "two birds"]  # prompts of several lengths: left pads


def family(name, folder):
    from spec_ar.loaders import chameleon, emu3, janus, llamagen
    from spec_ar.loaders.detect import load_model

    from .chameleon_files import write_chameleon
    from .checkpoints import random_gpt, tiny_gpt_spec, tiny_janus, write_gpt, write_janus, write_vq
    from .emu35_files import write_emu35
    from .emu3_files import write_emu3
    from .glm_image_files import write_glm_image

    return {
        "llamagen-c2i": lambda: llamagen.load(write_gpt(folder / "c2i.pt", random_gpt(tiny_gpt_spec("c2i"), seed=2)),
                                              write_vq(folder / "vq.pt"), resolution=128),
        "janus": lambda: janus.load(write_janus(folder / "Janus-Pro-tiny", *tiny_janus(seed=3))),
        "lumina": lambda: chameleon.load(write_chameleon(folder / "Lumina-mGPT-7B-768", "lumina"), width=96,
                                         height=64),
        "emu3": lambda: emu3.load(write_emu3(folder / "Emu3-Gen-tiny", seed=1), resolution=64),
        "emu3.5": lambda: load_model(write_emu35(folder / "Emu3.5-Image"), width=64, height=48),
        "glm-image": lambda: load_model(write_glm_image(folder / "GLM-Image"), width=96, height=64),
    }[name]()


@pytest.mark.parametrize("name", ["llamagen-c2i", "janus", "lumina", "emu3", "emu3.5", "glm-image"])
def test_every_familys_images_leave_as_they_rode_along(name, tmp_path):
    # (the tiny SimpleAR's drafts all but never land, so its images end together: its repetition log's
    # narrowing is checked below)
    loaded = family(name, tmp_path)
    settings = {"glm-image": {"temperature": 0.5}}.get(name, {})
    conditions = [3, 7, 1, 5] if loaded.condition == "class" else FOUR
    first, second, widths = both(loaded.adapter, DecodeConfig(mode="sjd", window=6, **settings), conditions, 21)
    same(first, second)
    assert widths[0] == 4 and widths[-1] < 4


def test_a_repetition_log_keeps_the_images_that_stay():
    from spec_ar.loaders.generation_config import RepetitionPenalty

    log = RepetitionPenalty(1.1)
    ids = torch.tensor([[5, 6, 7], [0, 8, 9], [0, 0, 4]])
    log.start(ids, ids > 0)
    log.cached(torch.tensor([[11, 12], [21, 22], [31, 32]]), [2, 1, 2])
    log.keep([0, 2])
    assert log.prompt.tolist() == [[5, 6, 7], [-1, -1, 4]]
    assert log.lengths == [2, 2] and log.device_lengths.tolist() == [2, 2]
    assert log.log[:, :2].tolist() == [[11, 12], [31, 32]]
