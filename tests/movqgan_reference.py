"""How ``tests/reference/movqgan.json`` was recorded: Lumina-mGPT 2.0's own MoVQGAN code
(Alpha-VLLM/Lumina-mGPT-2.0 @f44a4d7, ``lumina_mgpt/movqgan``: ``MOVQ.decode_code``, its ``MOVQDecoder`` and
``VectorQuantizer2``) on the tiny checkpoint of ``movqgan_files.py``.  Not a test; run by hand:

1. the checkpoint, in this pack's environment::

       .venv/bin/python -m tests.movqgan_reference write /tmp/movqgan-ref/movqgan_tiny.ckpt

2. a separate environment (the one of ``liquid_reference.py`` serves, plus einops)::

       /tmp/refenv/bin/pip install einops

3. the reference on it (``LUMINA2``: a checkout of Alpha-VLLM/Lumina-mGPT-2.0 at f44a4d7)::

       /tmp/refenv/bin/python tests/movqgan_reference.py record /tmp/movqgan-ref/movqgan_tiny.ckpt LUMINA2 \\
           tests/reference

The model is built as ``get_movqgan_model`` builds it (``MOVQ(**model_params)``, then
``load_state_dict(checkpoint, strict=False)`` of the flat checkpoint), with the tiny ``ddconfig`` of
``movqgan_files.py`` instead of the 270M one; the only module replaced is ``pytorch_lightning`` (the training
base class of ``MOVQ``: a plain ``nn.Module`` stands in, the decoding path never calls Lightning).  The
checkpoint's keys are checked to fill the decoder completely (strict=False would leave a missing one random).
Pixels are made as ``inference_solver.py``'s ``show_images`` makes them (read, not run: one line,
``((x + 1) * 127.5).round().clamp(0, 255)`` to uint8).
"""
from __future__ import annotations

import json
import pathlib
import sys

GRIDS = [(2, 3), (3, 2)]  # latent rows x columns decoded (one image each, as decode_code takes them)


def write(path: str) -> None:
    from .movqgan_files import write_movqgan

    write_movqgan(pathlib.Path(path))


def record(checkpoint: str, checkout: str, out: str) -> None:
    import types

    import torch
    from torch import nn

    sys.path.insert(0, str(pathlib.Path(checkout) / "lumina_mgpt"))
    lightning = types.ModuleType("pytorch_lightning")
    lightning.LightningModule = nn.Module
    sys.modules["pytorch_lightning"] = lightning
    from movqgan.models.vqgan import MOVQ

    ddconfig = {"double_z": False, "z_channels": 4, "resolution": 256, "in_channels": 3, "out_ch": 3, "ch": 32,
                "ch_mult": [1, 2, 2, 4], "num_res_blocks": 1, "attn_resolutions": [32], "dropout": 0.0}
    model = MOVQ(ddconfig=ddconfig, n_embed=64, embed_dim=4)
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    result = model.load_state_dict(state, strict=False)
    assert not [k for k in result.missing_keys if k.startswith(("decoder.", "quantize.", "post_quant_conv."))], \
        result.missing_keys
    assert not result.unexpected_keys, result.unexpected_keys
    model.eval()
    g = torch.Generator().manual_seed(1)
    records = []
    for h, w in GRIDS:
        codes = torch.randint(0, 64, (h * w,), generator=g)
        with torch.no_grad():
            x = model.decode_code(codes, h, w)
        pixels = ((x + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)[0].permute(1, 2, 0)
        records.append({"grid": [h, w], "codes": codes.tolist(), "uint8": pixels.tolist()})
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "movqgan.json").write_text(json.dumps({
        "source": "Alpha-VLLM/Lumina-mGPT-2.0 @f44a4d7 lumina_mgpt/movqgan (tests/movqgan_reference.py)",
        "ddconfig": ddconfig, "images": records}))
    print(f"recorded {len(records)} images: {[tuple(r['grid']) for r in records]}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["write"]:
        write(sys.argv[2])
    elif sys.argv[1:2] == ["record"]:
        record(*sys.argv[2:5])
    else:
        raise SystemExit(__doc__)
