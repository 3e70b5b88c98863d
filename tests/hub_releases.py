"""The hub repositories (and GitHub files) of every release in ``loaders/downloads.py`` (``RELEASES``), laid out as the
real repositories lay them out, with the real file names, holding the tiny random checkpoints the
family's ``*_files.py`` / ``checkpoints.py`` write in the real formats: sharded safetensors with their
index where the release shards, the tokenizer files the repository carries, and what a download does
not take (README.md, .gitattributes, other weight formats, training leftovers).

Layouts come from the repositories' file listings (the hub's tree pages) where they could be read:
LlamaGen's, Lumina-mGPT's (the 512 px release carries no tokenizer), Lumina-mGPT 2.0's, GAIR's Anole
(``models/7b/`` and ``tokenizer/``), flan-t5-xl's, MoVQGAN's, the Cosmos tokenizers' and GLM-Image's (a
public catalog's copy of its listing).  Where a detail could not be confirmed, the layout is what the
family's conversion writes, and the builder says so.
Files a download never takes hold a stand-in of a few bytes (``STAND_IN``): only their names matter, and
the test checks that none of them is fetched.
"""
from __future__ import annotations

import json
import pathlib

from .fake_hub import GITATTRIBUTES

STAND_IN = b"a stand-in for a file the download does not take\n"


def files_of(folder: pathlib.Path) -> dict[str, bytes]:
    """Every file under ``folder``, by its path inside it."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def card(repo: str, **more: bytes) -> dict[str, bytes]:
    """What every repository has besides the model."""
    return {".gitattributes": GITATTRIBUTES, "README.md": f"---\nlicense: other\n---\n# {repo}\n".encode(), **more}


def shard(folder: pathlib.Path, shards: int, stem: str = "model") -> None:
    """``{stem}.safetensors`` (or the shards its index names) re-saved as ``shards`` files with their index, as
    ``save_pretrained`` shards: transformers' ``model``, diffusers' ``diffusion_pytorch_model``."""
    from safetensors.torch import load_file, save_file

    index = folder / f"{stem}.safetensors.index.json"
    old = ([folder / f for f in dict.fromkeys(json.loads(index.read_text())["weight_map"].values())] + [index]
           if index.is_file() else [folder / f"{stem}.safetensors"])
    sd = {k: v for f in old if f.suffix == ".safetensors" for k, v in load_file(str(f)).items()}
    for f in old:
        f.unlink()
    names = list(sd)
    weight_map, size = {}, 0
    for i in range(shards):
        part = {k: sd[k].contiguous() for k in names[i * len(names) // shards:(i + 1) * len(names) // shards]}
        file = f"{stem}-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, str(folder / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
        size += sum(t.numel() * t.element_size() for t in part.values())
    index.write_text(json.dumps({"metadata": {"total_size": size}, "weight_map": weight_map}, indent=2))


def special_tokens_map(folder: pathlib.Path) -> bytes:
    """``special_tokens_map.json`` as transformers 4 wrote it beside a tokenizer: its named specials."""
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    keys = ("bos_token", "eos_token", "unk_token", "pad_token")
    return json.dumps({k: settings[k] for k in keys if isinstance(settings.get(k), str)}, indent=2).encode()


# -- one builder per repository: {path: bytes} --------------------------------------------------
def llamagen(work: pathlib.Path) -> dict[str, bytes]:
    from .checkpoints import random_gpt, tiny_gpt_spec, write_gpt, write_vq

    gpt = write_gpt(work / "c2i.pt", random_gpt(tiny_gpt_spec("c2i"), seed=2)).read_bytes()
    vq = write_vq(work / "vq_c2i.pt").read_bytes()
    return card("FoundationVision/LlamaGen", **{f"c2i_{size}.pt": gpt for size in (
        "B_256", "B_384", "L_256", "L_384", "XL_384", "XXL_384", "3B_384")},
        **{"vq_ds16_c2i.pt": vq, "vq_ds8_c2i.pt": STAND_IN})


def llamagen_t2i(work: pathlib.Path) -> dict[str, bytes]:
    from .checkpoints import random_gpt, tiny_gpt_spec, write_gpt, write_vq

    gpt = write_gpt(work / "t2i.pt", random_gpt(tiny_gpt_spec("t2i", cond_tokens=120), seed=1)).read_bytes()
    return card("peizesun/llamagen_t2i", **{"t2i_XL_stage1_256.pt": gpt, "t2i_XL_stage2_512.pt": gpt,
                                            "vq_ds16_t2i.pt": write_vq(work / "vq_t2i.pt").read_bytes()})


def flan_t5(work: pathlib.Path) -> dict[str, bytes]:
    from .checkpoints import write_t5

    folder = write_t5(work / "flan-t5-xl")
    shard(folder, 2)
    (folder / "special_tokens_map.json").write_bytes(special_tokens_map(folder))
    (folder / "generation_config.json").write_text(json.dumps({"decoder_start_token_id": 0, "eos_token_id": 1,
                                                               "pad_token_id": 0}))
    # the other frameworks' weights and sentencepiece's model, which the loader (tokenizer.json) never reads
    others = {name: STAND_IN for name in (
        "spiece.model", "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin", "tf_model.h5",
        "flax_model-00001-of-00002.msgpack", "flax_model-00002-of-00002.msgpack")}
    others |= {"pytorch_model.bin.index.json": b'{"weight_map": {}}', "flax_model.msgpack.index.json":
               b'{"weight_map": {}}'}
    return card("google/flan-t5-xl", **files_of(folder), **others)


def janus(work: pathlib.Path, repo: str) -> dict[str, bytes]:
    """What transformers' ``convert_janus_weights_to_hf.py`` writes (the converted repositories' listing
    could not be read): config, generation config, weights (the 7B in shards), the fast tokenizer, the
    processor's files."""
    from .checkpoints import tiny_janus, write_janus

    model, tok = tiny_janus()
    folder = write_janus(work / repo.split("/")[1], model, tok)
    if repo.endswith("7B"):
        shard(folder, 3)
    (folder / "special_tokens_map.json").write_bytes(special_tokens_map(folder))
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "JanusImageProcessor", "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
        "size": {"height": 384, "width": 384}}))
    (folder / "processor_config.json").write_text(json.dumps({"num_image_tokens": 576,
                                                              "processor_class": "JanusProcessor"}))
    return card(repo, **files_of(folder))


def lumina(work: pathlib.Path) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """Lumina-mGPT-7B-512 and -768: the same tiny model; the 768 px release alone carries the tokenizer
    (the 512's holds a stray notebook checkpoint of its config)."""
    from .chameleon_files import write_lumina

    folder = write_lumina(work / "lumina", vqgan=False)
    (folder / "special_tokens_map.json").write_bytes(special_tokens_map(folder))
    everything = files_of(folder)
    tokenizer = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
    model = {k: v for k, v in everything.items() if k not in tokenizer}
    return (card("Alpha-VLLM/Lumina-mGPT-7B-512", **model, **{".ipynb_checkpoints/config-checkpoint.json":
                                                              everything["config.json"]}),
            card("Alpha-VLLM/Lumina-mGPT-7B-768", **everything))


def anole(work: pathlib.Path) -> dict[str, bytes]:
    """GAIR/Anole-7b-v0.1: Meta's layout (``models/7b/``, ``tokenizer/``) with its checklists, licence and
    training settings; Meta's VQGAN (64 codes, as every tiny family here) inside ``tokenizer/``."""
    from .chameleon_meta_files import write_meta_chameleon

    folder = write_meta_chameleon(work / "anole")
    (folder / "models" / "7b" / "consolidate_params.json").write_text("{}")
    return card("GAIR/Anole-7b-v0.1", **files_of(folder), **{
        "models/7b/checklist.chk": b"0123456789abcdef0123456789abcdef  consolidated.pth\n",
        "models/7b/config.json": STAND_IN, "tokenizer/checklist.chk": b"0123456789abcdef  vqgan.ckpt\n",
        "LICENSE.txt": b"Chameleon Research License\n", "hyperparams.yaml": b"temperature: 0.7\n"})


def emu3(work: pathlib.Path) -> dict[str, bytes]:
    """What transformers' ``convert_emu3_weights_to_hf.py`` writes (as Emu3-community/Emu3-Chat-hf, by the same
    converter, lays it out): config, generation config, weight shards and index, the byte-level BPE tokenizer
    (vocab, merges, settings, specials, and the tokenizer.json its fast tokenizer saves), the image
    processor's settings."""
    from transformers import AutoTokenizer

    from .emu3_files import write_emu3

    folder = write_emu3(work / "emu3")
    shard(folder, 4)
    AutoTokenizer.from_pretrained(str(folder)).save_pretrained(str(work / "emu3-tokenizer"))
    (folder / "tokenizer.json").write_bytes((work / "emu3-tokenizer" / "tokenizer.json").read_bytes())
    (folder / "processor_config.json").write_text(json.dumps({"processor_class": "Emu3Processor"}))
    return card("Emu3-community/Emu3-Gen-hf", **files_of(folder))


def emu35(work: pathlib.Path, repo: str) -> dict[str, bytes]:
    """BAAI/Emu3.5-Image and BAAI/Emu3.5: config, generation config, weight shards and index (the releases have
    15; the tiny one 2), no tokenizer (the authors read it from their repository) and no vision tokenizer."""
    from .emu35_files import write_emu35

    folder = write_emu35(work / repo.split("/")[1], tokenizer="none", vision=False)
    return card(repo, **files_of(folder))


def emu35_vision_tokenizer(work: pathlib.Path) -> dict[str, bytes]:
    from .emu35_files import write_vision_tokenizer

    folder = write_vision_tokenizer(work / "Emu3.5-VisionTokenizer")
    return card("BAAI/Emu3.5-VisionTokenizer", **files_of(folder))


def emu35_repository(work: pathlib.Path) -> dict[str, bytes]:
    """baaivision/Emu3.5 on GitHub: the tokenizer files in src/tokenizer_emu3_ibq/ among the authors' code."""
    from .emu35_files import write_tokenizer

    folder = work / "tokenizer_emu3_ibq"
    write_tokenizer(folder)
    return {"README.md": b"# Emu3.5\n", "inference.py": STAND_IN, "src/tokenizer_emu3_ibq/tokenization_emu3.py": STAND_IN,
            **{f"src/tokenizer_emu3_ibq/{k}": v for k, v in files_of(folder).items()}}


def pinned_to(release, repos: dict[str, dict[str, bytes]]):
    """``release`` with its pinned files' sizes and hashes those of the tiny files in ``repos`` (the real ones
    pin the authors' files, which a test cannot serve)."""
    from dataclasses import replace

    from spec_ar.loaders.downloads import Pinned, PinnedFile

    from .fake_hub import git_blob_sha1

    def repin(source):
        if not isinstance(source, Pinned):
            return source
        files = repos[source.repo]
        return replace(source, files=tuple(PinnedFile(f.path, len(files[f.path]), git_blob_sha1(files[f.path]))
                                           for f in source.files))

    return replace(release, sources=tuple(repin(s) for s in release.sources))


def liquid(work: pathlib.Path) -> dict[str, bytes]:
    """Junfeng5/Liquid_V1_7B, a trainer's output folder: Gemma's tokenizer (tokenizer.json, and
    sentencepiece's tokenizer.model no loader here reads), the trainer's state and arguments."""
    from .liquid_files import write_liquid

    folder = write_liquid(work / "liquid", vqgan=False)
    return card("Junfeng5/Liquid_V1_7B", **files_of(folder), **{
        "tokenizer.model": STAND_IN, "trainer_state.json": b'{"global_step": 1}', "training_args.bin": STAND_IN})


def lumina2(work: pathlib.Path) -> dict[str, bytes]:
    from .lumina2_files import write_lumina2

    folder = write_lumina2(work / "lumina2", movqgan=False)
    return card("Alpha-VLLM/Lumina-mGPT-2.0", **files_of(folder), **{"args.json": b'{"lr": 0.0002}'})


def movqgan(work: pathlib.Path) -> dict[str, bytes]:
    from dataclasses import replace

    from .lumina2_files import CODES
    from .movqgan_files import SPEC, write_movqgan

    ckpt = write_movqgan(work / "movqgan_270M.ckpt", 0, replace(SPEC, n_embed=CODES)).read_bytes()
    return card("ai-forever/MoVQGAN", **{"movqgan_270M.ckpt": ckpt, "movqgan_102M.ckpt": STAND_IN,
                                         "movqgan_67M.ckpt": STAND_IN})


def simplear(work: pathlib.Path, repo: str) -> dict[str, bytes]:
    """A SimpleAR release as its Qwen2.5 trainer saves it (the listing could not be read): config, generation
    config, weight shards and index, the tokenizer both ways (tokenizer.json; vocab.json, merges.txt)."""
    from .simplear_files import write_simplear

    folder = write_simplear(work / repo.split("/")[1], decoder=False)
    return card(repo, **files_of(folder))


def cosmos(work: pathlib.Path) -> dict[str, bytes]:
    from .cosmos_files import write_cosmos_decoder

    decoder = write_cosmos_decoder(work / "cosmos").read_bytes()
    return card("nvidia/Cosmos-1.0-Tokenizer-DV8x16x16", **{
        "decoder.jit": decoder, "encoder.jit": STAND_IN, "autoencoder.jit": STAND_IN,
        "config.json": b'{"model_type": "cosmos_tokenizer"}', "model_config.yaml": b"name: DV8x16x16\n"})


def lantern(work: pathlib.Path, repo: str) -> dict[str, bytes]:
    from .checkpoints import write_lantern_anole_head, write_lantern_head

    folder = work / repo.split("/")[1]
    if repo.endswith("anole_drafter"):
        write_lantern_anole_head(folder)
    else:
        write_lantern_head(folder, hidden=128, heads=2, vocab=1024)
    return card(repo, **files_of(folder))


def glm_image(work: pathlib.Path) -> dict[str, bytes]:
    """zai-org/GLM-Image, a diffusers folder, as the hub lists it (a public catalog's copy of the repository's file
    list, ``GLM_IMAGE_DIFFUSERS_FILES``; ``model_index.json``, ``vision_language_encoder/config.json`` and
    ``processor/preprocessor_config.json`` read on the hub): the AR model's weights in 4 shards with their index, the
    DiT's in 3 (diffusers' names), the VAE and the ByT5 encoder in one file each; ``processor/`` with
    ``chat_template.jinja`` and the image processor's settings in ``preprocessor_config.json`` (no
    ``processor_config.json``); ``tokenizer/`` with ``special_tokens_map.json`` and ``added_tokens.json``.  The tiny
    model is :func:`write_glm_image`'s, re-sharded and re-saved so.  Not confirmed: the contents of the processor's
    and tokenizer's settings beyond their names (transformers' own save of the tiny processor and ByT5 tokenizer),
    and whether the hub carries more than the listing (it lists no pickled weights: the VAE's
    ``diffusion_pytorch_model.bin`` here is a stand-in, to show a download never takes pickled weights)."""
    from .glm_image_files import write_glm_image

    folder = write_glm_image(work / "GLM-Image", dit_stage=True)
    shard(folder / "vision_language_encoder", 4)
    shard(folder / "transformer", 3, "diffusion_pytorch_model")
    processor = folder / "processor"
    settings = json.loads((processor / "processor_config.json").read_text())
    (processor / "preprocessor_config.json").write_text(json.dumps(
        {**settings.pop("image_processor"), "processor_class": settings.pop("processor_class")}, indent=2))
    assert not settings, settings  # nothing else of the processor's is lost with its file
    (processor / "processor_config.json").unlink()
    (folder / "tokenizer" / "special_tokens_map.json").write_bytes(special_tokens_map(folder / "tokenizer"))
    return card("zai-org/GLM-Image", **files_of(folder), **{"vae/diffusion_pytorch_model.bin": STAND_IN})


def repos_for(name: str, work: pathlib.Path) -> dict[str, dict[str, bytes]]:
    """The repositories release ``name`` takes files from, as the hub serves them."""
    from spec_ar.loaders.downloads import RELEASES

    work.mkdir(parents=True, exist_ok=True)
    out = {}
    for source in RELEASES[name].sources:
        repo = source.repo
        if repo in out:
            continue
        if repo == "FoundationVision/LlamaGen":
            out[repo] = llamagen(work)
        elif repo == "peizesun/llamagen_t2i":
            out[repo] = llamagen_t2i(work)
        elif repo == "google/flan-t5-xl":
            out[repo] = flan_t5(work)
        elif repo.startswith("deepseek-community/"):
            out[repo] = janus(work, repo)
        elif repo.startswith("Alpha-VLLM/Lumina-mGPT-7B"):
            out.update(zip(("Alpha-VLLM/Lumina-mGPT-7B-512", "Alpha-VLLM/Lumina-mGPT-7B-768"), lumina(work)))
        elif repo == "GAIR/Anole-7b-v0.1":
            out[repo] = anole(work)
        elif repo == "Emu3-community/Emu3-Gen-hf":
            out[repo] = emu3(work)
        elif repo in ("BAAI/Emu3.5-Image", "BAAI/Emu3.5"):
            out[repo] = emu35(work, repo)
        elif repo == "BAAI/Emu3.5-VisionTokenizer":
            out[repo] = emu35_vision_tokenizer(work)
        elif repo == "github.com/baaivision/Emu3.5":
            out[repo] = emu35_repository(work)
        elif repo == "Junfeng5/Liquid_V1_7B":
            out[repo] = liquid(work)
        elif repo == "Alpha-VLLM/Lumina-mGPT-2.0":
            out[repo] = lumina2(work)
        elif repo == "ai-forever/MoVQGAN":
            out[repo] = movqgan(work)
        elif repo.startswith("Daniel0724/"):
            out[repo] = simplear(work, repo)
        elif repo == "nvidia/Cosmos-1.0-Tokenizer-DV8x16x16":
            out[repo] = cosmos(work)
        elif repo == "zai-org/GLM-Image":
            out[repo] = glm_image(work)
        elif repo.startswith("jadohu/"):
            out[repo] = lantern(work, repo)
        else:
            raise KeyError(f"no hub layout for {repo}: add one to tests/hub_releases.py")
    return out
