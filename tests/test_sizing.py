"""What fits a card, from a checkpoint's headers: each storage's weights whole or with the blocks offloaded,
the batch left room for, and the loader's memory check naming the offloaded options that fit."""
import pytest
import torch

from spec_ar.loaders import sizing
from spec_ar.loaders.sizing import choose
from spec_ar.loaders.storage import STORAGES
from spec_ar.sampling.config import ConfigError

from .checkpoints import write_sparse_safetensors

H, F, VOCAB, LAYERS = 1024, 4096, 32000, 4
SHAPES = {"model.embed_tokens.weight": (VOCAB, H), "lm_head.weight": (VOCAB, H), "model.norm.weight": (H,)}
for i in range(LAYERS):
    SHAPES |= {f"model.layers.{i}.self_attn.q_proj.weight": (H, H), f"model.layers.{i}.mlp.up_proj.weight": (F, H),
               f"model.layers.{i}.mlp.down_proj.weight": (H, F), f"model.layers.{i}.input_layernorm.weight": (H,)}
BLOCK_LINEAR = H * H + 2 * F * H  # weights of one block's linear layers
OUT_ROWS = H + F + H  # their output rows (a scale each in int8)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "model.safetensors"
    write_sparse_safetensors(path, SHAPES)  # headers and holes: nothing is read but the header
    return [path]


def test_weights_part_into_the_blocks_and_the_rest_per_storage(files):
    resident = 2 * (2 * VOCAB * H + H)  # embedding, head and final norm stay in bfloat16
    bf16 = sizing.split(files, "bfloat16")
    assert (bf16.resident, bf16.largest, bf16.blocks) == (resident, 2 * (BLOCK_LINEAR + H), 2 * LAYERS *
                                                           (BLOCK_LINEAR + H))
    int8 = sizing.split(files, "int8")  # a byte per weight and a bfloat16 scale per output row
    assert (int8.resident, int8.largest) == (resident, BLOCK_LINEAR + 2 * OUT_ROWS + 2 * H)
    nf4 = sizing.split(files, "nf4")
    assert nf4.resident == resident and nf4.largest == int(BLOCK_LINEAR * STORAGES["nf4"].bits / 8) + 2 * H
    assert bf16.count == LAYERS and bf16.on_card(offload=True) == resident + 2 * bf16.largest and bf16.in_system(offload=True) == bf16.blocks
    assert bf16.on_card(offload=False) == bf16.whole and bf16.in_system(offload=False) == 0


def test_plans_give_each_option_whole_and_offloaded_and_the_batch_beside_it(files):
    int8 = sizing.split(files, "int8")
    card = int((int8.on_card(True) + 3.5 * 10**6) / 0.9)  # int8 offloaded leaves room for 3.5 images of 1 MB
    plans = {(p.storage, p.offload): p for p in sizing.plans(files, card, per_image=10**6)}
    assert ("nf4", True) not in plans  # bitsandbytes keeps 4-bit weights on the GPU
    assert plans["int8", True].batch == 3 and plans["int8", True].system == int8.blocks
    assert not plans["bfloat16", False].fits and not plans["int8", False].fits
    assert plans["bfloat16", True].fits == (sizing.split(files, "bfloat16").on_card(True) + 10**6 <= 0.9 * card)
    tight = {(p.storage, p.offload): p for p in sizing.plans(files, card, system=int8.blocks // 2)}
    assert not tight["int8", True].fits  # the blocks must fit system memory too


def test_the_memory_check_names_the_offloaded_options_that_fit_the_card(files, monkeypatch):
    from spec_ar.sampling import memory

    int8 = sizing.split(files, "int8")
    free = {"cuda": int(int8.on_card(True) / 0.9) + 1, "cpu": 64 * 2**30}
    monkeypatch.setattr(memory, "free_bytes", lambda device: free[torch.device(device).type])
    with pytest.raises(ConfigError, match=r"in bfloat16 needs about .* of weights, cuda has .* free: no storage fits; "
                                          r"with offload \(the blocks in system memory, streamed\): int8 \(.* on the "
                                          r"card, .* of system memory\) or fp8") as err:
        choose(files, "bfloat16", "cuda", "model")
    assert "bfloat16 (" not in str(err.value).split("with offload")[1]  # bfloat16's two blocks do not fit
    free["cpu"] = int8.blocks // 4  # nowhere to put the blocks: the old advice
    with pytest.raises(ConfigError, match=r"free: no storage fits: free memory") as err:
        choose(files, "bfloat16", "cuda", "model")
    assert "offload" not in str(err.value)


def test_the_cards_bench_sizes_the_full_depth_from_a_fraction_of_the_layers(tmp_path):
    """`spec-ar bench cards` on a folder with 2 of a model's blocks, sized as 64: the blocks' weights and the KV
    cache grow 32-fold, the rest does not; every batch it gives fits the card beside the weights, one more does
    not; nf4 is never offloaded."""
    import json

    from spec_ar.bench.cards import main

    from .emu35_files import write_emu35

    folder = write_emu35(tmp_path / "Emu3.5-Image", tokenizer="inside")
    assert main(["--model", str(folder), "--layers", "64", "--cards", "0.01", "0.2", "--system", "1e-6",
                 "--width", "256", "--height", "256", "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "cards.json").read_text())
    assert report["layers_in_folder"] == 2 and report["layers"] == 64
    files = [f for f in folder.glob("*.safetensors")]
    bf16 = sizing.split(files, "bfloat16")
    whole = next(r for r in report["rows"] if r["storage"] == "bfloat16" and not r["offload"])
    assert abs(whole["weights_gb"] * 1e9 - (bf16.resident + 32 * bf16.blocks)) < 1e3
    need = report["per_image_gb"] * 1e9
    assert report["per_image"]["KV cache"] > 0 and need >= report["per_image"]["KV cache"]
    for r in report["rows"]:
        room = 0.9 * r["card_gb"] * 1e9 - r["weights_gb"] * 1e9
        if r["offload"]:  # the blocks do not fit the 1 kB of system memory
            assert r["batch"] == 0
        else:
            assert r["batch"] * need <= room < (r["batch"] + 1) * need or (room < 0 and r["batch"] == 0), r
    assert not [r for r in report["rows"] if r["storage"] == "nf4" and r["offload"]]
    assert {r["batch"] > 0 for r in report["rows"]} == {True, False}  # the sizes chosen so that some fit


@pytest.mark.parametrize("device,card,system,wait", [
    ("cpu", 100, None, "none"),  # 18 + 14 + 2 = 34 GB within 90 % of 100
    ("cpu", 24, None, "files"),  # one stage at a time: 18 + 2 within 90 % of 24
    ("cuda", 24, 64, "system"),  # the card holds one, system memory the other
    ("cuda", 24, 16, "files"),  # system memory cannot hold the 18 GB AR model while the DiT runs
    ("cuda", 40, 8, "none"),
])
def test_stages_wait_where_the_memory_there_is_holds_them(device, card, system, wait):
    gb = 10**9
    stages = {"the AR model": 18 * gb, "the DiT": 14 * gb}
    assert sizing.stage_wait(stages, device, 2 * gb, card=card * gb,
                             system=None if system is None else system * gb) == wait


def test_stages_whose_largest_does_not_fit_alone_get_one_error_naming_them():
    gb = 10**9
    with pytest.raises(ConfigError, match=r"the AR model 18\.0 GB, the DiT 14\.0 GB of weights .* the GPU has "
                                          r"16\.0 GB free"):
        sizing.stage_wait({"the AR model": 18 * gb, "the DiT": 14 * gb}, "cuda", card=16 * gb, system=64 * gb)
