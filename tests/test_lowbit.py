"""The quantized layers' matmuls (``loaders/lowbit.py``): every kernel equals the widened weight's within the
storage's tolerance (on the CPU, where torch runs each of them), the choice keeps the fastest within it, and the
CPU's own path is unchanged."""
import pytest
import torch

from spec_ar.loaders import lowbit, storage


def layer_of(kind: str, out=96, inp=128, bias=False, seed=0):
    torch.manual_seed(seed)
    linear = torch.nn.Linear(inp, out, bias=bias)
    torch.nn.init.normal_(linear.weight, 0, 0.02)
    return linear, storage.quantized_layer(linear, storage.STORAGES[kind], torch.bfloat16, "cpu")


@pytest.mark.parametrize("kind", ["int8", "fp8"])
@pytest.mark.parametrize("shape", [(1, 128), (2, 128), (3, 16, 128)])
def test_every_kernel_equals_the_widened_weights_within_the_storages_tolerance(kind, shape):
    linear, layer = layer_of(kind)
    x = torch.randn(*shape).to(torch.bfloat16)
    reference = lowbit.KERNELS[kind]["widen"](x, layer)
    full = torch.nn.functional.linear(x.float(), linear.weight)  # what the weights' own rounding costs
    assert 0 < lowbit.error(reference, full) < lowbit.TOLERANCE[kind]
    for name, kernel in lowbit.KERNELS[kind].items():
        y = kernel(x, layer)
        assert y.shape == reference.shape and y.dtype == torch.bfloat16, name
        assert lowbit.error(y, reference) <= lowbit.TOLERANCE[kind], name


def test_the_w8a8_kernels_are_not_the_widened_ones_and_exact_kernels_are():
    """The activations' rounding shows (so the tolerance is what holds them), the weight-only kernel does not."""
    _, layer = layer_of("int8")
    x = torch.randn(4, 128).to(torch.bfloat16)
    reference = lowbit.widen_int8(x, layer)
    assert lowbit.error(lowbit.int_mm(x, layer), reference) > 1e-4
    assert lowbit.error(lowbit.int8pack(x, layer), reference) < 1e-2


def test_the_choice_is_the_fastest_kernel_within_tolerance_and_is_remembered(monkeypatch):
    _, layer = layer_of("int8", out=64, inp=256)
    seconds = {"int_mm": 1.0, "int8pack": 2.0, "widen": 3.0}  # a stand-in clock

    def clock(name, fn, device, repeats):
        fn()
        return seconds[name]

    def broken(name, fn, device, repeats):
        raise AssertionError("timed again")

    lowbit._CHOSEN.clear()
    try:
        assert lowbit.choose("int8", layer, timer=clock) == "int_mm"
        assert lowbit.choose("int8", layer, timer=broken) == "int_mm"  # remembered per device and shape
        monkeypatch.setitem(lowbit.TOLERANCE, "int8", 5e-3)  # int_mm's activation rounding is now too far
        lowbit._CHOSEN.clear()
        assert lowbit.choose("int8", layer, timer=clock) == "int8pack"
    finally:
        lowbit._CHOSEN.clear()


def test_a_kernel_the_device_lacks_is_measured_as_not_running(monkeypatch):
    _, layer = layer_of("fp8")

    def missing(x, layer):
        raise NotImplementedError("_scaled_mm: not on this device")

    monkeypatch.setitem(lowbit.KERNELS["fp8"], "scaled_mm", missing)
    rows = {m["kernel"]: m for m in lowbit.measure("fp8", layer, repeats=1)}
    assert not rows["scaled_mm"]["runs"] and "not on this device" in rows["scaled_mm"]["why"]
    assert rows["widen"]["runs"] and rows["widen"]["error"] == 0


def test_the_cpus_path_is_unchanged():
    """Loaded on the CPU, no kernel is chosen: int8 multiplies through torch's weight-only kernel, fp8 widened."""
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([torch.nn.Linear(64, 32)])
    storage.place(model, "int8", "cpu")
    layer = model.layers[0]
    assert type(layer) is storage.Int8Linear and layer.kernel is None
    x = torch.randn(2, 64).to(torch.bfloat16)
    assert torch.equal(layer(x), lowbit.int8pack(x, layer) + layer.bias)
