"""How ``tests/reference/lumina2.json`` and ``lumina2_logits.safetensors`` were recorded: Lumina-mGPT 2.0's own
inference code (Alpha-VLLM/Lumina-mGPT-2.0 @f44a4d7: ``FlexARInferenceSolver`` of ``lumina_mgpt/inference_solver.py``
with its logits processors, ``FlexARItemProcessor`` and the conversation template, the fork's
``model/chameleon``, the ``movqgan`` decoder) on transformers 4.46.2, the release ``requirements.txt`` pins, run
on the tiny folder of ``lumina2_files.py``.  Not a test; run by hand from the repository root, three steps:

1. the folder, in this pack's environment::

       .venv/bin/python -m tests.lumina2_reference write /tmp/lumina2-ref/Lumina-mGPT-2.0

2. a separate environment with the reference's transformers::

       python3 -m venv /tmp/refenv46
       /tmp/refenv46/bin/pip install torch==2.13.0 transformers==4.46.2 safetensors numpy pillow sentencepiece \\
           huggingface_hub einops pyyaml

3. the reference on it (``LUMINA2``: a checkout of Alpha-VLLM/Lumina-mGPT-2.0 at f44a4d7)::

       /tmp/refenv46/bin/python -m tests.lumina2_reference record /tmp/lumina2-ref/Lumina-mGPT-2.0 LUMINA2 \\
           tests/reference

``inference_solver.py`` runs as written except for these textual replacements (printed as they are made): the
device (``cuda`` -> the CPU, also for autocast and for ``FlexARItemProcessor``'s default), greedy picks (``do_sample=False``: a recorded stream must not
depend on a random generator), and three lines that add ``<racm3:break>`` and the two size tokens to the prompt
and keep the prompt and the stream: a random tiny model does not write those three tokens itself, so the stream
is recorded from the point where the reference's processors take over (the guidance, its schedule, the row and
end constraints, top-k), which is also where this pack's stream starts (it forces them).  The run's working
folder links ``movqgan/`` and ``Alpha-VLLM/Lumina-mGPT-2.0`` to the tiny folder (where ``get_movqgan_model``
reads its checkpoint, and the hub name the logits processors load their tokenizer by).  Modules replaced:
``pytorch_lightning`` (MoVQGAN's training base class: a plain ``nn.Module``), ``torchvision`` and ``fairscale``
(imported, not used on this path).  The MoVQGAN is built as ``get_movqgan_model`` builds it, from the tiny
``ddconfig`` of ``movqgan_files.py`` with the release's 16384 codes.
"""
from __future__ import annotations

import json
import pathlib
import sys

from .liquid_reference import _module, _patched

PROMPTS = ["a red fox in snow", "blue sky", "a cat on mat , at dawn"]
ROW_SIZES = [(64, 64), (96, 64), (64, 96)]  # (width, height) of the recorded prompt rows
GREEDY_PROMPT, GREEDY_SIZE = "a red fox in snow", (64, 64)
CFG = 7.0  # above the schedule's floor of 4: the recorded stream crosses the decay
TOP_K = 4096
#: movqgan_files.DDCONFIG (that module needs this pack, which the reference's environment lacks)
DDCONFIG = {"double_z": False, "z_channels": 4, "resolution": 256, "in_channels": 3, "out_ch": 3, "ch": 32,
            "ch_mult": [1, 2, 2, 4], "num_res_blocks": 1, "attn_resolutions": [32], "dropout": 0.0}
LOGIT_POSITIONS = 12  # stream positions (after the size tokens) whose teacher-forced logits are kept
#: the vocabulary entries kept of them (the whole vocabulary is 172032 ids): the low text ids, the specials the
#: stream uses, and every 16th image token
KEPT_IDS = [*range(48), 151643, 151665, 151666, 151670, *range(155000, 155000 + 16384, 16)]


def write(folder: str) -> None:
    from .lumina2_files import write_lumina2

    write_lumina2(pathlib.Path(folder))


def _stub_modules():
    import types

    from torch import nn

    lightning = types.ModuleType("pytorch_lightning")
    lightning.LightningModule = nn.Module
    vision = types.ModuleType("torchvision")
    vision.transforms = types.ModuleType("torchvision.transforms")
    fairscale = types.ModuleType("fairscale")
    for name, module in {"pytorch_lightning": lightning, "torchvision": vision,
                         "torchvision.transforms": vision.transforms, "fairscale": fairscale}.items():
        sys.modules.setdefault(name, module)


def record(folder: str, checkout: str, out: str) -> None:
    import os
    import tempfile

    import numpy as np
    import torch
    import transformers
    from safetensors.torch import save_file

    assert transformers.__version__ == "4.46.2", transformers.__version__
    folder, root, out = (pathlib.Path(p).resolve() for p in (folder, checkout, out))
    sys.path[:0] = [str(root / "lumina_mgpt"), str(root)]
    _stub_modules()
    import movqgan

    movqgan.MODELS["270M"]["model_params"] = {"ddconfig": DDCONFIG, "n_embed": 16384, "embed_dim": 4}
    from data import item_processor

    init = item_processor.FlexARItemProcessor.__init__
    assert init.__defaults__[-1] == "cuda", init.__defaults__
    init.__defaults__ = (*init.__defaults__[:-1], "cpu")  # the processors' own item processors: on the CPU
    kept = {}
    source = _patched(root / "lumina_mgpt" / "inference_solver.py", [
        ('device="cuda"', 'device="cpu"'),
        ("do_sample=True,", "do_sample=False,"),
        ("with torch.cuda.amp.autocast(dtype=self.dtype):", "with torch.autocast('cpu', enabled=False):"),
        ("decode_code(cache.cuda(), h*4, w*4)", "decode_code(cache, h*4, w*4)"),
        ("        prompt_len = len(prompt)\n",
         "        prompt += KEPT['forced']\n        KEPT['prompt'] = list(prompt)\n        prompt_len = len(prompt)\n"),
        ("        return self.decode_ids(generation_result)\n",
         "        KEPT['stream'] = generation_result\n        return self.decode_ids(KEPT['forced'] + generation_result)\n"),
    ])
    # get_movqgan_model reads ./movqgan/270M/movqgan_270M.ckpt, and the logits processors' own item processors
    # load the tokenizer by its hub name: both resolved from a working folder of links to the tiny one
    work = pathlib.Path(tempfile.mkdtemp())
    (work / "movqgan").symlink_to(folder / "movqgan")
    (work / "Alpha-VLLM").mkdir()
    (work / "Alpha-VLLM" / "Lumina-mGPT-2.0").symlink_to(folder)
    os.chdir(work)
    solver_module = _module(pathlib.Path(tempfile.mkdtemp()), "inference_solver", source, KEPT=kept)
    solver = solver_module.FlexARInferenceSolver(model_path=str(folder), precision="fp32", target_size=512,
                                                 device="cpu")
    items = solver.item_processor

    def turn(prompt, w, h):
        return f"Generate an image of {w}x{h} according to the following prompt:\n{prompt}"

    rows = {}
    for prompt in PROMPTS:  # the prompt ids as generate() builds them, per size
        for w, h in ROW_SIZES:
            item = {"image": [], "conversations": [{"from": "human", "value": turn(prompt, w, h)},
                                                   {"from": "gpt", "value": None}]}
            rows[f"{w}x{h} {prompt}"] = items.process_item(item)
    w, h = GREEDY_SIZE
    kept["forced"] = [items.token2id(items.image_start_token), items.token2id(items.get_n_grids_token(h // 32)),
                      items.token2id(items.get_n_grids_token(w // 32))]
    text, images = solver.generate(images=[], qas=[[turn(GREEDY_PROMPT, w, h), None]], max_gen_len=10240,
                                   temperature=1.0, logits_processor=solver.create_logits_processor(
                                       cfg=CFG, image_top_k=TOP_K))
    stream = kept["stream"]
    assert kept["prompt"] == rows[f"{w}x{h} {GREEDY_PROMPT}"] + kept["forced"]
    picture = np.asarray(images[0])
    # teacher-forced logits: one full forward over each branch's rows and the greedy stream (no cache), the
    # conditional one with the mask and positions generate() gives it: transformers 4.46 fills the solver's unset
    # pad id from the model's generation config and masks the prompt positions holding it (here the BOS), and
    # prepare_inputs_for_generation counts positions over the unmasked tokens
    model = solver.model
    pad = model.generation_config.pad_token_id
    cond = torch.tensor([kept["prompt"] + stream])
    mask = cond.ne(pad).long() if pad is not None and pad != 151666 else torch.ones_like(cond)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    uncond = torch.tensor([kept["forced"] + stream])
    with torch.no_grad():
        lc = model(cond, attention_mask=mask, position_ids=positions).logits[0, len(kept["prompt"]) - 1:]
        lc = lc[:LOGIT_POSITIONS]
        lu = model(uncond).logits[0, 2:][:LOGIT_POSITIONS]
    out.mkdir(parents=True, exist_ok=True)
    ids = torch.tensor(KEPT_IDS)
    save_file({"conditional": lc[:, ids].float().contiguous(), "unconditional": lu[:, ids].float().contiguous(),
               "ids": ids}, str(out / "lumina2_logits.safetensors"), metadata={"transformers": "4.46.2"})
    record = {"source": "Alpha-VLLM/Lumina-mGPT-2.0 @f44a4d7 on transformers 4.46.2 (tests/lumina2_reference.py)",
              "cfg": CFG, "top_k": TOP_K, "greedy_prompt": GREEDY_PROMPT, "greedy_size": list(GREEDY_SIZE),
              "rows": rows, "forced": kept["forced"], "masked_pad_id": pad, "stream": stream, "decoded_uint8": picture.tolist()}
    (out / "lumina2.json").write_text(json.dumps(record))
    print(f"recorded {len(stream)} stream tokens, logits {tuple(lc.shape)}, picture {picture.shape}, in {out}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["write"]:
        write(sys.argv[2])
    elif sys.argv[1:2] == ["record"]:
        record(*sys.argv[2:5])
    else:
        raise SystemExit(__doc__)
