"""A release's ``generation_config.json``, for a family whose authors generate through transformers' ``generate``
with the model's own generation configuration (SimpleAR's ``generate_visual``).

``from_pretrained`` loads the file (``config.json``'s generation fields without one) as the model's
``generation_config``, and ``generate`` applies every field its caller does not pass itself.  Per field, this
module says what the authors' call then does and whether the pack does the same:

* **applied**: ``repetition_penalty``, as transformers' ``RepetitionPenaltyLogitsProcessor``
  (:class:`RepetitionPenalty`); ``pad_token_id``, where ``generate`` infers an attention mask from it (a prompt
  position holding it is masked unless it is an end id): the adapter leaves such positions out of the
  conditional prompt;
* **overridden**: what the authors pass themselves (SimpleAR's ``generate.py``: ``do_sample``, ``temperature``,
  ``top_k``, ``top_p``, ``max_new_tokens`` and so ``max_length``, ``use_cache``);
* **without effect here**: fields whose processors touch text ids only (``min_length``, ``min_new_tokens`` and
  ``exponential_decay_length_penalty`` the end ids; ``encoder_repetition_penalty`` and
  ``encoder_no_repeat_ngram_size`` the prompt's ids; ``bad_words_ids``, ``suppress_tokens`` and
  ``begin_suppress_tokens`` naming text ids only), which the grammar masks in every image position; fields that
  never act in this call (``forced_bos_token_id``: only at sequence length 1; ``penalty_alpha``: greedy search
  only; ``renormalize_logits``: the same distribution; ``remove_invalid_values``: finite logits are left as they
  are, and a non-finite one stops the pack's decoding with an error naming it); and the end ids themselves (text
  ids, never drawn here);
* **refused** (:class:`~..formats.checkpoints.CheckpointError` at load time, naming the file, the field and its
  value): every other field that would change the authors' image tokens (:data:`REFUSED`), a processor naming an
  image id, and a ``repetition_penalty`` transformers itself would refuse.

Facts from transformers 4.47.1 (SimpleAR's pin: ``generation/utils.py`` ``_prepare_generation_config``,
``_prepare_special_tokens``, ``_prepare_attention_mask_for_generation``, ``_get_logits_processor``;
``generation/logits_process.py``).
"""
from __future__ import annotations

import pathlib
from dataclasses import dataclass

import torch

from ..formats.checkpoints import CheckpointError, read_json

#: field -> (when ``generate`` acts on it, what it then does to the image tokens); refused when set so
REFUSED = {
    "guidance_scale": (lambda v: v is not None and v != 1, "adds transformers' own classifier-free guidance on top "
                       "of the authors' (with no unconditional prompt)"),
    "sequence_bias": (lambda v: bool(v), "biases the ids it names wherever their prefix matches"),
    "no_repeat_ngram_size": (lambda v: bool(v) and v > 0, "bans every image token that would repeat an n-gram"),
    "forced_eos_token_id": (lambda v: v is not None, "forces an end id in place of the last image token"),
    "min_p": (lambda v: v is not None, "cuts tokens below min_p times the top probability"),
    "typical_p": (lambda v: v is not None and v < 1.0, "keeps the locally typical tokens only"),
    "epsilon_cutoff": (lambda v: v is not None and 0.0 < v < 1.0, "cuts tokens below the epsilon"),
    "eta_cutoff": (lambda v: v is not None and 0.0 < v < 1.0, "cuts tokens below the eta threshold"),
    "num_beams": (lambda v: v is not None and v > 1, "samples with beam search"),
    "num_beam_groups": (lambda v: v is not None and v > 1, "runs group beam search"),
    "dola_layers": (lambda v: v is not None, "decodes by contrasting layers (DoLa)"),
    "prompt_lookup_num_tokens": (lambda v: v is not None, "runs assisted (prompt lookup) decoding"),
    "watermarking_config": (lambda v: v is not None, "watermarks the logits"),
    "forced_decoder_ids": (lambda v: v is not None, "makes transformers' generate raise"),
    "constraints": (lambda v: v is not None, "runs constrained beam search"),
    "force_words_ids": (lambda v: v is not None, "runs constrained beam search"),
    "stop_strings": (lambda v: v is not None, "makes transformers' generate raise (no tokenizer is passed)"),
    "token_healing": (lambda v: bool(v), "makes transformers' generate raise (no tokenizer is passed)"),
    "max_time": (lambda v: v is not None, "stops the image after that many seconds"),
}
#: processors whose ids are listed in the field: no effect while they name text ids only
ID_LISTS = ("bad_words_ids", "suppress_tokens", "begin_suppress_tokens")


@dataclass(frozen=True)
class ReleaseGeneration:
    """What a release's generation configuration makes the authors' ``generate`` do that the pack must too."""

    repetition_penalty: float = 1.0  # 1: none
    masked: int | None = None  # a pad id generate masks out of the prompt (not an end id), or None
    source: str = ""  # the file read ("" without one)


def _ints(value) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [i for v in value for i in _ints(v)]
    return []


def release_generation(folder: pathlib.Path, text_ids: int, script: str,
                       explicit: tuple[str, ...]) -> ReleaseGeneration:
    """The release's generation settings as the authors' ``generate`` call applies them (``script``: that call,
    for messages; ``explicit``: the fields it passes itself, whose release values are overridden); raises
    :class:`CheckpointError` for a field the pack does not apply.  ``text_ids``: ids below it are text (masked in
    every image position), the others image tokens."""
    path = folder / "generation_config.json"
    if not path.is_file():
        path = folder / "config.json"  # from_pretrained builds the generation configuration from it
    if not path.is_file():
        return ReleaseGeneration()
    settings = {k: v for k, v in read_json(path).items() if k not in explicit}

    def refuse(field: str, why: str):
        raise CheckpointError(
            f"{path}: {field} {settings.get(field)!r}: with it {script}, through transformers' generate, {why}, "
            f"which this pack does not do: remove {field} from {path.name} to load the model (the authors' "
            "generate then does without it too)")

    for field, (acts, what) in REFUSED.items():
        try:
            active = acts(settings.get(field))
        except TypeError:  # not a number where one belongs
            raise CheckpointError(f"{path}: {field} {settings.get(field)!r} is not a number: fix or remove it "
                                  "(transformers' generate cannot read it either)") from None
        if active:
            refuse(field, what)
    for field in ID_LISTS:
        images = [i for i in _ints(settings.get(field)) if i >= text_ids]
        if images:
            refuse(field, f"bans image token {images[0]} (ids from {text_ids} on are image tokens)")
    eos = _ints(settings.get("eos_token_id"))
    images = [i for i in eos if i >= text_ids]
    if images:
        refuse("eos_token_id", f"ends the image at image token {images[0]}")

    penalty = settings.get("repetition_penalty")
    if penalty is None or (isinstance(penalty, (int, float)) and not isinstance(penalty, bool) and penalty == 1.0):
        penalty = 1.0
    elif not isinstance(penalty, float) or not penalty > 0:  # RepetitionPenaltyLogitsProcessor's own check
        raise CheckpointError(f"{path}: repetition_penalty {penalty!r}: transformers' generate (called by {script}) "
                              "refuses it: it must be a float above 0, written with a decimal point (1.0: none; "
                              "Qwen2.5-Instruct ships 1.1)")
    return ReleaseGeneration(float(penalty), _masked_pad(settings, eos), str(path))


def _masked_pad(settings: dict, ends) -> int | None:
    """The pad id ``generate`` masks out of a prompt: an id that is none of the end ids ``ends``."""
    pad = settings.get("pad_token_id")
    return pad if isinstance(pad, int) and not isinstance(pad, bool) and pad not in ends else None


class RepetitionPenalty:
    """transformers' ``RepetitionPenaltyLogitsProcessor`` as the authors' ``generate`` applies it with a custom
    guidance processor after it: to the *conditional* branch's raw logits, before guidance, temperature and
    top-k/top-p, over every id of that branch's input so far (the prompt, then the image tokens), each seen id's
    logit divided by the penalty where positive, multiplied by it where negative (once, however often it
    appears).  The unconditional branch is scored by the guidance processor's own forwards: no penalty.

    An adapter keeps it beside its KV cache: :meth:`start` with the prompt rows, :meth:`window` / :meth:`tree` on
    each forward's conditional logits (every scored row gets the penalty of its own prefix: the cache, then the
    window tokens up to and including its own, or its ancestors in a tree: exactly the ids sequential decoding
    would have fed at that position), then :meth:`cached`, :meth:`rollback` and :meth:`keep_tree` as the cache
    changes.  Logits may be a column range of the vocabulary (``offset``: the id of column 0)."""

    def __init__(self, penalty: float):
        self.penalty = float(penalty)
        self.prompt: torch.Tensor | None = None  # [B, S] the conditional prompts' ids, -1 at padding
        self.log: torch.Tensor | None = None  # [B, capacity + 1] ids cached after the prompt (last column: a dump)
        #: the log's length per sample, on the host and on the logits' device (kept apart: reading one from the
        #: other would wait for the forward in flight)
        self.lengths: list[int] = []
        self.device_lengths: torch.Tensor | None = None
        self.tree_tokens: torch.Tensor | None = None

    def start(self, ids: torch.Tensor, valid: torch.Tensor) -> None:
        """A new prefill: ``ids`` ``[B, S]`` the conditional rows, ``valid`` where they hold a real token."""
        self.prompt = torch.where(valid.bool(), ids, -1)
        self.log = ids.new_full((ids.shape[0], 257), -1)
        self.lengths = [0] * ids.shape[0]
        self.device_lengths = torch.zeros(ids.shape[0], dtype=torch.long, device=ids.device)
        self.tree_tokens = None

    # -- the cache --------------------------------------------------------------------------------
    def cached(self, tokens: torch.Tensor, counts: list[int] | None = None) -> None:
        """``tokens[b, :counts[b]]`` (all of them by default) joined sample ``b``'s cache."""
        B, M = tokens.shape
        host = [M] * B if counts is None else list(counts)
        need = max(n + c for n, c in zip(self.lengths, host))
        if need >= self.log.shape[1]:
            grown = self.log.new_full((B, 2 * need + 1), -1)
            grown[:, : self.log.shape[1] - 1] = self.log[:, :-1]
            self.log = grown
        device = self.log.device
        k = torch.arange(M, device=device).unsqueeze(0)
        at = self.device_lengths.unsqueeze(1) + k
        if counts is None:
            self.device_lengths = self.device_lengths + M
        else:  # after the engine's synchronisation: host integers cost no wait
            counts = torch.tensor(host, device=device)
            dump = self.log.shape[1] - 1
            at = torch.where(k < counts.unsqueeze(1), at, dump)
            self.device_lengths = self.device_lengths + counts
        self.log.scatter_(1, at, tokens.to(device))
        self.log[:, -1] = -1
        self.lengths = [n + c for n, c in zip(self.lengths, host)]

    def rollback(self, n: list[int] | torch.Tensor) -> None:
        """``n`` host integers, or a device tensor the host has not read (the engine's step on the
        device): then ``lengths`` stay upper bounds (the log grows by them) until :meth:`sync`."""
        if isinstance(n, torch.Tensor):
            self.device_lengths = self.device_lengths - n.to(self.device_lengths.device)
            return
        self.lengths = [length - k for length, k in zip(self.lengths, n)]
        self.device_lengths = self.device_lengths - torch.tensor(list(n), device=self.device_lengths.device)

    def keep(self, keep: list[int]) -> None:
        """Only samples ``keep`` stay (images leaving the batch)."""
        self.prompt = self.prompt[torch.tensor(keep, device=self.prompt.device)]
        self.log = self.log[torch.tensor(keep, device=self.log.device)]
        self.device_lengths = self.device_lengths[torch.tensor(keep, device=self.device_lengths.device)]
        self.lengths = [self.lengths[b] for b in keep]

    def sync(self) -> None:
        """``lengths`` exact again (one host read)."""
        self.lengths = self.device_lengths.tolist()

    def keep_tree(self, nodes: torch.Tensor, counts: list[int] | torch.Tensor) -> None:
        """After :meth:`tree`: the nodes ``nodes[b, :counts[b]]`` stay in the cache, in order (``counts`` a
        device tensor: all of them join, and those past each count are rolled back as by :meth:`rollback`)."""
        kept = self.tree_tokens.gather(1, nodes.to(self.tree_tokens.device))
        if isinstance(counts, torch.Tensor):
            self.cached(kept)
            self.rollback(kept.shape[1] - counts)
        else:
            self.cached(kept, counts)
        self.tree_tokens = None

    # -- the logits -------------------------------------------------------------------------------
    def prefill(self, logits: torch.Tensor, offset: int = 0) -> None:
        """``logits`` ``[B, V]``: the prompt's last position, penalised in place."""
        self._apply(logits.unsqueeze(1), None, None, offset)

    def window(self, logits: torch.Tensor, tokens: torch.Tensor, offset: int = 0) -> None:
        """``logits`` ``[B, L, V]`` of a window ``tokens`` ``[B, L]`` on the cache, penalised in place; the
        window then joins the cache (:meth:`rollback` takes back what the engine rejects)."""
        L = tokens.shape[1]
        within = torch.ones(L, L, dtype=torch.bool, device=tokens.device).tril().expand(tokens.shape[0], L, L)
        self._apply(logits, tokens, within, offset)
        self.cached(tokens)

    def tree(self, logits: torch.Tensor, tokens: torch.Tensor, within: torch.Tensor, offset: int = 0) -> None:
        """``logits`` ``[B, N, V]`` of tree nodes ``tokens`` ``[B, N]``, node ``i`` seeing node ``j`` where
        ``within[b, i, j]`` (itself always), penalised in place; :meth:`keep_tree` says which nodes stay."""
        self._apply(logits, tokens, within, offset)
        self.tree_tokens = tokens

    def _apply(self, logits, tokens, within, offset):
        """Each row's seen ids, as entries ``[B, L, E]`` (the prompt's, the cache's, then the row's own window or
        tree tokens; -1 where none), penalised where they fall in the logits' columns.  An id may stand in several
        entries: every seen entry writes its penalised logit, any other entry the logit as it was, and the least
        of those (the largest, for a penalty below 1) is kept, so a seen id gets its penalty exactly once and an
        unseen one keeps its logit: transformers' gather and scatter, without a pass over the vocabulary."""
        B, L, V = logits.shape
        device = logits.device
        n = max(self.lengths)
        live = torch.arange(n, device=device).unsqueeze(0) < self.device_lengths.to(device).unsqueeze(1)
        entries = torch.cat([self.prompt, torch.where(live, self.log[:, :n], -1)], 1).unsqueeze(1).expand(B, L, -1)
        if tokens is not None:
            within = within.to(device) | torch.eye(L, dtype=torch.bool, device=device)
            entries = torch.cat([entries, torch.where(within, tokens.unsqueeze(1), -1)], 2)
        col = entries - offset
        seen = (entries >= 0) & (col >= 0) & (col < V)
        col = torch.where(seen, col, 0)
        value = logits.gather(2, col)
        p = self.penalty
        penalised = torch.where(value < 0, value * p, value / p)  # as RepetitionPenaltyLogitsProcessor
        logits.scatter_reduce_(2, col, torch.where(seen, penalised, value), "amin" if p > 1 else "amax")


def masked_id(folder: pathlib.Path, image_end: int) -> int | None:
    """The id the reference's ``generate`` masks out of its prompt: transformers 4.46 fills the unset pad id of
    the solver's ``GenerationConfig`` from the model's (``generation_config.json``, or ``config.json`` without
    one) and, that id differing from the end id (``<eoss>``; Lumina-mGPT's solver: ``<reserved08706>``), masks
    every prompt position holding it.  A pad id equal to the BOS the prompt starts with therefore takes BOS out
    of what the model sees."""
    generation = folder / "generation_config.json"
    return _masked_pad(read_json(generation if generation.is_file() else folder / "config.json"), (image_end,))
