"""Offload (issue 29): the transformer's blocks stay in system memory and are streamed in as they run.
The streaming itself is device-agnostic, so it runs here on the CPU (``check_offload`` lets the CPU
through, as a GPU would be): every family's forwards give the very logits of the resident model, each
block is fetched once per forward and is on the meta device between forwards, and decoding makes the
same tokens."""
from __future__ import annotations

import pytest
import torch

from spec_ar.bench import scale_checkpoints
from spec_ar.loaders import detect, offload
from spec_ar.loaders.sizing import choose
from spec_ar.loaders.storage import STORAGES
from spec_ar.sampling import DecodeConfig, SpeculativeDecoder
from spec_ar.sampling.config import ConfigError

from .checkpoints import write_sparse_safetensors


@pytest.fixture
def here_as_a_gpu(monkeypatch):
    monkeypatch.setattr(detect, "check_offload", lambda device: None)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("offload")
    out = {}
    for family in ("janus-pro-7b", "lumina-mgpt-7b-768", "emu3-gen"):
        out[family] = root / family
        scale_checkpoints.write(family, out[family], layout="converted", scale=0.03, log=lambda *a: None)
    return out


def streamed(model):
    found = [offload.streams_of(m) for m in model.modules.values() if offload.streams_of(m) is not None]
    assert len(found) == 1, "one block list is streamed"
    return found[0]


@pytest.mark.parametrize("family", ["janus-pro-7b", "lumina-mgpt-7b-768", "emu3-gen"])
def test_offloaded_forwards_give_the_resident_models_logits(family, folders, here_as_a_gpu):
    resident = detect.load_model(folders[family], dtype="float32")
    offloaded = detect.load_model(folders[family], dtype="float32", offload=True)
    stream = streamed(offloaded)
    assert all(p.device.type == "meta" for b in stream.blocks for p in b.parameters())
    assert stream.host_bytes() > 0
    condition = "a fox" if resident.condition == "text" else 0
    tokens = torch.randint(0, resident.adapter.vocab_size, (1, 5))
    logits = []
    for model in (resident, offloaded):
        first = model.adapter.prefill([condition], None, True)
        logits.append((first, model.adapter.forward(tokens)))
    assert stream.fetches == 2 * len(stream.blocks) + 1  # every block once per forward, and the next forward's first
    assert torch.equal(logits[0][0], logits[1][0]) and torch.equal(logits[0][1], logits[1][1])
    assert all(p.device.type == "meta" for b in stream.blocks for p in b.parameters())


def test_the_streamed_blocks_are_the_language_models_not_the_image_towers(folders, here_as_a_gpu):
    model = detect.load_model(folders["janus-pro-7b"], dtype="float32", offload=True)
    janus = model.modules["janus"].model
    assert streamed(model).blocks == list(janus.language_model.layers)
    assert all(p.device.type == "cpu" for p in janus.vision_model.parameters())  # resident (here: the CPU)


@pytest.mark.parametrize("dtype", ["float32", "int8"])
@pytest.mark.parametrize("mode", ["ar", "sjd"])
def test_decoding_with_offload_makes_the_same_tokens(dtype, mode, here_as_a_gpu):
    resident = detect.load_model("embedded", dtype=dtype)
    offloaded = detect.load_model("embedded", dtype=dtype, offload=True)
    assert offloaded.storage.name == dtype
    # a set window: on auto the width follows the forwards' measured cost, which differs run to run
    config = DecodeConfig(mode=mode, **({} if mode == "ar" else {"window": 16}))
    runs = [SpeculativeDecoder(m.adapter, config).generate(["a red circle", "a blue square"], seeds=[3, 4])
            for m in (resident, offloaded)]
    assert torch.equal(runs[0].tokens, runs[1].tokens)


def test_offload_is_refused_where_it_cannot_help():
    with pytest.raises(ConfigError, match="offload streams weights from system memory to a GPU; the device here is cpu"):
        detect.load_model("embedded", dtype="bfloat16", offload=True)


def test_nf4_cannot_be_offloaded(here_as_a_gpu):
    pytest.importorskip("bitsandbytes")
    with pytest.raises(ConfigError, match="dtype 'nf4' cannot be offloaded.*int8"):
        detect.load_model("embedded", dtype="nf4", offload=True)


def test_offloaded_weights_are_sized_against_system_memory(tmp_path, monkeypatch):
    from spec_ar.sampling import memory

    path = tmp_path / "model.safetensors"
    declared = write_sparse_safetensors(path, {"model.layers.0.mlp.up_proj.weight": (32768, 32768)})  # 2 GiB

    free = {"cuda": 1 * 2 ** 30, "cpu": 8 * 2 ** 30}
    monkeypatch.setattr(memory, "free_bytes", lambda device: free[torch.device(device).type])
    with pytest.raises(ConfigError, match=r"in bfloat16 needs about 2\.1 GB of weights, cuda has"):
        choose([path], "bfloat16", "cuda", "model")
    assert choose([path], "bfloat16", "cuda", "model", offload=True) is STORAGES["bfloat16"]
    free["cpu"] = int(declared * 0.7)
    with pytest.raises(ConfigError, match=r"system memory \(offload\) has .* free: int8"):
        choose([path], "bfloat16", "cuda", "model", offload=True)


def test_comfyui_manages_everything_but_the_streamed_blocks(folders, here_as_a_gpu):
    model = detect.load_model(folders["emu3-gen"], dtype="float32", offload=True)
    for module in model.modules.values():
        stream = offload.streams_of(module)
        if stream is None:
            continue
        parts = offload.resident_parts(module, stream.layers)
        blocks = {id(t) for b in stream.blocks for t in [*b.parameters(), *b.buffers()]}
        managed = {id(t) for p in parts for t in [*p.parameters(), *p.buffers()]}
        every = {id(t) for t in [*module.parameters(), *module.buffers()]}
        assert managed == every - blocks and not managed & blocks


def test_the_command_line_offers_offload_with_its_help():
    from spec_ar.cli import build_parser

    render = build_parser()._subparsers._group_actions[0].choices["render"]
    action = next(a for a in render._actions if "--offload" in a.option_strings)
    assert action.help.replace("%%", "%") == offload.HELP
