"""The T5 text encoder LlamaGen's text-conditional models read (flan-t5-xl).

Loaded through transformers from a local folder (``T5EncoderModel`` and its
tokenizer).  Prompts are tokenized to 120 tokens (padding to the maximum length,
truncation, special tokens), encoded, and then *left*-padded as LlamaGen's
sampler does: the valid rows move to the end and padded rows are zeroed
(FoundationVision/LlamaGen @ce98ec41, ``language/t5.py`` ``T5Embedder`` and
``autoregressive/sample/sample_t2i.py``).  The reference also runs PixArt's
caption cleaner twice (URLs, HTML, ``#``, brackets and other special characters,
dashes, quotes, numbers of 6+ digits ...); here prompts are only lower-cased and
stripped, which is what that cleaner does to plain prompts: a departure for
prompts with such characters.
"""
from __future__ import annotations

import pathlib

import torch

from ..embedded.text import left_pad  # one definition, below loaders/, for both text encoders


class T5TextEncoder:
    def __init__(self, folder: str | pathlib.Path, device="cpu", dtype=torch.float32):
        folder = pathlib.Path(folder)
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{folder}: no T5 model folder (config.json missing); expected a local copy "
                                    "of google/flan-t5-xl")
        from transformers import T5EncoderModel

        from ..formats.checkpoints import from_pretrained, tokenizer_from_pretrained

        self.tokenizer = tokenizer_from_pretrained(folder)
        model = from_pretrained(T5EncoderModel, folder, "a T5 text encoder")
        self.model = model.to(device=device, dtype=dtype).eval()
        self.device = torch.device(device)
        self.source = str(folder)

    @property
    def dim(self) -> int:
        return self.model.config.d_model

    def tokenize(self, prompts: list[str], max_length: int = 120) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids [B, max_length], mask [B, max_length])``, right-padded, as the reference tokenizes."""
        text = [p.lower().strip() for p in prompts]
        tok = self.tokenizer(text, max_length=max_length, padding="max_length", truncation=True,
                             add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
        return tok.input_ids.to(self.device), tok.attention_mask.to(self.device)

    @torch.no_grad()
    def encode(self, prompts: list[str], max_length: int = 120) -> tuple[torch.Tensor, torch.Tensor]:
        """``(features [B, max_length, d_model], mask [B, max_length])``, left-padded."""
        ids, mask = self.tokenize(prompts, max_length)
        feats = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        return left_pad(feats, mask)
