"""The embedded model's judge: Frechet distance, adherence scoring, persistence and a tiny training run."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from spec_ar.embedded.domain import ATTRIBUTES, make_dataset
from spec_ar.embedded.judge import (HEADS, INPUT_SIZE, SceneClassifier, adherence, evaluate, frechet_distance,
                                    image_features, load_judge, predict, save_judge, to_input, train_judge)


def brute_force_frechet(a: np.ndarray, b: np.ndarray) -> float:
    """The textbook formula, with Tr((Sa Sb)^1/2) from the (real, non-negative) eigenvalues of Sa Sb."""
    cov_a, cov_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    eigenvalues = np.linalg.eigvals(cov_a @ cov_b).real
    return float(np.sum((a.mean(0) - b.mean(0)) ** 2) + np.trace(cov_a) + np.trace(cov_b)
                 - 2 * np.sqrt(np.clip(eigenvalues, 0, None)).sum())


def test_frechet_distance_of_a_set_with_itself_is_zero():
    feats = np.random.default_rng(0).normal(size=(500, 16))
    assert frechet_distance(feats, feats) == pytest.approx(0, abs=1e-8)
    assert frechet_distance(torch.from_numpy(feats).float(), feats) == pytest.approx(0, abs=1e-4)


def test_frechet_distance_grows_with_a_mean_shift():
    feats = np.random.default_rng(1).normal(size=(400, 8))
    distances = [frechet_distance(feats, feats + shift) for shift in (0.0, 0.5, 1.0, 2.0)]
    assert distances == sorted(distances)
    assert distances[-1] == pytest.approx(8 * 4.0, rel=1e-9)  # only |mu_a - mu_b|^2 changes


def test_frechet_distance_matches_the_brute_force_formula():
    rng = np.random.default_rng(2)
    mix_a, mix_b = rng.normal(size=(5, 5)), rng.normal(size=(5, 5))
    a = rng.normal(size=(300, 5)) @ mix_a + 1.0
    b = rng.normal(size=(200, 5)) @ mix_b - 0.5
    assert frechet_distance(a, b) == pytest.approx(brute_force_frechet(a, b), rel=1e-8)


def test_frechet_distance_closed_form_for_diagonal_covariances():
    """Points at mu +- s_i e_i have a diagonal covariance, where the distance is |dmu|^2 + sum (sqrt a_i - sqrt b_i)^2."""
    def cross_points(mu, spread):
        offsets = np.concatenate([np.diag(spread), -np.diag(spread)])
        return mu + offsets, spread ** 2 * 2 / (len(offsets) - 1)

    a, var_a = cross_points(np.array([0.0, 1.0]), np.array([1.0, 3.0]))
    b, var_b = cross_points(np.array([2.0, -1.0]), np.array([4.0, 0.5]))
    expected = 4 + 4 + np.sum((np.sqrt(var_a) - np.sqrt(var_b)) ** 2)
    assert frechet_distance(a, b) == pytest.approx(expected, rel=1e-10)


def test_frechet_distance_survives_rank_deficient_covariances():
    rng = np.random.default_rng(3)
    a = rng.normal(size=(10, 32))  # fewer samples than features: singular covariances
    b = rng.normal(size=(12, 32))
    distance = frechet_distance(a, b)
    assert math.isfinite(distance) and distance >= 0
    assert frechet_distance(a, a) == pytest.approx(0, abs=1e-6)


class StubClassifier(SceneClassifier):
    """Predicts fixed classes, whatever the image."""

    def __init__(self, predictions: list[dict[str, str]]):
        super().__init__(width=4, features=8)
        self.logits = {name: torch.full((len(predictions), classes), -5.0) for name, classes in HEADS.items()}
        for i, predicted in enumerate(predictions):
            for name, value in predicted.items():
                self.logits[name][i, ATTRIBUTES[name].index(value)] = 5.0

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: logits[:len(x)] for name, logits in self.logits.items()}


def test_adherence_counts_only_what_the_prompt_names():
    seen = [
        {"colour": "red", "shape": "circle", "position": "top left", "pattern": "plain", "background": "blue"},
        {"colour": "green", "shape": "star", "position": "center", "pattern": "dotted", "background": "white"},
        {"colour": "blue", "shape": "ring", "position": "bottom", "pattern": "grainy", "background": "black"},
        {"colour": "white", "shape": "cross", "position": "right", "pattern": "striped", "background": "red"},
    ]
    prompts = [
        "a red circle in the top left on a plain blue background",  # all right
        "a green square in the center",                             # wrong shape
        "a blue ring on a dotted black background",                 # right, but wrong pattern (not core)
        "a white cross on the left",                                # wrong position
    ]
    images = np.zeros((4, 64, 64, 3), np.uint8)
    result = adherence(StubClassifier(seen), images, prompts)
    assert result["n"] == 4
    assert result["colour"] == 1.0
    assert result["shape"] == 0.75
    assert result["position"] == pytest.approx(2 / 3)
    assert result["pattern"] == 0.5 and result["background"] == 1.0
    assert result["all"] == 0.5


def test_adherence_without_a_named_attribute_gives_nan():
    seen = [{"colour": "red", "shape": "circle", "position": "top", "pattern": "plain", "background": "blue"}]
    result = adherence(StubClassifier(seen), torch.zeros(1, 3, 128, 128), ["a red circle"])
    assert result["colour"] == 1.0 and result["shape"] == 1.0 and result["all"] == 1.0
    assert math.isnan(result["position"]) and math.isnan(result["pattern"])


def test_inputs_are_converted_and_resized():
    uint8 = np.full((2, 128, 96, 3), 255, np.uint8)
    x = to_input(uint8)
    assert x.shape == (2, 3, INPUT_SIZE, INPUT_SIZE) and x.dtype == torch.float32
    assert torch.allclose(x, torch.ones_like(x))
    small = torch.rand(3, 3, 32, 32)
    assert to_input(small).shape == (3, 3, INPUT_SIZE, INPUT_SIZE)
    with pytest.raises(ValueError):
        to_input(torch.rand(2, 64, 64))


def test_features_and_heads_have_the_promised_shapes():
    model = SceneClassifier().eval()
    x = torch.rand(5, 3, 64, 64)
    assert model.features(x).shape == (5, 128)
    assert {name: out.shape for name, out in model(x).items()} == {name: (5, n) for name, n in HEADS.items()}
    assert image_features(model, np.zeros((3, 64, 64, 3), np.uint8)).shape == (3, 128)


def test_save_and_load_round_trip(tmp_path):
    torch.manual_seed(0)
    model = SceneClassifier(width=8, features=32, where_channels=4)
    with torch.no_grad():  # non-trivial batch-norm statistics
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)
    model.eval()
    path = tmp_path / "judge.safetensors"
    save_judge(model, str(path))
    loaded = load_judge(str(path))
    assert loaded.hyperparameters() == {"width": 8, "features": 32, "where_channels": 4}
    assert all(p.dtype == torch.float32 for p in loaded.parameters()) and not loaded.training
    images, _, _ = make_dataset(32, seed=9)
    assert np.allclose(image_features(model, images), image_features(loaded, images), atol=2e-2)
    model.half().float().to(memory_format=torch.channels_last)  # storage is float16: same rounding, same outputs
    assert np.array_equal(image_features(model, images), image_features(loaded, images))
    before, after = predict(model, images), predict(loaded, images)
    assert all(np.array_equal(before[name], after[name]) for name in HEADS)


def test_load_rejects_other_files(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "other.safetensors"
    save_file({"w": torch.zeros(2)}, str(path))
    with pytest.raises(ValueError):
        load_judge(str(path))


def test_tiny_training_run_end_to_end(tmp_path):
    lines: list[str] = []
    model = train_judge(n_images=256, seed=0, epochs=1, batch_size=64, width=8, features=32, held_out=0,
                        log=lines.append)
    assert any("epoch 1/1" in line for line in lines)
    accuracy = evaluate(model, n_images=64, seed=5)
    assert set(accuracy) == set(HEADS) and all(0 <= v <= 1 for v in accuracy.values())
    images, _, captions = make_dataset(8, seed=6)
    result = adherence(model, images, captions)
    assert result["n"] == 8 and 0 <= result["all"] <= 1
    path = tmp_path / "judge.safetensors"
    save_judge(model, str(path))
    assert path.stat().st_size < 2_000_000
