"""The shipped workflows: file name (the API format's, in ``api/``), the title users
see, and what each needs in ``models/spec_ar/``.

ComfyUI's Templates browser (frontend 1.3x) shows a pack's template under its file
name and takes the description from the same name (dashes and underscores read
as spaces), so the UI-format file is named by its title: ``<title>.json`` with its
thumbnail ``<title>.jpg`` beside it.  Titles avoid dashes and underscores for that
reason, and characters a file name cannot hold on Windows.
"""
from __future__ import annotations

EMBEDDED_NEEDS = "nothing (the embedded model ships with the pack)"

#: name -> (title, what it needs in models/spec_ar/)
CATALOG: dict[str, tuple[str, str]] = {
    "embedded_mode_comparison": ("Speculative AR demo, all five modes compared", EMBEDDED_NEEDS),
    "embedded_t2i_ar": ("Speculative AR demo, ar baseline", EMBEDDED_NEEDS),
    "embedded_t2i_sjd": ("Speculative AR demo, SJD lossless", EMBEDDED_NEEDS),
    "embedded_t2i_gsd": ("Speculative AR demo, GSD grouped acceptance", EMBEDDED_NEEDS),
    "embedded_t2i_lantern": ("Speculative AR demo, LANTERN latent neighbours", EMBEDDED_NEEDS),
    "embedded_t2i_vvs": ("Speculative AR demo, VVS skipped verifications", EMBEDDED_NEEDS),
    "embedded_prompt_list": ("Speculative AR demo, a prompt list in one run", EMBEDDED_NEEDS),
    "embedded_t2i_drafter": ("Speculative AR demo, SJD and LANTERN on a trained draft head",
                             "nothing (the embedded model and its draft head ship with the pack)"),
    "llamagen_c2i": ("LlamaGen c2i XL 384 with LANTERN", "llamagen/c2i_XL_384.pt, llamagen/vq_ds16_c2i.pt"),
    "llamagen_t2i": ("LlamaGen t2i XL 512 with VVS",
                     "llamagen/t2i_XL_stage2_512.pt, llamagen/vq_ds16_t2i.pt, flan-t5-xl/"),
    "janus_pro": ("Janus Pro 7B with GSD", "Janus-Pro-7B/ (as deepseek-ai ships it, or converted)"),
    "lumina_mgpt": ("Lumina mGPT 7B 768 with SJD", "Lumina-mGPT-7B-768/ (with tokenizer/vqgan.yaml and vqgan.ckpt)"),
    "llamagen_t2i_drafter": ("LlamaGen t2i XL 256 with LANTERN on its drafter",
                             "llamagen/t2i_XL_stage1_256.pt, llamagen/vq_ds16_t2i.pt, flan-t5-xl/, "
                             "lantern/llamagen_drafter/ (jadohu/llamagen_drafter)"),
    "anole": ("Anole 7B with LANTERN", "Anole-7b-hf/ (transformers folder, VQGAN included)"),
    "anole_drafter": ("Anole 7B with LANTERN on its drafter",
                      "Anole-7b-hf/, lantern/anole_drafter/ (jadohu/anole_drafter)"),
    "emu3": ("Emu3 Gen with GSD", "Emu3-Gen-hf/ (transformers folder, VQ-VAE included)"),
    "liquid": ("Liquid 7B with SJD", "Liquid_V1_7B/ (with Meta's VQGAN in chameleon/ or tokenizer/)"),
    "lumina_mgpt2": ("Lumina mGPT 2.0 with SJD",
                     "Lumina-mGPT-2.0/ (with movqgan_270M.ckpt in movqgan/270M/ or beside it)"),
    "simplear": ("SimpleAR 1.5B with SJD",
                 "SimpleAR-1.5B-RL/, Cosmos-1.0-Tokenizer-DV8x16x16/ beside it (its decoder.jit)"),
    "emu35": ("Emu3.5 Image with SJD",
              "Emu3.5-Image/ (with emu3.tiktoken, emu3_vision_tokens.txt and Emu3.5-VisionTokenizer/ in it, "
              "as the download puts them), loaded in int8 with offload: a 24 GB card and 48 GB of system memory"),
    "glm_image": ("GLM Image with SJD",
                  "GLM-Image/ (zai-org/GLM-Image whole: its AR stage and its DiT stage's transformer/, vae/, "
                  "text_encoder/, tokenizer/, scheduler/; the DiT needs diffusers >= 0.37)"),
}


def title(name: str) -> str:
    return CATALOG[name][0]


def embedded(name: str) -> bool:
    return name.startswith("embedded_")
