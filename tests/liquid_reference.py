"""How ``tests/reference/liquid.json`` and ``liquid_logits.safetensors`` were recorded: Liquid's own
inference code (FoundationVision/Liquid @4609c47, ``evaluation/inference_t2i.py`` with the ``sample``
of ``evaluation/T2I_Eval/genaibench_generation.py`` and Meta's ``ImageTokenizer`` it ships in
``evaluation/chameleon/inference``) on transformers 4.39.2, the release its ``pyproject.toml`` pins, run
on the tiny folder of ``liquid_files.py``.  Not a test; run by hand, three steps:

1. the folder, in this pack's environment::

       .venv/bin/python -m tests.liquid_reference write /tmp/liquid-ref

2. a separate environment with the reference's transformers::

       python3 -m venv /tmp/refenv
       /tmp/refenv/bin/pip install torch==2.13.0 transformers==4.39.2 tokenizers==0.15.1 safetensors numpy pyyaml pillow

3. the reference on it (``LIQUID``: a checkout of FoundationVision/Liquid at 4609c47)::

       /tmp/refenv/bin/python tests/liquid_reference.py record /tmp/liquid-ref LIQUID tests/reference

``inference_t2i.py``'s ``main`` runs as written except for these textual replacements (printed as they are
made): the device (``cuda`` -> the CPU), float32 weights and eager attention instead of bfloat16 and
FlashAttention-2 (no GPU here), the VQGAN files' paths (the tiny folder's), greedy picks
(``sample_logits`` False: a recorded stream must not depend on a random generator), and two lines that keep
the prompt rows and the picked tokens for the record.  In ``genaibench_generation.py`` the literal 256000
(Gemma's text ids, masked before sampling) becomes the tiny tokenizer's text size.
"""
from __future__ import annotations

import json
import pathlib
import sys

PROMPTS = ["a red fox in snow", "blue sky", "a cat on a mat, at dawn"]
GREEDY_PROMPT = "a red fox in snow"
CFG = 7.0
LOGIT_POSITIONS = 32  # stream positions whose teacher-forced logits are kept
DECODE_GRID = (2, 2)  # the codes decoded by the reference decoder: the greedy stream's first four


def write(folder: str) -> None:
    from .liquid_files import write_liquid

    write_liquid(pathlib.Path(folder))


def _patched(path: pathlib.Path, replacements: list[tuple[str, str]]) -> str:
    source = path.read_text()
    for old, new in replacements:
        if old not in source:
            raise SystemExit(f"{path.name}: {old!r} not found: not the reference commit?")
        print(f"{path.name}: {old!r} -> {new!r}")
        source = source.replace(old, new)
    return source


def _module(folder: pathlib.Path, name: str, source: str, **names):
    """``source`` imported as module ``name`` (written under ``folder``), with ``names`` set in it first."""
    import importlib.util

    path = folder / (name.replace(".", "_") + ".py")
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(names)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def record(folder: str, checkout: str, out: str) -> None:
    import tempfile
    import types

    import numpy as np
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert transformers.__version__ == "4.39.2", transformers.__version__
    folder, evaluation = pathlib.Path(folder), pathlib.Path(checkout) / "evaluation"
    sys.path.insert(0, str(evaluation))
    text_ids = len(AutoTokenizer.from_pretrained(str(folder)))
    # genaibench_generation.sample, with the text mask at the tiny vocabulary's size
    patched = pathlib.Path(tempfile.mkdtemp())
    gen = _module(patched, "T2I_Eval.genaibench_generation", _patched(
        evaluation / "T2I_Eval" / "genaibench_generation.py",
        [("logits[:,:256000]=filter_value", f"logits[:,:{text_ids}]=filter_value")]))
    kept = {}
    source = _patched(evaluation / "inference_t2i.py", [
        ("attn_implementation='flash_attention_2'", "attn_implementation='eager'"),
        ("torch_dtype=torch.bfloat16", "torch_dtype=torch.float32"),
        ("vqllm = vqllm.to('cuda')", "vqllm = vqllm.to('cpu')"),
        ('vqgan_cfg_path = "chameleon/vqgan.yaml"', 'vqgan_cfg_path = args.vqgan_dir + "/vqgan.yaml"'),
        ('vqgan_ckpt_path = "chameleon/vqgan.ckpt"', 'vqgan_ckpt_path = args.vqgan_dir + "/vqgan.ckpt"'),
        ('device="cuda:0"', 'device="cpu"'),
        ('.to("cuda:0")', '.to("cpu")'),
        ("'sample_logits': True", "'sample_logits': False"),
        ("        input_ids = model_inputs['input_ids']\n",
         "        input_ids = model_inputs['input_ids']\n        KEPT['rows'] = model_inputs\n"),
        ("        image_vq_id = torch.cat(pred_tokens,dim=1)-ori_vocabe_size\n",
         "        KEPT['tokens'] = torch.cat(pred_tokens,dim=1)\n"
         "        image_vq_id = torch.cat(pred_tokens,dim=1)-ori_vocabe_size\n"),
    ])
    t2i = _module(patched, "inference_t2i", source, KEPT=kept)
    assert gen.sample is t2i.sample

    rows = {}
    for prompt in PROMPTS:  # the prompt rows as main builds them (four samples, then their unconditional rows)
        tok = AutoTokenizer.from_pretrained(str(folder), padding_side="left")
        batch = tok([prompt + " Generate an image based on this description.<boi>"] * 4 +
                    ["<unconditional><boi>"] * 4, return_tensors="pt", padding=True)
        rows[prompt] = {"input_ids": batch["input_ids"].tolist(), "attention_mask": batch["attention_mask"].tolist()}
    args = types.SimpleNamespace(temperature=0.99, cfg=CFG, TopK=4096, TopP=0.96, save_path=str(pathlib.Path(out) /
                                 "liquid-samples"), model_path=str(folder), prompt=GREEDY_PROMPT, load_8bit=False,
                                 vqgan_dir=str(folder / "chameleon"))
    t2i.main(args)
    inputs, tokens = kept["rows"], kept["tokens"]
    assert (tokens == tokens[0]).all(), "greedy rows differ"
    assert inputs["input_ids"].tolist() == rows[GREEDY_PROMPT]["input_ids"]
    stream = tokens[0].tolist()
    # teacher-forced logits: one full forward over each row's prompt and the greedy stream (no cache)
    model = AutoModelForCausalLM.from_pretrained(str(folder), torch_dtype=torch.float32, attn_implementation="eager")
    ids = torch.cat([inputs["input_ids"][[0, 4]], tokens[[0, 0]]], 1)
    mask = torch.cat([inputs["attention_mask"][[0, 4]], torch.ones_like(tokens[[0, 0]])], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    start = inputs["input_ids"].shape[1] - 1  # the last prompt position predicts the first image token
    kept_logits = logits[:, start:start + LOGIT_POSITIONS].float().contiguous()
    # the reference decoder on the stream's first codes
    from chameleon.inference.image_tokenizer import ImageTokenizer

    vq = ImageTokenizer(cfg_path=str(folder / "chameleon" / "vqgan.yaml"),
                        ckpt_path=str(folder / "chameleon" / "vqgan.ckpt"), device="cpu")
    h, w = DECODE_GRID
    codes = (tokens[0, : h * w] - text_ids).clamp(0)
    picture = np.asarray(vq.pil_from_img_toks(codes, h, w))
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({"conditional": kept_logits[0], "unconditional": kept_logits[1]},
              str(out / "liquid_logits.safetensors"), metadata={"start": str(start), "transformers": "4.39.2"})
    record = {"source": "FoundationVision/Liquid @4609c47 on transformers 4.39.2 (tests/liquid_reference.py)",
              "text_ids": text_ids, "cfg": CFG, "greedy_prompt": GREEDY_PROMPT, "rows": rows, "stream": stream,
              "decode_grid": list(DECODE_GRID), "decoded_uint8": picture.tolist()}
    (out / "liquid.json").write_text(json.dumps(record))
    print(f"recorded {len(stream)} stream tokens, logits {tuple(kept_logits.shape)}, picture {picture.shape}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["write"]:
        write(sys.argv[2])
    elif sys.argv[1:2] == ["record"]:
        record(*sys.argv[2:5])
    else:
        raise SystemExit(__doc__)
