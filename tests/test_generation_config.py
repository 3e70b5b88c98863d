"""A release's generation_config.json (``loaders/generation_config.py``): the repetition penalty kept beside an
adapter's cache penalises every scored row over exactly the ids sequential decoding would have fed at its
position, as transformers' own ``RepetitionPenaltyLogitsProcessor`` does; every other field is honoured, shown to
be without effect on image tokens, or refused by name."""
import json
import pathlib

import pytest
import torch

from spec_ar.formats.checkpoints import CheckpointError
from spec_ar.loaders.generation_config import RepetitionPenalty, release_generation
from spec_ar.sampling.tree import ancestors

TEXT_IDS = 40  # ids from 40 on stand for image tokens
EXPLICIT = ("do_sample", "temperature", "top_p", "top_k", "max_new_tokens", "max_length", "use_cache")


def expected(logits_row: torch.Tensor, prefix: list[int], penalty: float) -> torch.Tensor:
    """transformers' processor on one row, fed the prefix as ``generate`` feeds its ``input_ids``."""
    from transformers import RepetitionPenaltyLogitsProcessor

    return RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([prefix]), logits_row.clone().unsqueeze(0))[0]


@pytest.mark.parametrize("p", [1.3, 0.7])
def test_every_row_is_penalised_over_its_own_prefix_as_transformers_does(p):
    """Prefill, a window (each row sees the window up to itself), a rollback of a different length per sample, a
    draft tree (each node sees its ancestors), the kept path, then a window whose logits are a column range of the
    vocabulary (a compact vocabulary's image ids): each row equal to transformers' processor on its prefix (a
    penalty below 1 raises repeats)."""
    g = torch.Generator().manual_seed(0)
    V, B = 60, 3
    prompts = [[3, 7, 7, 1], [5, 9], [2, 2, 8]]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in prompts])
    valid = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in prompts])
    rp = RepetitionPenalty(p)
    rp.start(ids, valid)
    prefix = [list(r) for r in prompts]

    logits = 4 * torch.randn(B, V, generator=g)
    ours = logits.clone()
    rp.prefill(ours)
    for b in range(B):
        assert torch.equal(ours[b], expected(logits[b], prefix[b], p))
    assert not torch.equal(ours, logits)

    tokens = torch.randint(TEXT_IDS, V, (B, 4), generator=g)
    tokens[:, 2] = tokens[:, 0]  # a repeat inside the window
    tokens[1, 1] = 9  # a prompt id
    logits = 4 * torch.randn(B, 4, V, generator=g)
    ours = logits.clone()
    rp.window(ours, tokens)
    for b in range(B):
        for j in range(4):
            assert torch.equal(ours[b, j], expected(logits[b, j], prefix[b] + tokens[b, : j + 1].tolist(), p))
    kept = [4, 1, 2]
    rp.rollback([4 - k for k in kept])
    for b in range(B):
        prefix[b] += tokens[b, : kept[b]].tolist()

    parents = torch.tensor([[-1, 0, 0, 1, 2]] * B)
    tokens = torch.randint(TEXT_IDS, V, (B, 5), generator=g)
    tokens[:, 3] = tokens[:, 2]  # a sibling's token: seen by neither branch of the other
    within = ancestors(parents)
    logits = 4 * torch.randn(B, 5, V, generator=g)
    ours = logits.clone()
    rp.tree(ours, tokens, within)
    path = {0: [0], 1: [0, 1], 2: [0, 2], 3: [0, 1, 3], 4: [0, 2, 4]}
    for b in range(B):
        for i in range(5):
            assert torch.equal(ours[b, i], expected(logits[b, i], prefix[b] + tokens[b, path[i]].tolist(), p))
    nodes, counts = torch.tensor([[0, 1, 3], [0, 2, 4], [0, 2, 4]]), [3, 1, 2]
    rp.keep_tree(nodes, counts)
    for b in range(B):
        prefix[b] += tokens[b, nodes[b, : counts[b]]].tolist()

    tokens = torch.randint(TEXT_IDS, V, (B, 3), generator=g)
    logits = 4 * torch.randn(B, 3, V, generator=g)
    ours = logits[..., TEXT_IDS:].clone()
    rp.window(ours, tokens, offset=TEXT_IDS)
    for b in range(B):
        for j in range(3):
            full = expected(logits[b, j], prefix[b] + tokens[b, : j + 1].tolist(), p)
            assert torch.equal(ours[b, j], full[TEXT_IDS:])


def test_the_cache_log_grows_past_its_first_capacity():
    rp = RepetitionPenalty(2.0)
    rp.start(torch.tensor([[1, 2]]), torch.ones(1, 2))
    stream = list(range(3, 40)) * 20  # 740 tokens, ids repeating
    for start in range(0, len(stream), 37):
        rp.window(torch.zeros(1, 37, 50), torch.tensor([stream[start:start + 37]]))
    logits = torch.full((1, 50), 2.0)
    rp.prefill(logits)  # the prompt and everything cached: ids 1..39 halved
    assert logits[0, 1:40].eq(1.0).all() and logits[0, 40:].eq(2.0).all() and logits[0, 0] == 2.0


def release(tmp_path: pathlib.Path, settings: dict, name: str = "generation_config.json"):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(json.dumps(settings))
    return release_generation(tmp_path, TEXT_IDS, "SimpleAR's generate.py", EXPLICIT)


def test_fields_the_authors_call_overrides_or_that_touch_text_ids_only_load(tmp_path):
    """Qwen2.5-Instruct's file: sampling settings overridden by generate.py's own arguments, the penalty applied;
    processors that can only touch text ids (end ids, the prompt's ids, text ids named) change no image token."""
    got = release(tmp_path, {"bos_token_id": 30, "pad_token_id": 30, "do_sample": True, "eos_token_id": [32, 30],
                             "repetition_penalty": 1.1, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
                             "min_new_tokens": 5, "suppress_tokens": [3, 4], "bad_words_ids": [[5, 6]],
                             "encoder_repetition_penalty": 1.3, "forced_bos_token_id": 7, "renormalize_logits": True,
                             "typical_p": 1.0, "num_beams": 1, "max_length": 20})
    assert got.repetition_penalty == 1.1 and got.masked is None  # the pad id is an end id: nothing masked
    assert release(tmp_path, {"repetition_penalty": 1.0, "pad_token_id": 3, "eos_token_id": 30}).masked == 3
    assert release(tmp_path / "none", {}).repetition_penalty == 1.0
    # no generation_config.json: from_pretrained builds it from config.json
    assert release(tmp_path / "old", {"repetition_penalty": 1.05}, "config.json").repetition_penalty == 1.05


@pytest.mark.parametrize("field,value,says", [
    ("no_repeat_ngram_size", 3, "bans every image token that would repeat an n-gram"),
    ("min_p", 0.05, "cuts tokens below min_p times the top probability"),
    ("typical_p", 0.9, "keeps the locally typical tokens only"),
    ("num_beams", 4, "samples with beam search"),
    ("guidance_scale", 3.0, "adds transformers' own classifier-free guidance"),
    ("forced_eos_token_id", 30, "forces an end id in place of the last image token"),
    ("suppress_tokens", [3, 41], "bans image token 41"),
    ("eos_token_id", [30, 45], "ends the image at image token 45"),
])
def test_a_field_the_pack_cannot_apply_is_refused_by_name(tmp_path, field, value, says):
    with pytest.raises(CheckpointError) as err:
        release(tmp_path, {field: value, "repetition_penalty": 1.1})
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'generation_config.json'}: {field} {value!r}: ") and says in message
    assert f"remove {field} from generation_config.json" in message


@pytest.mark.parametrize("value", [2, -1.5, 0.0, "1.1"])
def test_a_penalty_transformers_would_refuse_is_refused(tmp_path, value):
    with pytest.raises(CheckpointError, match=f"repetition_penalty {value!r}: transformers' generate .* refuses it"):
        release(tmp_path, {"repetition_penalty": value})
    with pytest.raises(CheckpointError, match="typical_p 'x' is not a number"):
        release(tmp_path, {"typical_p": "x"})
