"""What spec-ar's commands share (``render`` in __init__.py, ``batch`` in batch.py): the decoding settings as
options, read from the knob table; ``--dtype``'s help, from the storage table; images as PNG bytes."""
from __future__ import annotations

import argparse


def decoding_options(ap: argparse.ArgumentParser):
    """One option per knob of the knob table (``--group-size``, ``--lantern-delta``, ...),
    read as text and checked by the table, so errors name the option."""
    from ..sampling.config import KNOBS, SAMPLING_FALLBACK, DecodeConfig

    group = ap.add_argument_group("decoding settings (the knob table; defaults: the mode's and the model family's)")
    defaults = DecodeConfig()
    for k in KNOBS.values():
        default = getattr(defaults, k.name)
        shown = ("the family's" if k.name in SAMPLING_FALLBACK else k.unset if default is None and k.unset
                 else "the mode's" if default is None and k.choices else "none" if default is None else default)
        group.add_argument(k.option, dest=k.name, default=None, metavar=k.symbol.upper() if not k.choices else None,
                           choices=[c for c in k.choices if c is not None] if k.choices else None,
                           help=literal(f"{k.help} ({'' if k.choices else k.range_text() + '; '}default {shown})"))


def dit_options(ap: argparse.ArgumentParser):
    """``--dit-steps``, ``--dit-guidance``, ``--dit-seed``: GLM-Image's DiT stage, from its settings table
    (``decoders/glm_dit.py``), read as text and checked there, so errors name the option."""
    from ..decoders.glm_dit import SETTINGS

    group = ap.add_argument_group("GLM-Image's DiT stage (its decoder; refused for any other model)")
    for s in SETTINGS.values():
        group.add_argument(s.option, dest=f"dit_{s.name}", default=None, metavar=s.name.upper(),
                           help=literal(f"{s.help} ({s.range_text()}; default {s.default:g})"))


def literal(text: str) -> str:
    """Help text as argparse prints it verbatim: it expands ``%`` in option help
    (``%(default)s``), so a knob help saying "11 % more" must double its ``%``."""
    return text.replace("%", "%%")


def dtype_help() -> str:
    """``--dtype``'s help, from the storage table."""
    from ..loaders.storage import AUTO_HELP, STORAGES

    return "how the weights are stored: " + "; ".join(f"{n}: {s.help}" for n, s in STORAGES.items()) + \
        f"; auto: {AUTO_HELP} (default)"


def png_bytes(image) -> bytes:
    """``[3, H, W]`` in [0, 1] -> PNG bytes."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray((image.permute(1, 2, 0).numpy() * 255).round().astype("uint8")).save(buf, format="PNG")
    return buf.getvalue()
