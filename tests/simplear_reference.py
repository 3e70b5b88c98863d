"""How ``tests/reference/simplear.json`` and ``simplear_logits.safetensors`` were recorded: SimpleAR's own code
(wdrink/SimpleAR @d56b6e5: ``generate.py``'s ``generate``, ``simpar/model/builder.py``'s
``load_pretrained_model``, ``SimpARForCausalLM.generate_visual`` and its ``CFGLogits``, the repository's copy of
Qwen2, the slow tokenizer it asks for with ``use_fast=False``, and its vendored Cosmos tokenizer's
``CausalVideoTokenizer``) on transformers 4.47.1, run on the tiny folder of ``simplear_files.py``.  Not a test;
run by hand from the repository root, three steps:

1. the folder (its Cosmos decoder lands beside it), in this pack's environment::

       .venv/bin/python -m tests.simplear_reference write /tmp/simplear-ref/SimpleAR-tiny

2. a separate environment (SimpleAR pins a development commit of transformers, 7bbc624, of the 4.47 line;
   4.47.1 runs the repository's Qwen2 copy as it is)::

       python3 -m venv /tmp/refenv
       /tmp/refenv/bin/pip install torch==2.13.0 transformers==4.47.1 accelerate==1.1.1 safetensors numpy pillow \\
           sentencepiece protobuf einops loguru

3. the reference on it (``SIMPLEAR``: a checkout of wdrink/SimpleAR at d56b6e5)::

       /tmp/refenv/bin/python -m tests.simplear_reference record /tmp/simplear-ref/SimpleAR-tiny SIMPLEAR \\
           tests/reference

``reference/simplear_penalty.json`` is recorded the same way from a second folder, the same weights with the
generation_config.json Qwen2.5-0.5B-Instruct ships (``simplear_files.instruct_generation``: repetition penalty 1.1,
its sampling settings, two end ids), which ``from_pretrained`` loads and ``generate_visual``'s call to
transformers' ``generate`` applies where ``generate.py`` passes nothing in its place; a 256 px image (256 tokens:
the penalty first changes a greedy pick at token 74)::

       .venv/bin/python -m tests.simplear_reference write-penalty /tmp/simplear-ref/SimpleAR-penalty
       /tmp/refenv/bin/python -m tests.simplear_reference record-penalty /tmp/simplear-ref/SimpleAR-penalty \\
           SIMPLEAR tests/reference

(The environment of step 2 can also be the pack's ``.venv`` with transformers 4.47.1, tokenizers 0.21,
huggingface_hub 0.x, accelerate 1.1.1, loguru and einops installed with ``pip install --target DIR --no-deps``
and ``DIR`` put first on ``PYTHONPATH``: the torch is the same 2.13.)

``generate.py`` and the modules it calls run as written except for these textual replacements (printed as they
are made): greedy picks (``do_sample=True`` -> ``False``: a recorded stream must not depend on a random
generator), float32 weights on the CPU (``load_pretrained_model`` reads bfloat16, ``CausalVideoTokenizer``
decodes in bfloat16 on CUDA), text ids masked after the guidance (the pack's departure: a random tiny model
would often pick a text id, which the reference clamps to a code), and two lines keeping the prompt rows, the
stream and the decoded batch.  ``torchvision`` is replaced by its ``save_image`` as ``generate`` calls it
(``normalize=True, value_range=(-1, 1)``: clamp, map to [0, 1], ``mul(255).add_(0.5).clamp_(0, 255)``, PNG),
``mediapy`` by an empty module (the Cosmos code's video I/O, not called), and vLLM is absent, as the script allows.  The Cosmos decoder is built as ``generate.py`` builds it
(``TokenizerConfigs["DV"]`` with spatial 16 and temporal 8 compression), its sizes those of the tiny
``decoder.jit`` (``cosmos_files.CONFIG``).
"""
from __future__ import annotations

import json
import pathlib
import sys
import types

from .liquid_reference import _module, _patched

PROMPTS = ["a red fox in snow", "blue sky", "a cat on mat , at dawn"]
GREEDY_PROMPT = "a red fox in snow"
IMAGE_SIZE = 128  # 8 x 8 = 64 stream tokens
CFG = 6.0  # the script's default
LOGIT_POSITIONS = 12  # stream positions whose teacher-forced logits are kept
PENALTY_IMAGE_SIZE = 256  # 16 x 16 = 256 stream tokens: long enough for the penalty to change a greedy pick


def write(folder: str) -> None:
    from .simplear_files import write_simplear

    write_simplear(pathlib.Path(folder))


def write_penalty(folder: str) -> None:
    """The folder of :func:`write` with Qwen2.5-Instruct's generation_config.json (repetition penalty 1.1)."""
    from .simplear_files import instruct_generation, write_simplear

    write_simplear(pathlib.Path(folder), generation=instruct_generation())


def _save_image_module():
    """``torchvision.utils.save_image`` for one [B, 3, H, W] batch, as ``generate`` calls it."""
    import numpy as np
    import torch
    from PIL import Image

    def save_image(tensor, fp, normalize=False, value_range=None):
        assert normalize and value_range == (-1, 1) and tensor.shape[0] == 1, (normalize, value_range, tensor.shape)
        low, high = value_range
        x = tensor.clone().clamp_(min=low, max=high).sub_(low).div_(max(high - low, 1e-5))
        grid = x[0].mul(255).add_(0.5).clamp_(0, 255).permute(1, 2, 0).to("cpu", torch.uint8).numpy()
        Image.fromarray(np.ascontiguousarray(grid)).save(fp)

    vision = types.ModuleType("torchvision")
    vision.utils = types.ModuleType("torchvision.utils")
    vision.utils.save_image = save_image
    return {"torchvision": vision, "torchvision.utils": vision.utils}


def _reference(folder: pathlib.Path, root: pathlib.Path):
    """``(tokenizer, model, generate.py as a module, kept, Cosmos decoder, work folder)``: the authors' code
    loaded on ``folder`` with the textual replacements of the module docstring; ``kept`` fills as
    ``generate`` runs."""
    import tempfile

    import torch
    import transformers

    from .cosmos_files import CONFIG as TINY

    assert transformers.__version__ == "4.47.1", transformers.__version__
    sys.path.insert(0, str(root))
    sys.modules.update(_save_image_module())
    sys.modules["mediapy"] = types.ModuleType("mediapy")  # video I/O the Cosmos code imports; never called
    import simpar.model.builder  # noqa: F401  (the package, as generate.py imports it)
    from simpar.model.tokenizer.cosmos_tokenizer.networks import TokenizerConfigs

    work = pathlib.Path(tempfile.mkdtemp())
    kept: dict = {}
    language = root / "simpar" / "model" / "language_model"
    masked = _module(work, "simpar.model.language_model.simpar_qwen2_masked", _patched(
        language / "simpar_qwen2.py",
        [("        out = self.cfg * (scores - unconditional_logits) + unconditional_logits\n",
          "        out = self.cfg * (scores - unconditional_logits) + unconditional_logits\n"
          "        out[:, :TEXT_IDS] = -float('inf')\n")]), TEXT_IDS=None)
    load = _module(work, "simplear_builder", _patched(root / "simpar" / "model" / "builder.py", [
        ('kwargs["torch_dtype"] = torch.bfloat16', 'kwargs["torch_dtype"] = torch.float32'),
        ("from simpar.model.language_model.simpar_qwen2 import SimpARForCausalLM\n", "")]))
    load.SimpARForCausalLM = masked.SimpARForCausalLM  # after the module's `from simpar.model import *`
    load = load.load_pretrained_model
    script = _module(work, "simplear_generate", _patched(root / "generate.py", [
        ("                    do_sample=True,\n", "                    do_sample=False,\n"),
        ("        samples = samples.squeeze(2)\n",
         "        samples = samples.squeeze(2)\n        KEPT.update(samples=samples.clone(), stream=output_ids[0, "
         "input_ids.shape[1]:].tolist(), prompt=input_ids[0].tolist(), uncond=uncond_input_ids[0].tolist())\n")]),
        KEPT=kept)

    tokenizer, model, _, _ = load(str(folder), attn_implementation="sdpa", device_map="cpu")
    masked.TEXT_IDS = len(tokenizer)
    config = TokenizerConfigs["DV"].value
    config.update(dict(spatial_compression=16, temporal_compression=8), **TINY)
    config["dtype"] = torch.float32  # the FSQ codes' dtype (bfloat16 by default, exact either way)
    vq = script.CosmosTokenizer(checkpoint_dec=str(folder.parent / "Cosmos-1.0-Tokenizer-DV8x16x16" / "decoder.jit"),
                                tokenizer_config=config, device="cpu", dtype="float32")
    vq.eval()
    return tokenizer, model, script, kept, vq, work, masked


def _args(image_size: int):
    """``generate.py``'s command-line defaults, on the CPU, at ``image_size``."""
    return types.SimpleNamespace(image_size=image_size, device="cpu", cfg_scale=CFG, temperature=1.0, top_p=1.0,
                                 top_k=64000, sjd_sampling=False, vllm_serving=False)


def record(folder: str, checkout: str, out: str) -> None:
    import numpy as np
    import torch
    from PIL import Image
    from safetensors.torch import save_file

    folder, root, out = (pathlib.Path(p).resolve() for p in (folder, checkout, out))
    tokenizer, model, script, kept, vq, work, masked = _reference(folder, root)
    args = _args(IMAGE_SIZE)
    rows = {}
    for prompt in PROMPTS:  # the rows as generate() tokenizes them
        rows[prompt] = tokenizer("<|t2i|>" + "A highly realistic image of " + prompt + "<|soi|>").input_ids
    script.generate(model, vq, tokenizer, [GREEDY_PROMPT], str(work), args)
    assert kept["prompt"] == rows[GREEDY_PROMPT]
    stream = kept["stream"]
    assert type(model) is masked.SimpARForCausalLM and min(stream) >= len(tokenizer), (type(model), min(stream))
    picture = np.asarray(Image.open(work / f"{GREEDY_PROMPT[:50]}.png").convert("RGB"))
    # teacher-forced logits: one full forward over each branch's row and the greedy stream (no cache)
    with torch.no_grad():
        lc = model(torch.tensor([kept["prompt"] + stream])).logits[0, len(kept["prompt"]) - 1:][:LOGIT_POSITIONS]
        lu = model(torch.tensor([kept["uncond"] + stream])).logits[0, len(kept["uncond"]) - 1:][:LOGIT_POSITIONS]
    text = len(tokenizer)
    ids = torch.tensor([*range(0, text, 4), *range(text, model.config.vocab_size, 64)])
    out.mkdir(parents=True, exist_ok=True)
    save_file({"conditional": lc[:, ids].float().contiguous(), "unconditional": lu[:, ids].float().contiguous(),
               "ids": ids}, str(out / "simplear_logits.safetensors"), metadata={"transformers": "4.47.1"})
    record = {"source": "wdrink/SimpleAR @d56b6e5 on transformers 4.47.1 (tests/simplear_reference.py)",
              "cfg": CFG, "image_size": IMAGE_SIZE, "text_ids": text, "greedy_prompt": GREEDY_PROMPT, "rows": rows,
              "unconditional": kept["uncond"], "stream": stream, "decoded_uint8": picture.tolist()}
    (out / "simplear.json").write_text(json.dumps(record))
    print(f"recorded {len(stream)} stream tokens, logits {tuple(lc.shape)}, picture {picture.shape}, in {out}")


def record_penalty(folder: str, checkout: str, out: str) -> None:
    """The greedy stream of :data:`GREEDY_PROMPT` at :data:`PENALTY_IMAGE_SIZE` from the folder of
    :func:`write_penalty`, ``generate.py`` otherwise as :func:`record` runs it."""
    folder, root, out = (pathlib.Path(p).resolve() for p in (folder, checkout, out))
    tokenizer, model, script, kept, vq, work, masked = _reference(folder, root)
    settings = json.loads((folder / "generation_config.json").read_text())
    assert model.generation_config.repetition_penalty == settings["repetition_penalty"] != 1.0
    script.generate(model, vq, tokenizer, [GREEDY_PROMPT], str(work), _args(PENALTY_IMAGE_SIZE))
    stream = kept["stream"]
    assert len(stream) == (PENALTY_IMAGE_SIZE // 16) ** 2 and min(stream) >= len(tokenizer), min(stream)
    record = {"source": "wdrink/SimpleAR @d56b6e5 on transformers 4.47.1 (tests/simplear_reference.py, "
                        "record-penalty)",
              "generation_config": settings, "cfg": CFG, "image_size": PENALTY_IMAGE_SIZE,
              "greedy_prompt": GREEDY_PROMPT, "prompt": kept["prompt"], "unconditional": kept["uncond"],
              "stream": stream}
    out.mkdir(parents=True, exist_ok=True)
    (out / "simplear_penalty.json").write_text(json.dumps(record))
    print(f"recorded {len(stream)} stream tokens with repetition penalty {settings['repetition_penalty']} in {out}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["write"]:
        write(sys.argv[2])
    elif sys.argv[1:2] == ["write-penalty"]:
        write_penalty(sys.argv[2])
    elif sys.argv[1:2] == ["record"]:
        record(*sys.argv[2:5])
    elif sys.argv[1:2] == ["record-penalty"]:
        record_penalty(*sys.argv[2:5])
    else:
        raise SystemExit(__doc__)
