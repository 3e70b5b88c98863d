"""How ``tests/reference/cosmos.json`` and ``cosmos.safetensors`` were recorded: NVIDIA's own Cosmos
tokenizer code (NVIDIA/Cosmos-Tokenizer @3584ae7, ``cosmos_tokenizer``: ``CausalDiscreteVideoTokenizer``,
its ``decoder_jit()``, ``DecoderFactorized``, ``UnPatcher3D``, ``FSQuantizer``; SimpleAR vendors the same
copy) on the tiny ``decoder.jit`` of ``cosmos_files.py``.  Not a test; run by hand, three steps:

1. the archive, in this pack's environment::

       .venv/bin/python -m tests.cosmos_reference write /tmp/cosmos-ref/decoder.jit

2. a separate environment (the one of ``liquid_reference.py`` serves, with loguru and einops)::

       /tmp/refenv/bin/pip install loguru einops

3. the reference on it (``COSMOS``: a checkout of NVIDIA/Cosmos-Tokenizer at 3584ae7)::

       /tmp/refenv/bin/python tests/cosmos_reference.py record /tmp/cosmos-ref/decoder.jit COSMOS tests/reference

The decoder is loaded as SimpleAR's ``generate.py`` loads it: ``TokenizerConfigs["DV"]`` updated with
``spatial_compression=16, temporal_compression=8`` (and, here, ``cosmos_files.CONFIG``'s tiny sizes), then
``cosmos_tokenizer.utils.load_decoder_model``: ``TokenizerModels["DV"]`` built from the config,
``decoder_jit()``, ``load_state_dict(torch.jit.load(decoder.jit).state_dict(), strict=False)``.  Only
``mediapy`` is replaced (``utils.py`` imports it for video files; a stand-in module, never called).  Every
tensor of the decoder is checked to come from the file (strict=False would leave a missing one random).
Two changes from SimpleAR's run, both for the CPU: float32 weights, and the quantizer's ``dtype`` set to
float32 (it is bfloat16 by default and SimpleAR runs the whole decoder in bfloat16 on CUDA; FSQ code values,
k/4 and k/2, are exact in bfloat16 either way).

Codes are decoded as SimpleAR's are, shaped ``[B, 1, h, w]`` (one latent frame), giving ``[B, 3, 1, 16h,
16w]``; the time axis is squeezed.  Recorded per image: the float output, and the uint8 pixels as
torchvision's ``save_image(x, normalize=True, value_range=(-1, 1))`` makes them (read, not run: torchvision
is not in the environment; clamp to [-1, 1], ``(x + 1) / 2``, ``mul(255).add_(0.5).clamp_(0, 255)``, cast
to uint8).  Also recorded: ``FSQuantizer.indices_to_codes`` of a few indices (the first and last among them).
"""
from __future__ import annotations

import json
import pathlib
import sys

#: (batch, latent rows, latent columns) decoded; one image each, then a batch of two
GRIDS = [(1, 2, 3), (1, 3, 2), (2, 2, 2)]
FSQ_INDICES = 24  # indices whose FSQ code vectors are recorded


def write(path: str) -> None:
    from .cosmos_files import write_cosmos_decoder

    path = pathlib.Path(path)
    write_cosmos_decoder(path.parent, name=path.name)


def save_image_pixels(x):
    """torchvision ``save_image(x, normalize=True, value_range=(-1, 1))``'s pixels of one image ``[3, H, W]``
    (``make_grid`` returns a single image as is): ``[H, W, 3]`` uint8."""
    import torch

    img = x.clone().clamp_(min=-1, max=1).sub_(-1).div_(max(1 - (-1), 1e-5))
    return img.mul(255).add_(0.5).clamp_(0, 255).permute(1, 2, 0).to("cpu", torch.uint8)


def record(decoder_jit: str, checkout: str, out: str) -> None:
    import types

    import torch
    from safetensors.torch import save_file

    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from cosmos_files import CONFIG

    sys.path.insert(0, checkout)
    sys.modules["mediapy"] = types.ModuleType("mediapy")  # utils.py's video I/O; the decoder never calls it
    from cosmos_tokenizer.networks import TokenizerConfigs
    from cosmos_tokenizer.utils import load_decoder_model

    config = dict(TokenizerConfigs["DV"].value)
    config.update(dict(spatial_compression=16, temporal_compression=8))  # as SimpleAR's generate.py
    config.update(CONFIG)
    model = load_decoder_model(decoder_jit, tokenizer_config=config, device="cpu")
    stored = torch.jit.load(decoder_jit, map_location="cpu").state_dict()
    wanted = model.state_dict()
    missed = sorted(set(wanted) - set(stored))
    assert not missed, f"decoder tensors the file does not fill: {missed}"
    assert all(torch.equal(wanted[k].float(), stored[k].float()) for k in wanted)
    model.inv_quant.quantizer.dtype = torch.float32  # bfloat16 by default (SimpleAR: CUDA, all bfloat16)
    model.eval()

    quantizer = model.inv_quant.quantizer
    n_codes = int(quantizer.codebook_size)
    g = torch.Generator().manual_seed(1)
    records, tensors = [], {}
    for b, h, w in GRIDS:
        codes = torch.randint(0, n_codes, (b, 1, h, w), generator=g)
        if not records:
            codes.view(-1)[:2] = torch.tensor([0, n_codes - 1])  # the extreme codes
        with torch.no_grad():
            x = model(codes)  # [b, 3, 1, 16h, 16w]
        assert x.shape == (b, 3, 1, 16 * h, 16 * w), x.shape
        x = x.squeeze(2)
        key = f"{b}x{h}x{w}"
        tensors[f"{key}.float"] = x.float().contiguous()
        tensors[f"{key}.uint8"] = torch.stack([save_image_pixels(image) for image in x]).contiguous()
        records.append({"key": key, "batch": b, "grid": [h, w], "codes": codes.squeeze(1).tolist()})
    indices = torch.cat([torch.tensor([0, n_codes - 1]), torch.randint(0, n_codes, (FSQ_INDICES - 2,), generator=g)])
    fsq = quantizer.indices_to_codes(indices, project_out=False).float()
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "cosmos.safetensors"))
    (out / "cosmos.json").write_text(json.dumps({
        "source": "NVIDIA/Cosmos-Tokenizer @3584ae7 cosmos_tokenizer, load_decoder_model + decoder_jit "
                  "(tests/cosmos_reference.py)",
        "config": CONFIG, "n_embed": n_codes, "images": records,
        "fsq": {"indices": indices.tolist(), "codes": fsq.tolist()}}, indent=1))
    print(f"recorded {[r['key'] for r in records]}, pixel std "
          f"{[round(tensors[r['key'] + '.uint8'].float().std().item(), 1) for r in records]}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["write"]:
        write(sys.argv[2])
    elif sys.argv[1:2] == ["record"]:
        record(*sys.argv[2:5])
    else:
        raise SystemExit(__doc__)
