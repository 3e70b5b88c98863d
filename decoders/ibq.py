"""The IBQ vision tokenizer of Emu3.5 (``BAAI/Emu3.5-VisionTokenizer``): codes -> images.

Released as a folder of two files, the layout the authors' ``build_vision_tokenizer("ibq", path)``
(baaivision/Emu3.5, ``src/vision_tokenizer/__init__.py``) reads:

* ``config.yaml``: the keyword arguments of their ``IBQ`` class at the top level, ``ddconfig`` (taming's
  encoder/decoder settings: ``ch``, ``ch_mult``, ``num_res_blocks``, ``attn_resolutions``, ``resolution``,
  ``z_channels``, ``out_ch``, ...), ``n_embed`` and ``embed_dim`` (131,072 codes of 256 values; ``ch_mult``
  of five levels: 16x downsampling), beside training settings (``beta``, entropy-loss weights) that decoding
  never reads;
* ``model.ckpt``: a torch pickle, the IBQ module's state dict either as is or in a Lightning checkpoint's
  ``state_dict`` entry (the authors' loader takes either); read here with ``weights_only`` only.

Read from the checkpoint: the decoding half only, ``quantize.embedding.weight`` (the codebook, used as is:
no normalisation), ``post_quant_conv.*`` and ``decoder.*``; ``encoder.*`` and ``quant_conv.*`` are not
read.  A checkpoint lacking a decoder-side tensor, carrying one the configuration does not describe, or
with a shape the configuration contradicts is refused by name before any weight is placed.  The decoder
is taming-transformers' ``Decoder``, the same code as Meta's Chameleon VQGAN, so it is built from
``vqgan.Decoder`` (on ``blocks.py``'s layers); decoding is the authors' ``IBQ.decode_code``: code vectors
``[B, embed_dim, h, w]`` -> ``post_quant_conv`` -> decoder -> pixels in about [-1, 1], which
:class:`~.blocks.CodebookDecoder` puts in [0, 1] as for the other decoders.  Configuration fields that would
change decoding and that this design does not build (``resamp_with_conv: false``, ``give_pre_end: true``)
are refused by name.

For the Emu3.5 loader (the model folder is ``BAAI/Emu3.5-Image`` or ``BAAI/Emu3.5``; the authors' configs
read the tokenizer from its own download, ``vq_path``):

* ``find_ibq(folder, vq=None)``: the tokenizer to load, or None.  ``vq`` given (a tokenizer folder, or its
  ``config.yaml`` or ``model.ckpt``) is used as given; otherwise it is looked for inside the model folder
  and beside it, first under the names in ``FOLDER_NAMES`` (``Emu3.5-VisionTokenizer/`` ...), then any
  folder there holding ``config.yaml`` + ``model.ckpt`` whose yaml is an IBQ configuration, then the model
  folder itself;
* ``IBQDecoder.load(path, device="cpu", dtype=torch.float32)``: ``path`` is what ``find_ibq`` returns;
  the loaded decoder has ``decode(codes [B, rows, cols]) -> [B, 3, 16 rows, 16 cols]`` float32 in [0, 1],
  ``codebook()``, ``bytes_per_image(grid)`` and ``spec.n_embed`` (to check the model's image-token range);
* ``IBQSpec.from_yaml(path)``: the architecture alone (``n_embed``, ``downsample``) without reading weights.
"""
from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass

import torch
from torch import nn

from ..formats.checkpoints import CheckpointError, load_file, state_dict
from .blocks import CodebookDecoder, LevelledSpec, key_problems
from .vqgan import Decoder

CONFIG_NAME, CKPT_NAME = "config.yaml", "model.ckpt"
#: folder names the tokenizer is looked for under first, inside the model folder and beside it (the hub
#: repo's name first); a folder of another name is taken by its contents
FOLDER_NAMES = ("Emu3.5-VisionTokenizer", "VisionTokenizer", "vision_tokenizer")
#: the checkpoint's tensors that decoding reads (prefixes); the rest (encoder, quant_conv) are not read
DECODER_SIDE = ("quantize.embedding.", "post_quant_conv.", "decoder.")


@dataclass(frozen=True)
class IBQSpec(LevelledSpec):
    """The architecture, as ``config.yaml`` writes it (defaults: the release's values as far as known)."""

    n_embed: int = 131072
    embed_dim: int = 256
    z_channels: int = 256
    ch: int = 256
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)  # per level, full resolution first; 2 ** (levels - 1) = 16x
    num_res_blocks: int = 4  # encoder blocks per level; the decoder has one more
    attn_resolutions: tuple[int, ...] = (16,)  # feature-map sides (of a ``resolution`` input) that attend
    resolution: int = 256
    out_ch: int = 3
    dropout: float = 0.0

    @classmethod
    def from_config(cls, cfg, source: str = CONFIG_NAME) -> "IBQSpec":
        """From the parsed yaml: ``IBQ(**cfg)``'s arguments (``ddconfig``, ``n_embed``, ``embed_dim``, ...)."""
        dd = cfg.get("ddconfig") if isinstance(cfg, dict) else None
        if not isinstance(dd, dict):
            raise CheckpointError(f"{source}: not an IBQ tokenizer configuration (no ddconfig mapping at the top "
                                  "level, as BAAI/Emu3.5-VisionTokenizer's config.yaml has)")

        def get(where: dict, key: str, prefix: str, kind=int, default=None):
            if key not in where:
                if default is not None:
                    return default
                raise CheckpointError(f"{source}: missing {prefix}{key}")
            value = where[key]
            try:
                if kind is tuple:
                    if isinstance(value, (str, bytes)) or any(isinstance(v, bool) for v in value):
                        raise TypeError
                    return tuple(int(v) for v in value or ())
                if isinstance(value, bool) or (kind is int and isinstance(value, float) and value != int(value)):
                    raise TypeError
                return kind(value)
            except (TypeError, ValueError):
                raise CheckpointError(f"{source}: bad {prefix}{key}: {value!r}") from None

        if dd.get("resamp_with_conv", True) is not True:
            raise CheckpointError(f"{source}: ddconfig.resamp_with_conv is {dd['resamp_with_conv']!r}: upsampling "
                                  "without its convolution is not supported (the release upsamples with one)")
        if dd.get("give_pre_end", False) is not False:
            raise CheckpointError(f"{source}: ddconfig.give_pre_end is {dd['give_pre_end']!r}: a decoder that stops "
                                  "before its output layers makes no pixels, which is not supported")
        spec = cls(n_embed=get(cfg, "n_embed", ""), embed_dim=get(cfg, "embed_dim", ""),
                   z_channels=get(dd, "z_channels", "ddconfig."), ch=get(dd, "ch", "ddconfig."),
                   # the authors' Decoder's own default, where the yaml leaves it out
                   ch_mult=get(dd, "ch_mult", "ddconfig.", tuple, default=(1, 2, 4, 8)),
                   num_res_blocks=get(dd, "num_res_blocks", "ddconfig."),
                   attn_resolutions=get(dd, "attn_resolutions", "ddconfig.", tuple),
                   resolution=get(dd, "resolution", "ddconfig."), out_ch=get(dd, "out_ch", "ddconfig."),
                   dropout=get(dd, "dropout", "ddconfig.", float, default=0.0))
        sizes = {"n_embed": spec.n_embed, "embed_dim": spec.embed_dim, "ddconfig.z_channels": spec.z_channels,
                 "ddconfig.ch": spec.ch, "ddconfig.resolution": spec.resolution, "ddconfig.out_ch": spec.out_ch}
        bad = [f"{k} is {v}" for k, v in sizes.items() if v < 1]
        if not spec.ch_mult or min(spec.ch_mult) < 1:
            bad.append(f"ddconfig.ch_mult is {list(spec.ch_mult)}")
        if spec.num_res_blocks < 0:
            bad.append(f"ddconfig.num_res_blocks is {spec.num_res_blocks}")
        widths = sorted({spec.ch * m for m in spec.ch_mult if (spec.ch * m) % 32})
        if widths:
            bad.append(f"channel widths {widths} (ddconfig.ch x ch_mult) are not multiples of 32, which the "
                       "decoder's group norms need")
        if bad:
            raise CheckpointError(f"{source}: not a buildable IBQ decoder: " + "; ".join(bad))
        return spec

    @classmethod
    def from_yaml(cls, path: str | pathlib.Path) -> "IBQSpec":
        return cls.from_config(read_yaml(path), str(path))


def read_yaml(path: str | pathlib.Path):
    """The parsed yaml in ``path`` (plain data only: ``safe_load`` builds no Python object)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    import yaml  # PyYAML: transformers needs it, and every ComfyUI has it

    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (ValueError, yaml.YAMLError) as err:  # UnicodeDecodeError is a ValueError
        first = " ".join(str(err).split())[:200]
        raise CheckpointError(f"{path}: cannot be parsed as yaml ({first})") from None


class IBQModel(nn.Module):
    """The decoding half of the authors' ``IBQ`` (module names as the checkpoint's keys)."""

    def __init__(self, spec: IBQSpec):
        super().__init__()
        self.spec = spec
        self.quantize = nn.Module()  # IndexPropagationQuantize: at decoding, its embedding alone
        self.quantize.embedding = nn.Embedding(spec.n_embed, spec.embed_dim)
        self.post_quant_conv = nn.Conv2d(spec.embed_dim, spec.z_channels, 1)
        self.decoder = Decoder(spec)  # taming's, as vqgan.py builds it from the same fields

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[B, h, w]`` -> pixels ``[B, out_ch, 16h, 16w]`` in about [-1, 1] (``IBQ.decode_code``)."""
        z = self.quantize.embedding(codes).permute(0, 3, 1, 2).contiguous()
        return self.decoder(self.post_quant_conv(z))


# -- finding and loading -------------------------------------------------------------
def _is_release(d: pathlib.Path) -> bool:
    return (d / CONFIG_NAME).is_file() and (d / CKPT_NAME).is_file()


def _is_ibq_release(d: pathlib.Path) -> bool:
    """``d`` holds both files and its yaml is an IBQ configuration (read, never trusted further)."""
    if not _is_release(d):
        return False
    try:
        cfg = read_yaml(d / CONFIG_NAME)
    except CheckpointError:
        return False
    return isinstance(cfg, dict) and isinstance(cfg.get("ddconfig"), dict) and "n_embed" in cfg


def find_ibq(folder: str | pathlib.Path, vq: str | pathlib.Path | None = None) -> pathlib.Path | None:
    """The IBQ tokenizer for the model in ``folder``: ``vq`` if given (a file is returned as is; a folder if
    it, or one of ``FOLDER_NAMES`` in it, holds ``config.yaml`` + ``model.ckpt``); otherwise, inside the
    model folder then beside it, a folder of ``FOLDER_NAMES``, then any folder there holding an IBQ release,
    then the model folder itself.  None when there is none."""
    if vq:
        vq = pathlib.Path(vq)
        if vq.is_file():
            return vq
        return next((d for d in (vq, *(vq / name for name in FOLDER_NAMES)) if _is_release(d)), None)
    folder = pathlib.Path(folder)
    bases = (folder, folder.parent) if folder.is_dir() else (folder.parent,)
    for base in bases:
        for d in (base / name for name in FOLDER_NAMES):
            if _is_release(d):
                return d
    for base in bases:
        try:
            others = sorted(d for d in base.iterdir() if d.is_dir() and d != folder)
        except OSError:
            continue
        for d in others:
            if _is_ibq_release(d):
                return d
    return folder if folder.is_dir() and _is_release(folder) else None


def release_files(path: str | pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """``(config.yaml, model.ckpt)`` of a tokenizer folder, or of either file (the other one beside it)."""
    path = pathlib.Path(path)
    if path.is_dir():
        config, ckpt = path / CONFIG_NAME, path / CKPT_NAME
    elif path.suffix in (".yaml", ".yml"):
        config, ckpt = path, path.with_name(CKPT_NAME)
    else:
        config, ckpt = path.with_name(CONFIG_NAME), path
    missing = [p.name for p in (config, ckpt) if not p.is_file()]
    if missing:
        where = path if path.is_dir() else path.parent
        raise CheckpointError(f"{where}: no {' and no '.join(missing)} here: Emu3.5's vision tokenizer "
                              f"(BAAI/Emu3.5-VisionTokenizer) is the folder holding {CONFIG_NAME} and {CKPT_NAME}")
    return config, ckpt


def _problems(spec: IBQSpec, sd: dict[str, torch.Tensor], expected: dict[str, torch.Size]) -> list[str]:
    """Why the decoder-side tensors do not fit the configuration's architecture (empty if they do)."""
    named = [("n_embed", spec.n_embed, "quantize.embedding.weight", 0),
             ("embed_dim", spec.embed_dim, "quantize.embedding.weight", 1),
             ("embed_dim", spec.embed_dim, "post_quant_conv.weight", 1),
             ("ddconfig.z_channels", spec.z_channels, "post_quant_conv.weight", 0),
             ("ddconfig.z_channels", spec.z_channels, "decoder.conv_in.weight", 1),
             ("ddconfig.ch x ch_mult[-1]", spec.ch * spec.ch_mult[-1], "decoder.conv_in.weight", 0),
             ("ddconfig.ch x ch_mult[0]", spec.ch * spec.ch_mult[0], "decoder.conv_out.weight", 1),
             ("ddconfig.out_ch", spec.out_ch, "decoder.conv_out.weight", 0)]
    problems = [f"{name} is {value} in the configuration but {key} is {list(sd[key].shape)}"
                for name, value, key, dim in named
                if key in sd and (sd[key].dim() <= dim or sd[key].shape[dim] != value)]
    levels = {int(m.group(1)) for k in sd if (m := re.match(r"decoder\.up\.(\d+)\.", k))}
    if levels and len(levels) != len(spec.ch_mult):
        problems.append(f"ddconfig.ch_mult has {len(spec.ch_mult)} levels but the decoder has {len(levels)}")
    blocks = {int(m.group(1)) for k in sd if (m := re.match(r"decoder\.up\.0\.block\.(\d+)\.", k))}
    if blocks and len(blocks) != spec.num_res_blocks + 1:
        problems.append(f"ddconfig.num_res_blocks is {spec.num_res_blocks} but the decoder has {len(blocks)} blocks "
                        "per level (num_res_blocks + 1)")
    return problems or key_problems(sd, expected, "not in the configured architecture")  # the sizes explain the rest


class IBQDecoder(CodebookDecoder):
    """A loaded IBQ tokenizer (its decoding half): codes -> images, plus its codebook for the engine."""

    @classmethod
    def load(cls, path: str | pathlib.Path, device="cpu", dtype=torch.float32) -> "IBQDecoder":
        """From the tokenizer folder (``config.yaml`` + ``model.ckpt``), or either file of it."""
        config, ckpt = release_files(path)
        spec = IBQSpec.from_yaml(config)  # a bad configuration is refused before the checkpoint is read
        try:
            sd = state_dict(load_file(ckpt), wrappers=("state_dict",))
        except CheckpointError as err:
            raise err if str(ckpt) in str(err) else CheckpointError(f"{ckpt}: {err}") from None
        return cls.from_state_dict(sd, spec, device, dtype, source=str(ckpt), config_source=str(config))

    @classmethod
    def from_state_dict(cls, sd: dict[str, torch.Tensor], spec: IBQSpec, device="cpu", dtype=torch.float32,
                        source: str = "the checkpoint", config_source: str = CONFIG_NAME) -> "IBQDecoder":
        need = ("quantize.embedding.weight", "post_quant_conv.weight", "decoder.conv_in.weight",
                "decoder.conv_out.weight")
        missing = [k for k in need if k not in sd]
        if missing:
            raise CheckpointError(f"{source}: not an IBQ tokenizer checkpoint (no {', '.join(missing)}; its "
                                  f"decoder-side tensors are {', '.join(p + '*' for p in DECODER_SIDE)})")
        weights = {k: v for k, v in sd.items() if k.startswith(DECODER_SIDE)}
        with torch.device("meta"):  # the expected names and shapes, without allocating
            model = IBQModel(spec)
        expected = {k: v.shape for k, v in model.state_dict().items()}
        problems = _problems(spec, weights, expected)
        if problems:
            raise CheckpointError(f"{source}: the decoder's tensors do not match {config_source}: "
                                  + "; ".join(problems))
        # memory for the weights allocated once, in the wanted dtype and place (no initialisation, no float32
        # copy on the way to bfloat16), then filled from the file
        model = model.to(dtype=dtype).to_empty(device=device)
        model.load_state_dict(weights, strict=True)
        return cls(model.eval(), source)
