"""The embedded model's procedural domain: scenes, captions, the prompt parser and the renderer."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from spec_ar.embedded.domain import (ATTRIBUTES, COLOURS, CONTRASTING_PAIRS, PATTERNS, POSITIONS, RGB, SHAPES,
                                     VOCABULARY, Scene, _render_layers, caption, make_dataset, parse, render,
                                     render_batch, sample_scene, words)


def scenes_covering_every_value() -> list[Scene]:
    """At least one scene per value of every attribute (and every shape at every position)."""
    pairs = itertools.cycle(CONTRASTING_PAIRS)
    patterns = itertools.cycle(PATTERNS)
    scenes = []
    for shape, position in itertools.product(SHAPES, POSITIONS):
        colour, background = next(pairs)
        scenes.append(Scene(colour, shape, position, next(patterns), background))
    return scenes


def test_constants_fix_the_class_orders():
    assert len(COLOURS) == 8 and len(SHAPES) == 6 and len(POSITIONS) == 9 and len(PATTERNS) == 6
    assert COLOURS[0] == "red" and POSITIONS[4] == "center" and PATTERNS[-1] == "gradient"
    assert list(ATTRIBUTES) == ["colour", "shape", "position", "pattern", "background"]


def test_background_colours_contrast_with_the_object():
    assert all(obj != bg for obj, bg in CONTRASTING_PAIRS)
    assert {("yellow", "orange"), ("red", "orange"), ("blue", "purple")}.isdisjoint(CONTRASTING_PAIRS)
    assert {obj for obj, _ in CONTRASTING_PAIRS} == set(COLOURS) == {bg for _, bg in CONTRASTING_PAIRS}
    with pytest.raises(ValueError):
        Scene("red", "circle", "top", "plain", "red")
    with pytest.raises(ValueError):
        Scene("red", "hexagon", "top", "plain", "blue")


def test_sample_scene_covers_all_values_uniformly():
    rng = np.random.default_rng(0)
    scenes = [sample_scene(rng) for _ in range(6000)]
    for name, values in ATTRIBUTES.items():
        counts = np.array([sum(getattr(s, name) == v for s in scenes) for v in values])
        assert counts.min() > 0.6 * len(scenes) / len(values), name
    assert all((s.colour, s.background) in CONTRASTING_PAIRS for s in scenes)


def test_canonical_caption():
    scene = Scene("red", "circle", "top left", "striped", "blue")
    assert caption(scene) == "a red circle in the top left on a striped blue background"
    assert caption(Scene("orange", "star", "bottom", "plain", "blue")) == \
        "an orange star at the bottom on a plain blue background"


def test_caption_parse_round_trip_for_every_value():
    for scene in scenes_covering_every_value():
        named, unknown = parse(caption(scene))
        assert named == scene.attributes() and unknown == []


@pytest.mark.parametrize("prompt,expected", [
    ("  A Red   circle in the TOP left.", {"colour": "red", "shape": "circle", "position": "top left"}),
    ("a green star at the bottom", {"colour": "green", "shape": "star", "position": "bottom"}),
    ("a white ring on a dotted black background", {"colour": "white", "shape": "ring", "pattern": "dotted",
                                                   "background": "black"}),
    ("a blue square on a yellow background", {"colour": "blue", "shape": "square", "background": "yellow"}),
    ("a black cross on the right", {"colour": "black", "shape": "cross", "position": "right"}),
    ("a triangle", {"shape": "triangle"}),
])
def test_parse_partial_and_messy_prompts(prompt, expected):
    assert parse(prompt) == (expected, [])


def test_parse_reports_unknown_words():
    assert parse("a red elephant") == ({"colour": "red"}, ["elephant"])
    named, unknown = parse("a purple circle in the middle of a big canvas")
    assert named == {"colour": "purple", "shape": "circle"} and unknown == ["middle", "big", "canvas"]


def test_dropped_phrases_give_partial_captions_that_still_parse():
    rng = np.random.default_rng(1)
    scene = Scene("yellow", "cross", "right", "checkered", "purple")
    seen = set()
    for _ in range(200):
        text = caption(scene, rng, drop=0.5)
        named, unknown = parse(text)
        assert unknown == []
        assert {"colour", "shape"} <= set(named) and all(named[k] == getattr(scene, k) for k in named)
        seen.add(frozenset(named))
    assert len(seen) == 4  # both, either or neither phrase kept
    with pytest.raises(ValueError):
        caption(scene, drop=0.5)


def test_vocabulary_covers_every_caption_word():
    rng = np.random.default_rng(2)
    for scene in scenes_covering_every_value():
        assert set(words(caption(scene, rng, drop=0.3))) <= set(VOCABULARY)
    assert list(VOCABULARY) == sorted(set(VOCABULARY))
    assert {"a", "an", "the", "in", "on", "at", "of", "background"} <= set(VOCABULARY)


def test_render_is_deterministic_per_seed_and_varies_across_seeds():
    scene = Scene("red", "star", "center", "striped", "blue")
    image = render(scene, 7)
    assert image.shape == (64, 64, 3) and image.dtype == np.uint8
    assert np.array_equal(image, render(scene, 7))
    assert not np.array_equal(image, render(scene, 8))
    assert render(scene, 7, size=32).shape == (32, 32, 3)


def test_batch_equals_single_renders():
    scenes = scenes_covering_every_value()[:20]
    seeds = list(range(100, 120))
    batch = render_batch(scenes, seeds)
    assert batch.shape == (20, 64, 64, 3) and batch.dtype == np.uint8
    for i in (0, 7, 19):
        assert np.array_equal(batch[i], render(scenes[i], seeds[i]))


def test_object_has_its_colour_and_sits_in_its_cell():
    scenes = scenes_covering_every_value()
    for size in (64, 48):
        image, coverage = _render_layers(scenes, range(len(scenes)), size, noise=False)
        rows, cols = np.mgrid[0:size, 0:size] + 0.5
        for scene, img, cov in zip(scenes, image, coverage):
            inside = cov > 0.99
            assert inside.sum() > 10, scene
            assert np.abs(img[inside].mean(0) - RGB[scene.colour]).max() < 0.07, scene
            mass = cov.sum()
            centre = (rows * cov).sum() / mass, (cols * cov).sum() / mass
            assert tuple(int(c // (size / 3)) for c in centre) == scene.cell, scene


def test_object_colour_stays_visible_after_noise():
    scenes = scenes_covering_every_value()
    image, coverage = _render_layers(scenes, range(len(scenes)), 64)
    for scene, img, cov in zip(scenes, image, coverage):
        inside, outside = img[cov > 0.99].mean(0), img[cov < 0.01].mean(0)
        named = np.array(RGB[scene.colour])
        assert np.linalg.norm(inside - named) < np.linalg.norm(outside - named), scene


def test_images_are_not_flat():
    """Patterns and noise keep every image, and its background alone, far from flat (the AR model's uncertainty)."""
    rng = np.random.default_rng(3)
    scenes = [sample_scene(rng) for _ in range(150)]
    image, coverage = _render_layers(scenes, range(len(scenes)), 64)
    for scene, img, cov in zip(scenes, image * 255, coverage):
        assert img.std() > 8, scene
        assert img[cov == 0].std() > 4, scene


def test_make_dataset_is_reproducible():
    a_images, a_scenes, a_captions = make_dataset(16, seed=4, drop=0.3)
    b_images, b_scenes, b_captions = make_dataset(16, seed=4, drop=0.3)
    assert np.array_equal(a_images, b_images) and a_scenes == b_scenes and a_captions == b_captions
    c_images, _, _ = make_dataset(16, seed=5)
    assert not np.array_equal(a_images, c_images)
    assert a_images.shape == (16, 64, 64, 3) and len(a_scenes) == len(a_captions) == 16
