"""bench/scale_checkpoints/: random-weight checkpoints with the real 7B / 8B configurations in each family's
release layout, written tensor by tensor.  Here at tiny scales: every family and layout is detected as its
family, passes the header checks and loads with the pack; both layouts of a family hold the same model; the
streamed files are what torch.save / safetensors would write; and the writer's memory stays near one chunk
(safetensors) or one tensor (torch pickles) while it writes many times that."""
import json
import pathlib
import subprocess
import sys
import zipfile

import pytest
import torch

from spec_ar.bench import scale_checkpoints as sc
from spec_ar.bench.scale_checkpoints import tensors
from spec_ar.bench.scale_checkpoints.chameleon import _interleave_rows
from spec_ar.bench.scale_checkpoints.check import check, header_shapes
from spec_ar.bench.scale_checkpoints.scaling import meta_ffn
from spec_ar.bench.scale_checkpoints.tensors import TensorSpec, materialize
from spec_ar.bench.scale_checkpoints.weight_files import write_safetensors, write_torch
from spec_ar.loaders.detect import detect, load_model
from spec_ar.sampling import DecodeConfig, SpeculativeDecoder

TINY = 0.02  # one head of the real size, one layer, 32-channel VQ; real vocabularies, codebooks and grids
LAYOUTS = [(family, layout) for family, cfg in sc.CONFIGS.items() for layout in cfg["layouts"]]
PROMPT = "a red fox in snow"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Each family / layout written once at :data:`TINY` (on first use)."""
    cache = {}

    def get(family, layout):
        if (family, layout) not in cache:
            folder = tmp_path_factory.mktemp(f"{family}-{layout}")
            cache[family, layout] = sc.write(family, folder / "model", layout, scale=TINY, log=lambda *a: None)
        return cache[family, layout]

    return get


class Stop(Exception):
    pass


@pytest.mark.parametrize("family,layout", LAYOUTS)
def test_detected_checked_and_loads(written, family, layout):
    result = written(family, layout)
    folder = result.folder
    assert detect(folder).family == sc.FAMILY_OF[family]
    report = check(folder, family, layout, result.expected, log=lambda *a: None)
    assert report["tensors"] == result.tensors
    model = load_model(folder, None, None, None, "cpu", torch.float32, None, None)
    assert model.family == sc.FAMILY_OF[family]
    steps = []

    def stop(event):
        steps.append(event.committed[0])
        if len(steps) == 2:  # the prefill and one speculative step
            raise Stop

    with pytest.raises(Stop):
        SpeculativeDecoder(model.adapter, DecodeConfig(mode="sjd", window=4)).generate([PROMPT], seeds=0, callback=stop)
    assert steps[-1] > steps[0]


@pytest.mark.parametrize("family", [f for f, cfg in sc.CONFIGS.items() if len(cfg["layouts"]) > 1])
def test_both_layouts_hold_the_same_model(written, family):
    """Tensors are drawn from the converted names' seeds in every layout (Meta's rows interleaved from the same
    values), so the original layout, mapped by the pack's loader, is the converted model exactly."""
    logits = []
    for layout in sc.CONFIGS[family]["layouts"]:
        model = load_model(written(family, layout).folder, None, None, None, "cpu", torch.float32, None, None)
        logits.append(model.adapter.prefill([PROMPT], None, True))
        model.adapter.release()
    assert torch.equal(logits[0], logits[1])


def test_full_size_configurations():
    """The table's values are transformers' config defaults where it says so ([T]), and the full-size models
    (on the meta device: nothing allocated) have the released parameter counts."""
    from transformers import ChameleonConfig, Emu3TextConfig, Emu3VQVAEConfig, JanusVisionConfig, JanusVQVAEConfig

    cham = ChameleonConfig()
    for name in ("lumina-mgpt-7b-768", "anole-7b"):
        t = sc.CONFIGS[name]["text"]
        assert (t["vocab_size"], t["hidden_size"], t["num_hidden_layers"], t["num_attention_heads"],
                t["num_key_value_heads"], t["max_position_embeddings"]) == (
            cham.vocab_size, cham.hidden_size, cham.num_hidden_layers, cham.num_attention_heads,
            cham.num_key_value_heads, cham.max_position_embeddings)
        assert meta_ffn(t["hidden_size"], t["ffn_dim_multiplier"], t["multiple_of"]) == cham.intermediate_size
        assert sc.CONFIGS[name]["vq"]["n_embed"] == cham.vq_config.num_embeddings
    emu_t, emu_vq = Emu3TextConfig(), Emu3VQVAEConfig()
    t = sc.CONFIGS["emu3-gen"]["text"]
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "max_position_embeddings"):
        assert t[key] == getattr(emu_t, key), key
    assert (sc.CONFIGS["emu3-gen"]["ids"]["<|extra_203|>"], sc.CONFIGS["emu3-gen"]["ids"]["<|extra_204|>"]) == (
        emu_t.bos_token_id, emu_t.eos_token_id)
    for key in ("codebook_size", "embed_dim", "base_channels", "num_res_blocks", "hidden_size"):
        assert sc.CONFIGS["emu3-gen"]["vq"][key] == getattr(emu_vq, key), key
    vision, vq = JanusVisionConfig(), JanusVQVAEConfig()
    for key, value in sc.CONFIGS["janus-pro-7b"]["vision"].items():
        assert value == getattr(vision, key), key
    for key, value in sc.CONFIGS["janus-pro-7b"]["vq"].items():
        assert value == (list(getattr(vq, key)) if isinstance(value, list) else getattr(vq, key)), key
    from transformers import GemmaConfig

    gemma, t = GemmaConfig(), sc.CONFIGS["liquid-7b"]["text"]
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "max_position_embeddings", "rms_norm_eps"):
        assert t[key] == getattr(gemma, key), key
    assert t["vocab_size"] == gemma.vocab_size + sc.CONFIGS["liquid-7b"]["vq"]["n_embed"]  # 256000 + 8192 codes
    counts = {name: sc.planned_parameters(name) for name in sc.CONFIGS}
    assert 7.3e9 < counts["janus-pro-7b"] < 7.5e9  # Janus-Pro-7B: 7.42B with its towers
    assert 7.0e9 < counts["anole-7b"] == counts["lumina-mgpt-7b-768"] < 7.1e9  # Chameleon-7B (7.01B) + VQ encoder
    assert 8.7e9 < counts["emu3-gen"] < 8.8e9  # Emu3-Gen: the 8.49B LLM and its 0.27B VQ-VAE
    assert 8.56e9 < counts["liquid-7b"] < 8.57e9  # Gemma-7B (8.54B, tied embedding) + 8192 code rows
    # Chameleon-7B's text model (the sizes assumed, see [A]) over 172032 ids, no VQ-VAE in the release
    assert 7.88e9 < counts["lumina-mgpt-2.0"] < 7.89e9
    # Qwen2.5-1.5B's 1.31B parameters outside its embedding (as Qwen reports them) + 215672 tied embedding rows
    assert 1.64e9 < counts["simplear-1.5b"] < 1.645e9
    assert 34.1e9 < counts["emu35-image"] < 34.11e9  # Emu3.5-Image: 34.1B, 68.2 GB in bfloat16
    # GLM-Image: the 8.91B text model and head, 1.2B vision encoder and VQ model, 6.93B DiT, ByT5 encoder, VAE
    assert 17.34e9 < counts["glm-image"] < 17.35e9


def test_glm_image_configuration():
    """GLM-Image's [T] values are transformers' GlmImageConfig defaults, its parts have the release's sizes (a 9B
    AR text model and head, a 7B DiT) in the release's 4 + 3 shards, the specials sit at transformers' ids, and
    --layers makes the DiT as deep as the text model (at most its 30)."""
    from spec_ar.bench.scale_checkpoints import glm_image
    from spec_ar.bench.scale_checkpoints.weight_files import shard

    cfg = sc.CONFIGS["glm-image"]
    glm_image.check_defaults()
    ids = glm_image.special_ids(cfg)
    assert (ids["<|endoftext|>"], ids["<sop>"], ids["<|image|>"]) == (167841, 167845, 167855)
    counts = glm_image.parameter_counts(cfg)
    assert 8.91e9 < counts["AR language model + head"] < 8.92e9 and 6.92e9 < counts["DiT"] < 6.93e9
    models = glm_image.part_models(glm_image.part_settings(cfg, 1.0))
    for part, n in (("vision_language_encoder", 4), ("transformer", 3)):
        specs = tensors.specs_of(glm_image.saved_state(models[part]))
        assert len(shard(specs, torch.bfloat16, cfg["shard_gb"]["diffusers"] * 1e9)) == n, part
    assert "encoder.embed_tokens.weight" not in glm_image.saved_state(models["text_encoder"])  # tied to shared
    for layers, dit in ((2, 2), (40, 30)):
        deep = sc.with_layers("glm-image", cfg, layers)
        assert (deep["text"]["num_hidden_layers"], deep["dit"]["num_layers"]) == (layers, dit)


def test_emu35_configuration_is_what_the_loader_reads(written):
    """Emu3.5's full-size config.json is Qwen3-32B's shape to the pack's loader, with the authors' defaults where the
    module says [E] (the loader's DEFAULTS are the authors' Emu3Config's); the written tokenizer files give the real
    vocabulary (282926 ids, the grammar's ids where the authors' processor hard-codes them) and the vision
    tokenizer the real codes and downsampling; 15 shards at full size."""
    from transformers import Qwen3ForCausalLM

    from spec_ar.bench.scale_checkpoints import emu35
    from spec_ar.bench.scale_checkpoints.weight_files import shard
    from spec_ar.decoders.ibq import IBQSpec
    from spec_ar.loaders import emu35 as loader

    cfg = sc.CONFIGS["emu35-image"]
    settings = emu35.emu35_settings(cfg, 1.0, torch.bfloat16)
    config = loader.qwen3_config(settings, "config.json")
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.num_attention_heads,
            config.num_key_value_heads, config.head_dim, config.vocab_size) == (5120, 25600, 64, 64, 8, 128, 282926)
    assert config.rope_parameters["rope_theta"] == loader.DEFAULTS["rope_theta"] and not config.tie_word_embeddings
    assert config.rms_norm_eps == 1e-6
    specs = tensors.specs_of(tensors.meta_state(Qwen3ForCausalLM, config))
    assert len(shard(specs, torch.bfloat16, cfg["shard_gb"]["original"] * 1e9)) == 15
    spec = IBQSpec()  # decoders/ibq.py's defaults: the release's values as far as known
    dd = cfg["vq"]["ddconfig"]
    assert (cfg["vq"]["n_embed"], cfg["vq"]["embed_dim"], dd["z_channels"], dd["ch"], tuple(dd["ch_mult"]),
            dd["num_res_blocks"], tuple(dd["attn_resolutions"])) == (
        spec.n_embed, spec.embed_dim, spec.z_channels, spec.ch, spec.ch_mult, spec.num_res_blocks,
        spec.attn_resolutions)
    folder = written("emu35-image", "original").folder
    written_settings = json.loads((folder / "config.json").read_text())
    assert {k: written_settings[k] for k in ("vocab_size", "head_dim", "model_type", "bos_token_id", "eos_token_id",
                                             "tie_word_embeddings")} == {
        "vocab_size": 282926, "head_dim": 128, "model_type": "Emu3", "bos_token_id": 151849, "eos_token_id": 151850,
        "tie_word_embeddings": False}
    tokenizer = loader.load_tokenizer(folder)
    assert len(tokenizer) == 282926 and len(tokenizer.codes) == 131072
    assert {name: tokenizer.token_id(name) for name in cfg["ids"]} == cfg["ids"]
    assert (tokenizer.ranks[b"!"], tokenizer.ranks[b"a"], tokenizer.ranks[b" "]) == (0, 64, 220)  # GPT-2's, as BAAI's
    assert tokenizer.encode("a red") == [64, tokenizer.ranks[b" red"]]
    vq = IBQSpec.from_yaml(folder / "Emu3.5-VisionTokenizer" / "config.yaml")
    assert (vq.n_embed, vq.downsample) == (131072, 16)


def test_layers_keep_the_widths(tmp_path, monkeypatch):
    """``--layers N``: the language model N layers deep at its real widths (the headers say so; the vision tokenizer,
    which --layers leaves as it is, not written here); refused outside 1..the real depth and with --scale."""
    from spec_ar.bench.scale_checkpoints import emu35

    monkeypatch.setattr(emu35, "write_ibq", lambda *a: None)
    result = sc.write("emu35", tmp_path / "model", layers=2, holes=True, log=lambda *a: None)
    shapes = {k: v for f in result.expected for k, v in header_shapes(f).items()}
    assert {int(k.split(".")[2]) for k in shapes if k.startswith("model.layers.")} == {0, 1}
    assert shapes["model.layers.1.self_attn.q_proj.weight"] == (8192, 5120)
    assert shapes["model.layers.1.mlp.down_proj.weight"] == (5120, 25600)
    assert shapes["lm_head.weight"] == (282926, 5120)
    per_layer = sc.planned_parameters("emu35", layers=2) - sc.planned_parameters("emu35", layers=1)
    assert result.parameters == sc.planned_parameters("emu35", layers=2)
    assert sc.planned_parameters("emu35") == result.parameters + 62 * per_layer
    assert json.loads((tmp_path / "model" / "config.json").read_text())["num_hidden_layers"] == 2
    assert result.summary()["layers"] == 2
    for bad in (0, 65):
        with pytest.raises(ValueError, match="--layers must be .* from 1 to 64"):
            sc.write("emu35", tmp_path / "bad", layers=bad)
    with pytest.raises(ValueError, match="--scale"):
        sc.write("emu35", tmp_path / "bad", layers=2, scale=0.5)
    out = subprocess.run([sys.executable, "-m", "spec_ar.bench.scale_checkpoints", "--family", "liquid",
                          "--out", str(tmp_path / "cli"), "--layers", "29"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--layers must be a whole number of layers from 1 to 28" in out.stderr
    assert not (tmp_path / "cli").exists()


def test_torch_writer_is_torch_save(tmp_path):
    """The streamed pickle is byte for byte what torch.save writes for the same tensors, nesting and plain
    values included (a VQGAN checkpoint's layout), integer buffers too."""
    specs = [TensorSpec("a.weight", (3, 5000)), TensorSpec("b.bias", (5,), "zeros"),
             TensorSpec("n.norm.weight", (7,), "ones"), TensorSpec("bn.num_batches_tracked", (), "zeros",
                                                                       dtype=torch.int64),
             TensorSpec("q.weight", (8, 3), sources=("q1", "q2"))]
    tree = {"state_dict": {s.name: s for s in specs}, "global_step": 3}
    write_torch(tmp_path / "mine.ckpt", tree, torch.bfloat16, 0)
    reference = {"state_dict": {s.name: materialize(s, torch.bfloat16, 0).clone() for s in specs}, "global_step": 3}
    torch.save(reference, tmp_path / "ref.ckpt")
    mine, ref = zipfile.ZipFile(tmp_path / "mine.ckpt"), zipfile.ZipFile(tmp_path / "ref.ckpt")
    records = {n.split("/", 1)[1]: ref.read(n) for n in ref.namelist()}
    assert {n.split("/", 1)[1]: mine.read(n) for n in mine.namelist()} == records
    loaded = torch.load(tmp_path / "mine.ckpt", weights_only=True, mmap=True)
    assert loaded["global_step"] == 3
    for name, value in reference["state_dict"].items():
        assert torch.equal(loaded["state_dict"][name], value) and loaded["state_dict"][name].dtype == value.dtype


def test_streamed_values_do_not_depend_on_how_they_are_gathered(tmp_path, monkeypatch):
    """Pieces smaller than a tensor (several per tensor and per seed key) give the same values streamed into a
    safetensors file as drawn whole, rearranged tensors included, and every piece of the ring is consumed
    before it is reused."""
    from safetensors.torch import load_file

    monkeypatch.setattr(tensors, "CHUNK", 1 << 19)  # 512 Ki elements: 1 MiB pieces, several per tensor
    specs = [TensorSpec("big.weight", (1000, 3000)), TensorSpec("fused.weight", (3 * 800, 1000),
                                                                  sources=("f.q", "f.k", "f.v")),
             TensorSpec("ln.weight", (3000,), "ones"), TensorSpec("conv.weight", (64, 32, 3, 3))]
    write_safetensors(tmp_path / "x.safetensors", specs, torch.bfloat16, 5)
    streamed = load_file(str(tmp_path / "x.safetensors"))
    for s in specs:
        assert torch.equal(streamed[s.name], materialize(s, torch.bfloat16, 5)), s.name
    assert header_shapes(tmp_path / "x.safetensors") == {s.name: s.shape for s in specs}
    # Meta's interleaved rows: the rearranged tensor is the drawn one's rows permuted per head
    heads, hd = 4, 8
    plain = TensorSpec("wq", (heads * hd, 16), sources=("k",))
    spun = TensorSpec("wq", (heads * hd, 16), sources=("k",), rearrange=_interleave_rows(heads))
    w, m = materialize(plain, torch.float32, 0), materialize(spun, torch.float32, 0)
    for h in range(heads):
        for p in range(hd // 2):
            for c in range(2):
                assert torch.equal(m[h * hd + 2 * p + c], w[h * hd + c * hd // 2 + p])


def _run_writer(tmp_path, *args):
    """The writer in a fresh process (its own ru_maxrss); the figures it prints as JSON."""
    out = subprocess.run([sys.executable, "-m", "spec_ar.bench.scale_checkpoints", "--out", str(tmp_path / "model"),
                          "--json", *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_streamed_safetensors_writer_memory(tmp_path):
    """Emu3 at a quarter of its size (~1 GB, embedding and head 0.38 GB each): writing the weights raises the
    writer's peak memory by a few chunks, not by a tensor, let alone by the files."""
    figures = _run_writer(tmp_path, "--family", "emu3-gen", "--scale", "0.25")
    grown = figures["peak_rss_bytes"] - figures["rss_before_weights_bytes"]
    largest = 184622 * 1024 * 2
    assert figures["bytes"] > 0.9e9
    assert grown < 160 * 2**20 < largest / 2, figures
    assert figures["peak_rss_bytes"] < figures["bytes"] / 1.5, figures


def test_torch_pickle_writer_memory(tmp_path):
    """Janus' original layout (torch pickle shards) at a quarter size, in shards of 0.2 GB: the writer's memory
    grows by about its largest tensor (the 0.2 GB embedding: a zip record is written whole), never by a shard."""
    figures = _run_writer(tmp_path, "--family", "janus-pro-7b", "--layout", "original", "--scale", "0.25",
                          "--shard-gb", "0.2")
    grown = figures["peak_rss_bytes"] - figures["rss_before_weights_bytes"]
    largest = 102400 * 1024 * 2
    assert figures["bytes"] > 0.6e9
    index = json.loads((tmp_path / "model" / "pytorch_model.bin.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 3
    assert grown < largest + 64 * 2**20, figures


def test_refusals(tmp_path):
    with pytest.raises(ValueError, match="layouts converted"):
        sc.write("emu3-gen", tmp_path / "a", "original", scale=TINY)
    with pytest.raises(ValueError, match="unknown family"):
        sc.write("janus-1b", tmp_path / "b")
    with pytest.raises(ValueError, match="scale"):
        sc.write("janus-pro-7b", tmp_path / "c", scale=2.0)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_text("")
    with pytest.raises(FileExistsError):
        sc.write("anole-7b", tmp_path / "d", scale=TINY)


def test_module_runs_as_a_script_and_documents_the_table():
    out = subprocess.run([sys.executable, "-m", "spec_ar.bench.scale_checkpoints", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0
    for name in sc.CONFIGS:
        assert name in out.stdout
    assert pathlib.Path(sc.__file__).parent.name == "scale_checkpoints"
