"""Loading a transformers-family model takes about its own size in memory (issue 29: 7B models on
8-24 GB GPUs): no float32 stage, no second copy while converting to the requested dtype, in every
layout the Janus, Chameleon and Liquid loaders read; and a Lumina-mGPT folder loads without transformers'
report of the VQ-encoder keys its releases do not ship (nor a random encoder built for them).

Memory is measured in a fresh process: the peak resident set (``VmHWM``) of loading the model and
reading each of its parameters once (so weights that stay memory-mapped count as they will once
used), minus the peak after importing torch, transformers and the loaders.  (``ru_maxrss`` would not
do: a child's starts at its parent's peak, here pytest's with the checkpoints it wrote.)  The checkpoints
are random bfloat16 models of about 300 MB, so the bound (1.2 x the weight files + a fixed
:data:`OVERHEAD`) is far from the 2x of a converting copy or the 3x of a float32 stage."""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from .chameleon_files import write_chameleon, write_lumina
from .chameleon_meta_files import perturb, tiny_model, write_meta_chameleon
from .checkpoints import tiny_janus, write_janus, write_original_janus
from .liquid_files import write_liquid

OVERHEAD = 64 * 2 ** 20  # config, tokenizer, the model's buffers, one float32 parameter read at a time
#: quantizing: the same, plus the quantizer's temporaries for one layer (float32 copies, block scales) and the
#: heap it leaves between trims (measured up to 80 MB over the stored size for nf4 at this size)
QUANTIZING_OVERHEAD = 96 * 2 ** 20
RATIO = 1.2
LAYERS, HIDDEN, FFN, HEADS = 12, 1024, 2816, 16  # about 150 M parameters: 300 MB in bfloat16

LAYOUTS = {  # name: (loader module, how to write it into a folder)
    "janus-converted": ("janus", lambda d: write_janus(d, *_janus())),
    "janus-original": ("janus", lambda d: write_original_janus(d, *_janus())),
    "chameleon-converted": ("chameleon", lambda d: write_chameleon(
        d, "lumina", dtype=torch.bfloat16, vqgan=False, hidden_size=HIDDEN, intermediate_size=FFN,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=HEADS)),
    "lumina-layout": ("chameleon", lambda d: write_lumina(
        d, vqgan=False, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=HEADS)),
    "meta-layout": ("chameleon", lambda d: _meta(d)),
    "liquid": ("liquid", lambda d: write_liquid(  # Gemma's layout: tied embedding, bfloat16 shards
        d, vqgan=False, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=HEADS, head_dim=HIDDEN // HEADS)),
}

MEASURE = textwrap.dedent("""
    import json, sys
    import torch, transformers
    from transformers import ChameleonForConditionalGeneration, JanusForConditionalGeneration
    from spec_ar.loaders import chameleon, janus, liquid

    def resident():  # the peak of this process's own memory; ru_maxrss would start at the parent's peak
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

    from spec_ar.loaders.storage import stored_bytes

    loader, folder, dtype = sys.argv[1], sys.argv[2], sys.argv[3]  # a storage name: bfloat16, int8, nf4 ...
    if dtype == "nf4":  # the library's own import (about 100 MB of code and tables) is not the model's
        from spec_ar.loaders.storage import import_bitsandbytes
        import_bitsandbytes()
    base = resident()
    model, _ = {"janus": janus, "chameleon": chameleon, "liquid": liquid}[loader].load_model(folder, dtype=dtype)
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            t.sum()  # read every weight once
    print(json.dumps({"peak": resident() - base, "dtypes": sorted({str(p.dtype) for p in model.parameters()}),
                      "stored": stored_bytes(model), "transformers": transformers.__version__}))
""")


def _janus():
    model, tok = tiny_janus(hidden=HIDDEN, intermediate=FFN, layers=LAYERS, heads=HEADS, kv_heads=HEADS)
    return model.to(torch.bfloat16), tok


def _meta(folder):
    model, vocab = tiny_model(heads=HEADS, kv_heads=HEADS, hidden=HIDDEN, inter=FFN, layers=LAYERS)
    perturb(model)
    return write_meta_chameleon(folder, model.to(torch.bfloat16), vocab)  # its tiny VQGAN fills the encoder


def weight_bytes(folder) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.suffix in (".safetensors", ".bin", ".pth"))


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def written(request, tmp_path_factory):
    loader, write = LAYOUTS[request.param]
    folder = write(tmp_path_factory.mktemp("memory") / request.param)
    yield request.param, loader, folder
    shutil.rmtree(folder.parent)  # 300 MB a layout: gone before the next is written


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the peak from Linux's /proc")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_loading_a_bfloat16_checkpoint_takes_its_own_size(written, dtype):
    layout, loader, folder = written
    done = subprocess.run([sys.executable, "-c", MEASURE, loader, str(folder), dtype], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    stored = weight_bytes(folder)
    assert result["dtypes"] == [f"torch.{dtype}"]
    mb = 2 ** 20
    assert result["peak"] <= RATIO * stored + OVERHEAD, (
        f"{layout} in {dtype} (transformers {result['transformers']}): peak {result['peak'] / mb:.0f} MB for "
        f"{stored / mb:.0f} MB of weights, over {RATIO} x + {OVERHEAD / mb:.0f} MB")


@pytest.mark.parametrize("layout", ["lumina-layout", "meta-layout"])
def test_a_folder_without_vq_encoder_weights_loads_without_a_report_or_a_random_encoder(tmp_path, capfd, caplog,
                                                                                       layout):
    from spec_ar.loaders import chameleon

    if layout == "lumina-layout":
        folder = write_lumina(tmp_path / "Lumina-mGPT-7B-768")  # its releases ship no model.vqmodel.*
    else:
        folder = write_meta_chameleon(tmp_path / "Anole-7b-v0.1")  # the encoder comes from vqgan.ckpt
    capfd.readouterr()
    with caplog.at_level(logging.INFO):
        loaded = chameleon.load(folder, width=64 if layout == "lumina-layout" else None,
                                height=64 if layout == "lumina-layout" else None)
    out, err = capfd.readouterr()
    said = "\n".join([out, err, caplog.text])
    for word in ("MISSING", "missing", "newly initialized", "not initialized", "randomly initialised"):
        assert word not in said, said
    encoder = loaded.adapter.inner.vqmodel
    if layout == "lumina-layout":
        assert encoder is None  # not built: generating never runs it, the pictures come from Meta's VQGAN
        ids, vectors = loaded.adapter.token_vectors()  # the codebook is the VQGAN decoder's
        assert torch.equal(vectors, loaded.adapter.codebook[loaded.adapter.code_of[ids]])
    else:
        assert encoder is not None and not any(p.is_meta for p in encoder.parameters())


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the peak from Linux's /proc")
@pytest.mark.parametrize("dtype", ["int8", "nf4"])
def test_quantized_storage_takes_its_own_size_while_loading(written, dtype):
    """Each transformer layer is quantized as it is read and its file pages given back: the
    peak is the quantized model's size, not the bfloat16 file's."""
    layout, loader, folder = written
    done = subprocess.run([sys.executable, "-c", MEASURE, loader, str(folder), dtype], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    mb = 2 ** 20
    assert result["stored"] < 0.7 * weight_bytes(folder)
    assert result["peak"] <= RATIO * result["stored"] + QUANTIZING_OVERHEAD, (
        f"{layout} in {dtype}: peak {result['peak'] / mb:.0f} MB for {result['stored'] / mb:.0f} MB stored "
        f"({weight_bytes(folder) / mb:.0f} MB in the files), over {RATIO} x + {QUANTIZING_OVERHEAD / mb:.0f} MB")
