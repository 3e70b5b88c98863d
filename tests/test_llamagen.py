"""LlamaGen: checkpoints load in every real layout, the cached GPT is exact, modes decode images."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from spec_ar.decoders.vq16 import VQ16Decoder
from spec_ar.loaders import llamagen
from spec_ar.formats.checkpoints import CheckpointError
from spec_ar.loaders.llamagen import GPTSpec, LlamaGenAdapter, load_gpt
from spec_ar.sampling import DecodeConfig, SpeculativeDecoder

from .checkpoints import TINY_VQ, random_gpt, tiny_gpt_spec, write_gpt, write_t5, write_vq


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("llamagen")
    c2i, t2i = random_gpt(tiny_gpt_spec("c2i"), seed=1), random_gpt(tiny_gpt_spec("t2i"), seed=2)
    return {
        "c2i": write_gpt(d / "c2i_tiny.pt", c2i), "c2i_gpt": c2i,
        "t2i": write_gpt(d / "t2i_tiny.pt", t2i, wrapper="module"), "t2i_gpt": t2i,
        "vq": write_vq(d / "vq_ds16_c2i.pt"),
        "t5": write_t5(d / "flan-t5-tiny", d_model=32),
        "dir": d,
    }


# -- loading ---------------------------------------------------------------------
@pytest.mark.parametrize("wrapper,suffix,freqs", [("model", ".pt", None), ("module", ".pt", None),
                                                 ("state_dict", ".pt", 6), (None, ".pt", None),
                                                 (None, ".safetensors", None)])
def test_every_checkpoint_layout_loads_the_same_weights(files, tmp_path, wrapper, suffix, freqs):
    path = write_gpt(tmp_path / f"gpt{suffix}", files["c2i_gpt"], wrapper=wrapper, freqs_cis=freqs)
    gpt = load_gpt(path)
    for (k, a), b in zip(files["c2i_gpt"].state_dict().items(), gpt.state_dict().values()):
        assert torch.equal(a, b), k
    assert gpt.spec.grid == freqs  # an old rotary table tells the grid


@pytest.mark.parametrize("dim,layers,kind,name", [(768, 12, "c2i", "LlamaGen-B c2i"), (1024, 24, "c2i", "LlamaGen-L c2i"),
                                                  (1280, 36, "t2i", "LlamaGen-XL t2i"), (1536, 48, "c2i", "LlamaGen-XXL c2i"),
                                                  (3200, 24, "c2i", "LlamaGen-3B c2i")])
def test_sizes_come_from_the_weights(dim, layers, kind, name):
    ffn = -(-int(2 * 4 * dim / 3) // 256) * 256
    meta = {"tok_embeddings.weight": torch.empty(16384, dim, device="meta"),
            "output.weight": torch.empty(16384, dim, device="meta"),
            "layers.0.attention.wqkv.weight": torch.empty(3 * dim, dim, device="meta"),
            "layers.0.feed_forward.w1.weight": torch.empty(ffn, dim, device="meta"),
            f"layers.{layers - 1}.attention.wo.weight": torch.empty(dim, dim, device="meta")}
    if kind == "c2i":
        meta["cls_embedding.embedding_table.weight"] = torch.empty(1001, dim, device="meta")
    else:
        meta["cls_embedding.cap_proj.fc1.weight"] = torch.empty(dim, 2048, device="meta")
        meta["cls_embedding.uncond_embedding"] = torch.empty(120, 2048, device="meta")
    spec = GPTSpec.from_state_dict(meta)
    assert spec.name == name and spec.n_layer == layers and spec.ffn_hidden == ffn
    assert spec.head_dim == (100 if dim == 3200 else 64)
    assert spec.cond_tokens == (1 if kind == "c2i" else 120)


def test_a_vq_file_is_not_a_gpt(files):
    with pytest.raises(CheckpointError, match="not a LlamaGen GPT: missing 'tok_embeddings.weight'"):
        load_gpt(files["vq"])


# -- the network -------------------------------------------------------------------
def reference_logits(gpt, cond_h, tokens, cond_mask=None):
    """A plain re-implementation: the whole sequence at once, rotary embedding
    through complex numbers, explicit causal mask.  ``cond_h`` [N, C, dim]."""
    s = gpt.spec
    x = torch.cat([cond_h, gpt.tok_embeddings(tokens)], 1)
    n, S, _ = x.shape
    C = cond_h.shape[1]
    grid = 4
    q4 = s.head_dim // 4
    freqs = 1.0 / 10000 ** (torch.arange(q4).double() * 4 / s.head_dim)
    t = torch.arange(S - C)
    ang = torch.cat([torch.outer((t // grid).double(), freqs), torch.outer((t % grid).double(), freqs)], -1)
    rot = torch.cat([torch.zeros(C, 2 * q4, dtype=torch.complex128), torch.polar(torch.ones_like(ang), ang)])
    allowed = torch.tril(torch.ones(S, S, dtype=torch.bool)).repeat(n, 1, 1)
    if cond_mask is not None:
        allowed[:, :, :C] &= cond_mask.bool()[:, None, :]
        allowed |= torch.eye(S, dtype=torch.bool)
    h = x
    for layer in gpt.layers:
        a = layer.attention
        y = layer.attention_norm(h)
        q, k, v = a.wqkv(y).view(n, S, 3, s.n_head, s.head_dim).unbind(2)

        def rope(z):
            zc = torch.view_as_complex(z.double().reshape(n, S, s.n_head, -1, 2).contiguous())
            return torch.view_as_real(zc * rot[None, :, None]).flatten(-2).float()

        att = F.scaled_dot_product_attention(rope(q).transpose(1, 2), rope(k).transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=allowed.unsqueeze(1))
        h = h + a.wo(att.transpose(1, 2).reshape(n, S, -1))
        h = h + layer.feed_forward(layer.ffn_norm(h))
    return gpt.output(gpt.norm(h)).float()[:, C - 1:]  # position C-1 predicts image token 0


def test_window_logits_equal_token_by_token_and_a_plain_reimplementation(files):
    gpt = files["c2i_gpt"]
    ad = LlamaGenAdapter(gpt, grid=4)
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, 1024, (2, 16), generator=g)
    ad.check_conditions([3, 7], None)
    first = ad.prefill([3, 7], None, guided=True)  # [2 branches, 2, V]
    steps = [ad.forward(seq[:, i:i + 1]) for i in range(15)]
    one_by_one = torch.cat([first.unsqueeze(2)] + steps, 2)  # [2, 2, 16, V]
    with torch.no_grad():
        cond = gpt.cls_embedding.embedding_table(torch.tensor([3, 7, 10, 10])).unsqueeze(1)
        ref = reference_logits(gpt, cond, seq.repeat(2, 1)[:, :15]).view(2, 2, 16, -1)
    torch.testing.assert_close(one_by_one, ref, atol=2e-4, rtol=1e-4)

    # windows of different lengths per sample, with a ragged rollback in between
    ad.prefill([3, 7], None, guided=True)
    w1 = ad.forward(seq[:, 0:6])
    torch.testing.assert_close(w1, one_by_one[:, :, 1:7], atol=2e-4, rtol=1e-4)
    ad.rollback([3, 0])  # sample 0 keeps 3 of the 6, sample 1 all
    assert ad.cache_lengths().tolist() == [3, 6]
    nxt = torch.stack([seq[0, 3:8], seq[1, 6:11]])
    w2 = ad.forward(nxt)
    torch.testing.assert_close(w2[:, 0], one_by_one[:, 0, 4:9], atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(w2[:, 1], one_by_one[:, 1, 7:12], atol=2e-4, rtol=1e-4)


def test_text_conditional_padding_and_unconditional_branch(files):
    from spec_ar.loaders.t5 import T5TextEncoder

    gpt = files["t2i_gpt"]
    enc = T5TextEncoder(files["t5"])
    ad = LlamaGenAdapter(gpt, grid=4, text_encoder=enc)
    prompts = ["a red circle", "a blue square in the top left on a striped background"]
    seq = torch.randint(0, 1024, (2, 5), generator=torch.Generator().manual_seed(1))
    logits = torch.cat([ad.prefill(prompts, None, True).unsqueeze(2), ad.forward(seq)], 2)
    feats, mask = enc.encode(prompts, 12)
    assert mask[0].tolist() == [0] * 8 + [1] * 4  # "a red circle </s>", left-padded
    with torch.no_grad():
        emb = gpt.cls_embedding
        both = torch.cat([feats, torch.zeros_like(feats) + emb.uncond_embedding])
        ref = reference_logits(gpt, emb.cap_proj(both), seq.repeat(2, 1), torch.cat([mask, mask]))
    torch.testing.assert_close(logits, ref.view(2, 2, 6, -1), atol=2e-4, rtol=1e-4)


# -- decoding --------------------------------------------------------------------------
def test_vq_decoder_turns_codes_into_images(files):
    vq = VQ16Decoder.load(files["vq"])
    assert vq.spec == TINY_VQ and vq.spec.downsample == 16
    codes = torch.randint(0, 1024, (2, 4, 5))
    img = vq.decode(codes)
    assert img.shape == (2, 3, 64, 80) and img.dtype == torch.float32
    assert 0.0 <= float(img.min()) and float(img.max()) <= 1.0 and float(img.std()) > 0
    book = vq.codebook()
    torch.testing.assert_close(book.norm(dim=1), torch.ones(1024))


def test_greedy_ar_is_deterministic_and_matches_argmax(files):
    model = llamagen.load(files["c2i"], files["vq"], resolution=64)
    dec = SpeculativeDecoder(model.adapter, DecodeConfig(mode="ar", temperature=0.0, cfg_scale=3.0))
    a, b = dec.generate([1, 2], seeds=0).tokens, dec.generate([1, 2], seeds=99).tokens
    assert torch.equal(a, b)
    with torch.no_grad():
        gpt, seq = files["c2i_gpt"], a
        cond = gpt.cls_embedding.embedding_table(torch.tensor([1, 2, 10, 10])).unsqueeze(1)
        ref = reference_logits(gpt, cond, seq.repeat(2, 1)[:, :15]).view(2, 2, 16, -1)
        guided = ref[1] + 3.0 * (ref[0] - ref[1])
    assert torch.equal(guided.argmax(-1), seq)


@pytest.mark.parametrize("kind", ["c2i", "t2i"])
@pytest.mark.parametrize("batch", [1, 2])
def test_every_mode_decodes_images(files, kind, batch):
    model = llamagen.load(files[kind], files["vq"], text_encoder_path=files["t5"], resolution=64)
    prompts = [3, 5][:batch] if kind == "c2i" else ["a red circle", "a green dog"][:batch]
    for mode in ("ar", "sjd", "gsd", "lantern", "vvs"):
        cfg = DecodeConfig(mode=mode, window=4, lantern_k=50, gsd_distance=1.0 if mode == "gsd" else None)
        res = SpeculativeDecoder(model.adapter, cfg).generate(prompts, seeds=1)
        images = model.decode(res.image_tokens(model.adapter.layout))
        assert images.shape == (batch, 3, 64, 64)
        assert res.reports[0].nfe <= 16


def test_mismatched_files_are_refused(files, tmp_path):
    from spec_ar.decoders.vq16 import VQSpec

    small = write_vq(tmp_path / "vq_small.pt", VQSpec(ch=32, ch_mult=(1, 2), enc_blocks=1, dec_blocks=2,
                                                      z_channels=32, codebook_size=512, embed_dim=8))
    with pytest.raises(CheckpointError, match="codebook of 512 codes does not match the GPT's 1024-token vocabulary"):
        llamagen.load(files["c2i"], small)
    model = llamagen.load(files["c2i"], files["vq"], resolution=64)
    with pytest.raises(ValueError, match=r"class id must be an integer in \[0, 9\]"):
        SpeculativeDecoder(model.adapter, DecodeConfig()).generate([12])
    with pytest.raises(ValueError, match="resolution must be a multiple of 16"):
        model.resize(100)
    t2i = llamagen.load(files["t2i"], files["vq"], resolution=64)  # no text encoder given
    with pytest.raises(ValueError, match="needs a T5 text encoder"):
        SpeculativeDecoder(t2i.adapter, DecodeConfig()).generate(["a cat"])


def test_downsample_8_tokenizer_is_read_from_its_weights(tmp_path):
    from spec_ar.decoders.vq16 import VQSpec

    spec8 = VQSpec(ch=32, ch_mult=(1, 2, 2, 4), enc_blocks=2, dec_blocks=3, z_channels=32, codebook_size=256,
                   embed_dim=8)
    vq = VQ16Decoder.load(write_vq(tmp_path / "vq_ds8_c2i.pt", spec8))
    assert vq.spec == spec8 and vq.spec.downsample == 8
    assert vq.decode(torch.randint(0, 256, (1, 3, 3))).shape == (1, 3, 24, 24)
    # the encoder reads back what the decoder is fed, through the same codebook
    codes = vq.model.encode(torch.rand(1, 3, 24, 24) * 2 - 1)
    assert codes.shape == (1, 3, 3) and int(codes.max()) < 256


def test_whole_sequence_scoring_equals_the_cached_path(files):
    gpt = files["c2i_gpt"]
    seq = torch.randint(0, 1024, (2, 16), generator=torch.Generator().manual_seed(4))
    ad = LlamaGenAdapter(gpt, grid=4)
    cached = torch.cat([ad.prefill([3, 7], None, False).unsqueeze(2), ad.forward(seq[:, :15])], 2)[0]
    with torch.no_grad():
        cond = gpt.cls_embedding.embedding_table(torch.tensor([3, 7])).unsqueeze(1)
        whole = gpt.sequence_logits(cond, seq, grid=4)
    torch.testing.assert_close(whole, cached, atol=2e-4, rtol=1e-4)


def test_lanterns_converted_llamagen_folder_loads_as_the_same_model(tmp_path):
    from spec_ar.loaders.detect import detect, load_model

    from .checkpoints import write_hf_llamagen, write_t5

    gpt = random_gpt(tiny_gpt_spec("t2i", cond_tokens=120), seed=4)
    original = write_gpt(tmp_path / "t2i.pt", gpt)
    folder = write_hf_llamagen(tmp_path / "LlamaGen-T2I", gpt, grid=16)
    vq, t5 = write_vq(tmp_path / "vq.pt"), write_t5(tmp_path / "t5")
    hit = detect(folder)
    assert hit.family == "llamagen" and hit.detail == "t2i"
    converted = load_model(folder, vq, t5)
    assert converted.resolution == 256 and not converted.warnings  # the grid comes from block_size
    reference = load_model(original, vq, t5, resolution=256)
    logits = []
    for m in (converted, reference):
        ad = m.adapter
        first = ad.prefill(["a cat"], None, True)
        logits.append(torch.cat([first.unsqueeze(2), ad.forward(torch.tensor([[5, 9, 2]]))], 2))
    torch.testing.assert_close(logits[0], logits[1])
