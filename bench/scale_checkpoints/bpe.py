"""Tokenizers built offline: byte-level BPE over the 256 byte symbols and a few merges, unreachable fillers up to
a vocabulary's real size, the special tokens at their ids."""
from __future__ import annotations

import pathlib

from .stats import Stats


def byte_symbols() -> list[str]:
    """The 256 printable stand-ins byte-level BPE uses for bytes (GPT-2's table)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


#: Qwen2's pre-tokenizer split (its tokenizer.json and the slow tokenizer's PRETOKENIZE_REGEX), GLM-Image's stand-in's
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
         r"|\s+(?!\S)|\s+")

#: merges of the small byte-level BPE (Ġ space, Ċ newline): enough that prompts merge somewhat
MERGES = [("Ċ", "Ċ"), ("Ġ", "a"), ("Ġ", "c"), ("a", "t"), ("Ġc", "at"), ("Ġ", "r"), ("e", "d"), ("Ġr", "ed"),
          ("9", "0"), ("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("o", "r")]


def word_merges(words, vocab: dict[str, int]) -> list[tuple[str, str]]:
    """The merges that build each of ``words`` letter by letter, then join each whole word to the space before it
    (``Ġ``); every token they make is added to ``vocab`` (in place) at the next id, in that order."""
    merges: list[tuple[str, str]] = []
    for word in words:
        current = word[0]
        for ch in word[1:]:
            if (current, ch) not in merges:
                merges.append((current, ch))
            current += ch
            vocab.setdefault(current, len(vocab))
    for word in words:  # after every word's own merges: a space joins whole words
        merges.append(("Ġ", word))
        vocab.setdefault("Ġ" + word, len(vocab))
    return merges


def text_vocabulary(size: int, start: int = 0, taken=()) -> dict[str, int]:
    """Byte symbols, merged tokens, then unreachable fillers: ``size`` entries with ids from ``start``."""
    vocab, taken = {}, set(taken)
    for s in byte_symbols() + [a + b for a, b in MERGES]:
        if s not in vocab:
            vocab[s] = start + len(vocab)
    while len(vocab) < size:
        name = f"ĠTOK{start + len(vocab)}"
        vocab[name if name not in taken else name + "_"] = start + len(vocab)
    return vocab


def fill_ids(vocab: dict[str, int], upto: int, pattern: str) -> dict[str, int]:
    """``vocab`` plus named fillers for every id below ``upto`` it lacks (ids must be contiguous)."""
    have = set(vocab.values())
    out = dict(vocab)
    for i in range(upto):
        if i not in have:
            out[pattern.format(i)] = i
    return dict(sorted(out.items(), key=lambda kv: kv[1]))


def bpe_tokenizer(vocab: dict[str, int], added: list[str], bos: str | None = None):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    merges = [(a, b) for a, b in MERGES if a in vocab and b in vocab and a + b in vocab]
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(a, special=True, normalized=False) for a in added])
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, vocab[bos])])
    return tok


def save_tokenizer(fast, folder: pathlib.Path, stats: Stats) -> None:
    for path in fast.save_pretrained(str(folder)):
        if pathlib.Path(path).is_file() and pathlib.Path(path) not in stats.files:
            stats.add(pathlib.Path(path))
