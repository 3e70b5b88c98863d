"""How ``tests/reference/emu35.json`` and ``emu35_logits.safetensors`` were recorded: Emu3.5's own code
(baaivision/Emu3.5 @8fcf1da: ``inference.py``'s ``main`` and ``inference``, ``src/utils/model_utils.py``'s
``build_emu3p5``, ``src/utils/generation_utils.py``, the logits processor of ``src/utils/logits_processor.py``,
their ``Emu3ForCausalLM`` of ``src/emu3p5/modeling_emu3.py``, BAAI's tokenizer ``src/tokenizer_emu3_ibq/
tokenization_emu3.py`` on ``tiktoken``, their IBQ vision tokenizer of ``src/vision_tokenizer/``) on transformers
4.48.2 (their pin), run with ``configs/example_config_t2i.py`` on the tiny folder of ``emu35_files.py``.  Not a test;
run by hand from the repository root, three steps:

1. the folder (its tokenizer files in ``tokenizer_emu3_ibq/`` and its IBQ tokenizer in
   ``Emu3.5-VisionTokenizer/`` beside it, and the RoPE-scaling variants ``Emu3.5-Image-rope-*``), in this pack's
   environment::

       .venv/bin/python -m tests.emu35_reference write /tmp/emu35-ref/Emu3.5-Image

2. the authors' dependencies, installed beside the pack's (the torch is the same 2.13)::

       .venv/bin/pip install --target /tmp/emu35-deps --no-deps transformers==4.48.2 tokenizers==0.21.0 \\
           huggingface_hub==0.27.1 accelerate==1.1.1 tiktoken omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 \\
           einops protobuf

3. the reference on it (``EMU35``: a checkout of baaivision/Emu3.5 at 8fcf1da)::

       PYTHONPATH=/tmp/emu35-deps .venv/bin/python -m tests.emu35_reference record /tmp/emu35-ref/Emu3.5-Image \\
           EMU35 tests/reference

What runs is the authors' ``inference.main()`` as written, given a configuration module that imports
``configs/example_config_t2i.py`` and sets only what a user of that file sets (paths, ``hf_device`` and
``vq_device`` ``cpu``, the prompt list, ``target_height`` / ``target_width``: the tiny grid) and three things
this record needs, each printed as it is made: greedy picks (``do_sample`` False: transformers then takes the
argmax of the processed scores; a recorded stream must not depend on a random generator), ``max_new_tokens`` that
ends the run at ``<|image end|>``, and ``<|image start|>`` appended to the template: the pack forces it where the
authors let the model write text first (its departure), so the reference is started where the pack starts.  From
there on the authors' logits processor forces the size digits and ``<|image token|>``, guides the visual tokens
(log-softmax, scale 5.0, image top-k 5120), forces the row tokens and ``<|image end|>``.  ``build_emu3p5`` is run
with two textual replacements (printed): float32 weights (it reads bfloat16) and eager attention (it asks for
FlashAttention-2, which the CPU has not; their eager path applies ``q_norm`` / ``k_norm`` as FlashAttention's
does).  The tokenizer is loaded by their ``AutoTokenizer`` call from a folder holding their
``tokenization_emu3.py`` and ``tokenizer_config.json`` (copied from the checkout) with the tiny
``emu3.tiktoken`` and ``emu3_vision_tokens.txt``.  ``inference.generate`` is wrapped to keep what it is given and
yields (the prompt rows, the generated ids); nothing else is changed.  The picture is their ``decode_image`` on
the generated text with ``<|image start|>`` written back in front (``multimodal_decode`` finds an image by it,
and here the prompt holds it).  The teacher-forced logits are one full forward (no cache) of the authors' model over
each guidance branch's row and the stream; and of the conditional row and the stream under each of the authors'
RoPE scalings (``linear`` and ``dynamic``, factor 2), the same weights in folders beside the main one, loaded as
``build_emu3p5`` loads a model.
"""
from __future__ import annotations

import json
import pathlib
import shutil
import sys

from .liquid_reference import _module, _patched

PROMPTS = ["a red fox in the snow", "blue sky", "a cat on mat , at dawn", "lighthouses!! zzq zzqx 123",
           "Ünïcödé café\n\n 東京 🦊 <|image start|>"]
GREEDY_PROMPT = "a red fox in the snow"
GRID = (3, 4)  # rows, columns of codes: 48 x 64 pixels, 15 stream tokens
HEADERS = [(55, 73), (64, 64), (3, 4), (128, 85), (1, 100)]  # size headers whose digits are recorded
LOGIT_POSITIONS = 10  # stream positions whose teacher-forced logits are kept
#: folders beside the main one, the same weights under the authors' two rope_scalings (``-rope-linear`` ...):
#: teacher-forced conditional logits of each are kept too
ROPE = {"linear": {"type": "linear", "factor": 2.0}, "dynamic": {"type": "dynamic", "factor": 2.0}}
CONFIG_MODULE = '''\
from configs.example_config_t2i import *  # noqa: F401,F403  (the authors' t2i configuration, then a user's settings)

model_path, vq_path, tokenizer_path = {model!r}, {vq!r}, {tokenizer!r}
hf_device, vq_device = "cpu", "cpu"
save_path = {save!r}
prompts = [{prompt!r}]
target_height, target_width = {rows}, {cols}
# for the record (tests/emu35_reference.py says why):
template = template + "<|image start|>"
sampling_params = dict(sampling_params, do_sample=False, max_new_tokens={new_tokens})
print("config:", template, unc_prompt, classifier_free_guidance, sampling_params, target_height, target_width)
'''


def write(folder: str) -> None:
    from .emu35_files import write_emu35

    write_emu35(pathlib.Path(folder))
    for name, scaling in ROPE.items():
        write_emu35(pathlib.Path(f"{folder}-rope-{name}"), vision=False, rope_scaling=scaling)


def record(folder: str, checkout: str, out: str) -> None:
    import importlib
    import os
    import tempfile

    import numpy as np
    import torch
    import transformers
    from safetensors.torch import save_file

    from .emu35_files import TOKENIZER_FOLDER, VISION_FOLDER

    assert transformers.__version__ == "4.48.2", transformers.__version__
    folder, root, out = (pathlib.Path(p).resolve() for p in (folder, checkout, out))
    work = pathlib.Path(tempfile.mkdtemp())
    tokenizer_dir = work / "tokenizer"
    tokenizer_dir.mkdir()
    for name in ("tokenization_emu3.py", "tokenizer_config.json"):  # the authors' code and settings
        shutil.copy(root / "src" / "tokenizer_emu3_ibq" / name, tokenizer_dir / name)
    for name in ("emu3.tiktoken", "emu3_vision_tokens.txt"):  # the tiny vocabulary
        shutil.copy(folder.parent / TOKENIZER_FOLDER / name, tokenizer_dir / name)
    sys.path[:0] = [str(root), str(work)]
    os.chdir(work)  # the configuration's logger writes under ./outputs

    rows, cols = GRID
    kept: dict = {}
    utils = _module(work, "src.utils.model_utils_reference", _patched(root / "src" / "utils" / "model_utils.py", [
        ("        torch_dtype=torch.bfloat16,\n", "        torch_dtype=torch.float32,\n"),
        ('        attn_implementation="flash_attention_2",\n', '        attn_implementation="eager",\n')]))
    import inference  # the authors' script, as a module

    def build(*args, **kwargs):
        kept["model"], kept["tokenizer"], kept["vq"] = loaded = utils.build_emu3p5(*args, **kwargs)
        return loaded

    def generate(cfg, model, tokenizer, input_ids, unconditional_ids, *args):
        kept.update(input_ids=input_ids[0].tolist(), unconditional_ids=unconditional_ids[0].tolist(), cfg=cfg)
        for tokens in generation(cfg, model, tokenizer, input_ids, unconditional_ids, *args):
            kept["generated"] = [int(t) for t in tokens]
            yield tokens

    generation = inference.generate
    inference.build_emu3p5, inference.generate = build, generate

    header = len(str(rows)) + 1 + len(str(cols))  # the digits, '*': one token each
    (work / "emu35_tiny").mkdir()
    (work / "emu35_tiny" / "__init__.py").write_text("")
    (work / "emu35_tiny" / "t2i_tiny.py").write_text(CONFIG_MODULE.format(
        model=str(folder), vq=str(folder.parent / VISION_FOLDER), tokenizer=str(tokenizer_dir),
        save=str(work / "outputs" / "t2i"), prompt=GREEDY_PROMPT, rows=rows, cols=cols,
        new_tokens=header + 1 + rows * (cols + 1)))
    importlib.invalidate_caches()
    sys.argv = ["inference.py", "--cfg", "emu35_tiny/t2i_tiny.py"]
    inference.main()

    model, tokenizer, cfg = kept["model"], kept["tokenizer"], kept["cfg"]
    assert model.config._attn_implementation == "eager" and model.dtype == torch.float32
    generated = kept["generated"]
    boi, img, eoi, eol = (tokenizer.encode(t)[0] for t in ("<|image start|>", "<|image token|>", "<|image end|>",
                                                           "<|extra_200|>"))
    assert kept["input_ids"][-1] == boi and generated[header] == img and generated[-1] == eoi, generated
    sizes = generated[:header]
    stream = generated[header + 1:]
    assert len(stream) == rows * (cols + 1) and stream.count(eol) == rows - 1
    # the rows as the pack builds them: the prompt up to <|image start|>, the size digits, <|image token|>
    conditional = kept["input_ids"] + sizes + [img]
    unconditional = kept["unconditional_ids"] + [boi] + sizes + [img]
    prompts = {}
    for prompt in PROMPTS:  # as inference() encodes its prompts (BOS put first when missing)
        ids = tokenizer.encode(cfg.template.format(question=prompt), add_special_tokens=False)
        prompts[prompt] = ([] if ids[0] == cfg.special_token_ids["BOS"] else [cfg.special_token_ids["BOS"]]) + ids
    headers = {f"{h}*{w}": tokenizer.encode(f"{h}*{w}", add_special_tokens=False) for h, w in HEADERS}
    texts = PROMPTS + [cfg.unc_prompt, "it's he'll WE'RE  \ttabs\r\n", "e\u0301 NFC"]
    encodings = {t: tokenizer.encode(t, add_special_tokens=False) for t in texts}
    with torch.no_grad():
        lc = model(torch.tensor([conditional + stream])).logits[0, len(conditional) - 1:][:LOGIT_POSITIONS]
        lu = model(torch.tensor([unconditional + stream])).logits[0, len(unconditional) - 1:][:LOGIT_POSITIONS]
    vocab = model.config.vocab_size
    ids = torch.tensor([*range(0, 151643, 997), *range(151643, 151854), *range(151854, vocab)])
    # the picture: their decode_image on the image's text, <|image start|> written back in front (inference()'s
    # multimodal_decode finds an image by it, and here the prompt holds it)
    from src.utils.generation_utils import decode_image

    picture = np.asarray(decode_image("<|image start|>" + tokenizer.decode(generated), tokenizer, kept["vq"]))
    tensors = {"conditional": lc[:, ids].float().contiguous(), "unconditional": lu[:, ids].float().contiguous(),
               "ids": ids}
    from src.emu3p5 import Emu3Config, Emu3ForCausalLM

    for name, scaling in ROPE.items():  # as build_emu3p5 loads a model, in float32 with eager attention
        variant = pathlib.Path(f"{folder}-rope-{name}")
        config = Emu3Config.from_pretrained(str(variant), trust_remote_code=True)
        assert config.rope_scaling == scaling, config.rope_scaling
        other = Emu3ForCausalLM.from_pretrained(str(variant), config=config, torch_dtype=torch.float32,
                                                device_map="cpu", attn_implementation="eager").eval()
        with torch.no_grad():
            logits = other(torch.tensor([conditional + stream])).logits[0, len(conditional) - 1:][:LOGIT_POSITIONS]
        tensors[f"rope_{name}"] = logits[:, ids].float().contiguous()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "emu35_logits.safetensors"), metadata={"transformers": "4.48.2"})
    record = {"source": "baaivision/Emu3.5 @8fcf1da on transformers 4.48.2 (tests/emu35_reference.py)",
              "template": cfg.template, "unc_prompt": cfg.unc_prompt, "cfg": cfg.classifier_free_guidance,
              "image_top_k": cfg.sampling_params["image_top_k"], "grid": [rows, cols], "greedy_prompt": GREEDY_PROMPT,
              "prompt_row": kept["input_ids"], "unconditional_row": kept["unconditional_ids"], "generated": generated,
              "conditional": conditional, "unconditional": unconditional, "stream": stream, "prompts": prompts,
              "headers": headers, "encodings": encodings, "decoded_uint8": picture.tolist()}
    (out / "emu35.json").write_text(json.dumps(record, ensure_ascii=False))
    print(f"recorded {len(stream)} stream tokens, logits {tuple(lc.shape)}, picture {picture.shape}, in {out}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["write"]:
        write(sys.argv[2])
    elif sys.argv[1:2] == ["record"]:
        record(*sys.argv[2:5])
    else:
        raise SystemExit(__doc__)
