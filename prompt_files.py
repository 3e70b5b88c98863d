"""Prompt lists: one prompt (or class id) per line, from a text box or a file.

One reader for every surface that takes a list (the Prompt List node, ``spec-ar
bench``, ``spec-ar queue``, the demo): blank lines and lines starting with ``#``
are skipped, files must be UTF-8 text, and every problem is one error naming the
file.
"""
from __future__ import annotations

import pathlib


class PromptFileError(ValueError):
    """A prompt list that cannot be read or holds no prompt."""


def prompt_lines(text: str, source: str = "prompts") -> list[str]:
    """The prompts in ``text``: one per non-empty line; ``#`` starts a comment line."""
    prompts = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    if not prompts:
        raise PromptFileError(f"{source}: no prompt found (one prompt per line; lines starting with # are skipped)")
    return prompts


def read_prompts(path: str | pathlib.Path, source: str | None = None) -> list[str]:
    """The prompts of a UTF-8 text file; ``source`` names it in errors (default: the path)."""
    path = pathlib.Path(path)
    name = source or str(path)
    if not path.is_file():
        raise PromptFileError(f"{name}: {'is a folder, not a file' if path.is_dir() else 'no such file'}")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark from Windows editors is fine
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise PromptFileError(f"{name}: not UTF-8 text (byte 0x{data[err.start]:02x} on line {line}); "
                              "save the file as UTF-8") from None
    return prompt_lines(text, name)
