"""How ``tests/reference/ibq.json`` was recorded: the authors' own Emu3.5 code (baaivision/Emu3.5 @8fcf1da,
``src/vision_tokenizer``: ``build_vision_tokenizer``, ``IBQ``, its taming ``Decoder`` and
``IndexPropagationQuantize``; ``src/utils/generation_utils.py``: ``multimodal_decode`` and ``decode_image``;
``src/utils/input_utils.py``: ``format_image_string``) on the tiny tokenizer folder of ``ibq_files.py``.  Not
a test; run by hand, three steps:

1. the folder (``config.yaml`` + ``model.ckpt``), in this pack's environment::

       .venv/bin/python -m tests.ibq_reference write /tmp/ibq-ref/Emu3.5-VisionTokenizer

2. a separate environment, with what the authors' modules import (their pins where they have one:
   ``omegaconf==2.3.0``, ``transformers==4.48.2``; ``torch>=2.6``)::

       python3 -m venv /tmp/ibq-refenv
       /tmp/ibq-refenv/bin/pip install torch==2.13.0 omegaconf==2.3.0 transformers==4.48.2 einops numpy pillow

3. the reference on it (``EMU35``: a checkout of baaivision/Emu3.5 at 8fcf1da, whose ``src`` is imported as
   the authors' ``inference.py`` imports it, from the repository root)::

       /tmp/ibq-refenv/bin/python tests/ibq_reference.py record /tmp/ibq-ref/Emu3.5-VisionTokenizer EMU35 \\
           tests/reference

Nothing is replaced or stubbed.  The tokenizer is built as ``inference.py`` builds it
(``build_emu3p5`` -> ``build_vision_tokenizer("ibq", vq_path, device=...)``: ``OmegaConf.load(config.yaml)``,
``IBQ(**cfg)``, ``torch.load(model.ckpt)`` (weights-only by default on torch >= 2.6), the ``state_dict``
entry, a strict ``load_state_dict``, ``eval()``), here on the CPU in float32 (the checkpoint's dtype, which
the authors' loader keeps).  Each grid of codes is written as the model writes an image
(``format_image_string``: ``<|visual token NNNNNN|>`` rows joined by the end-of-line token, between the
image start and end tokens) and decoded by ``multimodal_decode``, the authors' post-generation path, whose
``decode_image`` calls ``decode_code(codes[None], shape=(1, h, w, 256))`` and makes the PIL image with
``((x + 1) * 127.5).clamp(0, 255)`` cast to uint8 (truncation, not rounding).  The tokenizer it takes needs
only the special tokens' strings, set as ``build_emu3p5`` sets them.  Recorded per image: the codes, that
PIL image's pixels (uint8, ``[H, W, 3]``) and the float output of the same ``decode_code`` call (``[3, H,
W]``, rounded to 6 decimals).
"""
from __future__ import annotations

import json
import pathlib
import sys

GRIDS = [(3, 3), (2, 5)]  # latent rows x columns decoded (one image each, as the authors decode them)
#: the special tokens ``build_emu3p5`` (src/utils/model_utils.py) sets on the text tokenizer
TOKENS = {"eol_token": "<|extra_200|>", "img_token": "<|image token|>", "boi_token": "<|image start|>",
          "eoi_token": "<|image end|>", "bog_token": "<|extra_60|>", "eog_token": "<|extra_61|>",
          "boc_token": "<|extra_50|>", "eoc_token": "<|extra_51|>"}


def write(folder: str) -> None:
    from .ibq_files import write_ibq

    write_ibq(pathlib.Path(folder))


def record(folder: str, checkout: str, out: str) -> None:
    import types

    import numpy as np
    import torch

    sys.path.insert(0, str(pathlib.Path(checkout).resolve()))
    from src.utils.generation_utils import multimodal_decode
    from src.utils.input_utils import format_image_string
    from src.vision_tokenizer import build_vision_tokenizer

    tokenizer = types.SimpleNamespace(**TOKENS)
    model = build_vision_tokenizer("ibq", folder, device="cpu")
    n_embed = model.quantize.n_e
    g = torch.Generator().manual_seed(1)
    records = []
    for h, w in GRIDS:
        codes = torch.randint(0, n_embed, (h, w), generator=g)
        codes.view(-1)[0], codes.view(-1)[-1] = 0, n_embed - 1  # both ends of the codebook
        text = format_image_string(tokenizer, codes)
        out_items = multimodal_decode(text, tokenizer, model)
        assert [kind for kind, _ in out_items] == ["image"], out_items
        pixels = np.asarray(out_items[0][1])
        with torch.no_grad():  # the call decode_image makes, for its float output
            x = model.decode_code(codes[None], shape=(1, h, w, 256)).float()[0]
        assert pixels.shape == (16 * h, 16 * w, 3) and pixels.dtype == np.uint8, (pixels.shape, pixels.dtype)
        assert (pixels == ((x.permute(1, 2, 0) + 1.0) * 127.5).clamp(0, 255).numpy().astype(np.uint8)).all()
        records.append({"grid": [h, w], "codes": codes.tolist(), "text": text, "uint8": pixels.tolist(),
                        "float": np.round(x.numpy().astype(np.float64), 6).tolist()})
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = pathlib.Path(folder) / "config.yaml"
    (out / "ibq.json").write_text(json.dumps({
        "source": "baaivision/Emu3.5 @8fcf1da src/vision_tokenizer + src/utils (tests/ibq_reference.py)",
        "environment": f"torch {torch.__version__}, CPU, float32",
        "config": config.read_text(encoding="utf-8"), "images": records}))
    print(f"recorded {len(records)} images: {[tuple(r['grid']) for r in records]}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["write"]:
        write(sys.argv[2])
    elif sys.argv[1:2] == ["record"]:
        record(*sys.argv[2:5])
    else:
        raise SystemExit(__doc__)
