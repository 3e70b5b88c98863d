"""Training the embedded text-to-image model from scratch, on this machine.

    spec-ar train-embedded [--out embedded/weights] [--seed 0]

Stages (each logged with its wall time):

1. render the procedural dataset (``domain.make_dataset``): images and captions,
   a share of them with the position or background phrase left out;
2. train a VQ tokenizer with LlamaGen's architecture (``decoders/vq16.py``) in a
   small configuration: 64 px -> 16 x 16 codes from an L2-normalised codebook,
   with dead codes re-seeded from encoder outputs, and replicate padding in
   encoder and decoder (``VQModel.set_padding``: with LlamaGen's zero padding the
   codes, and so the GPT's pictures, carried a stripe near the top right);
3. encode the dataset into codes, and train the decoder again on them
   (encoder and codebook frozen: see :func:`train_decoder`);
4. train a LlamaGen text-to-image GPT (``loaders/llamagen.py``: 2D rotary
   embeddings, caption projection, learned unconditional embedding, 10 %
   condition dropout for guidance) together with the word-level text encoder;
5. train the judge (``judge.py``) used to measure prompt adherence;
6. write ``config.json`` and ``model.safetensors`` (float16) and ``judge.safetensors``.

Everything is seeded; the step counts, not wall time, fix the result.
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import time
from dataclasses import asdict, replace

import numpy as np
import torch
import torch.nn.functional as F

from ..decoders.vq16 import VQModel
from ..loaders.embedded import gpt_spec, vq_spec
from ..loaders.llamagen import LlamaGenGPT
from ..embedded.recipe import Recipe
from ..embedded.text import TextEncoder, left_pad

WEIGHTS = pathlib.Path(__file__).parents[1] / "embedded" / "weights"


def _to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 ``[N, S, S, 3]`` -> float ``[N, 3, S, S]`` in [-1, 1]."""
    return torch.from_numpy(images).permute(0, 3, 1, 2).float().div_(127.5).sub_(1)


def _schedule(step: int, total: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


# -- the VQ tokenizer -------------------------------------------------------------------
def train_vq(r: Recipe, images: np.ndarray, coverage: np.ndarray, log=print) -> VQModel:
    """Reconstruction loss weighs the object's pixels (with a 2-px margin for its
    edge) ``1 + object_weight`` times: with plain L1+L2 the codebook spends itself
    on background texture and objects come back as blobs whose shape the judge
    cannot read (shape accuracy on reconstructions 0.18 vs 0.42 after 250 steps)."""
    torch.manual_seed(r.seed)
    model = VQModel(vq_spec(r)).set_padding("encoder", r.vq_encoder_padding)
    model = model.set_padding("decoder", r.vq_decoder_padding).train()
    opt = torch.optim.Adam(model.parameters(), lr=r.vq_lr, betas=(0.5, 0.9))
    gen = torch.Generator().manual_seed(r.seed + 1)
    usage = torch.zeros(r.codebook)
    for step in range(r.vq_steps):
        for g in opt.param_groups:
            g["lr"] = r.vq_lr * _schedule(step, r.vq_steps, 50)
        pick = torch.randint(0, len(images), (r.vq_batch,), generator=gen).numpy()
        x = _to_tensor(images[pick])
        weight = 1 + r.object_weight * F.max_pool2d(torch.from_numpy(coverage[pick]).unsqueeze(1), 5, 1, 2)
        z = F.normalize(model.quant_conv(model.encoder(x)), dim=1)  # [B, d, h, w], unit vectors
        flat = z.permute(0, 2, 3, 1).reshape(-1, r.code_dim)
        book = model.quantize.codebook()
        idx = (flat @ book.T).argmax(1)  # nearest code by cosine
        zq = book[idx]
        loss_vq = F.mse_loss(zq, flat.detach()) + r.commit * F.mse_loss(flat, zq.detach())
        zq = (flat + (zq - flat).detach()).view(z.shape[0], z.shape[2], z.shape[3], -1).permute(0, 3, 1, 2)
        rec = model.decoder(model.post_quant_conv(zq))
        err = rec - x
        loss_rec = (weight * (err.abs() + err.square())).mean() / weight.mean()
        loss = loss_rec + loss_vq
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        usage.mul_(0.98).index_add_(0, idx, torch.ones_like(idx, dtype=torch.float))
        if step % 100 == 99 and step < r.vq_steps * 0.8:  # re-seed codes nobody picks
            dead = torch.nonzero(usage < 1e-2).flatten()
            if len(dead):
                pick = torch.randint(0, flat.shape[0], (len(dead),), generator=gen)
                with torch.no_grad():
                    model.quantize.embedding.weight[dead] = flat.detach()[pick] + 0.01 * torch.randn(
                        len(dead), r.code_dim, generator=gen)
                usage[dead] = 1.0
        if step % 100 == 0 or step == r.vq_steps - 1:
            log(f"  vq step {step:5d}  reconstruction {loss_rec.item():.4f}  codebook {loss_vq.item():.4f}  "
                f"codes in use {(usage > 1e-2).sum().item()}/{r.codebook}")
    return model.eval()


class Spikes:
    """While open, records how far each GroupNorm input of ``decoder`` peaks above its
    map's typical activation: per position the RMS over channels, over the RMS of the
    whole map.  A normalised decoder whose groups are single channels (instance norm)
    grows one position to many times the rest to steer its statistics (StyleGAN2's
    "droplet" artifact), and that position decodes as a small round spot: the
    embedded model's 32-channel decoder peaked at 11 times its maps' RMS on a median
    picture (26 at most); widened to two channels a group, 2.6."""

    def __init__(self, decoder: torch.nn.Module):
        self.ratios: list[torch.Tensor] = []  # [B, H, W] per GroupNorm, in call order
        self._hooks = [m.register_forward_pre_hook(self._record) for m in decoder.modules()
                       if isinstance(m, torch.nn.GroupNorm)]

    def _record(self, module, args):
        power = args[0].float().square().mean(1)
        self.ratios.append((power / power.mean((1, 2), keepdim=True).clamp_min(1e-12)).sqrt())

    def peak(self) -> torch.Tensor:
        """``[B]``: each image's highest ratio in any map."""
        return torch.stack([r.flatten(1).amax(1) for r in self.ratios]).amax(0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for h in self._hooks:
            h.remove()
        self.ratios.clear()


def cut_together(x: torch.Tensor, codes: torch.Tensor, share: float, gen: torch.Generator, cell: int):
    """The first ``share`` of a batch replaced by pairs of its pictures cut together:
    a rectangle of whole code cells from one pasted onto another, in the codes and in
    the pixels alike (a code stands for its cell, so the pasted codes still describe
    the pasted pixels), giving the decoder arrangements no single picture has."""
    n = int(round(share * len(x)))
    if n == 0:
        return x, codes
    x, codes = x.clone(), codes.clone()
    h, w = codes.shape[1:]
    other = torch.randperm(len(x), generator=gen)[:n]
    for i, j in enumerate(other.tolist()):
        hh, ww = (int(torch.randint(2, s, (1,), generator=gen)) for s in (h, w))
        top, left = int(torch.randint(0, h - hh + 1, (1,), generator=gen)), int(torch.randint(0, w - ww + 1, (1,),
                                                                                             generator=gen))
        codes[i, top:top + hh, left:left + ww] = codes[j, top:top + hh, left:left + ww]
        x[i, :, top * cell:(top + hh) * cell, left * cell:(left + ww) * cell] = \
            x[j, :, top * cell:(top + hh) * cell, left * cell:(left + ww) * cell]
    return x, codes


def train_decoder(r: Recipe, model: VQModel, images: np.ndarray, coverage: np.ndarray, codes: torch.Tensor,
                  log=print) -> VQModel:
    """The decoder again, encoder and codebook frozen (so the codes, and the GPT
    trained on them, stay valid), with ``vq_decoder_padding``: the decoder learns
    the codes the finished encoder writes.  (Added to mend a folder whose first
    stage had zero padding: its decoder drew a darker frame and a stripe near the
    top-right corner for a grid of one code; with replicate padding a uniform grid
    decodes to a uniform image, and reconstructions improved in every region.)
    Part of each batch is cut together from two pictures (``vq_decoder_mix``); the
    decoder is as wide as ``vq_dec_mult`` says (:func:`widened` builds it)."""
    torch.manual_seed(r.seed + 5)
    model.set_padding("decoder", r.vq_decoder_padding).train()
    params = list(model.decoder.parameters()) + list(model.post_quant_conv.parameters())
    frozen = [p for p in model.parameters() if all(p is not q for q in params)]
    for p in frozen:
        p.requires_grad_(False)
    opt = torch.optim.Adam(params, lr=r.vq_decoder_lr, betas=(0.5, 0.9))
    gen = torch.Generator().manual_seed(r.seed + 6)
    book = model.quantize.codebook().detach()
    cell = r.size // r.grid
    with Spikes(model.decoder) as spikes:  # watched, not trained on: the log shows the droplets go
        for step in range(r.vq_decoder_steps):
            for g in opt.param_groups:
                g["lr"] = r.vq_decoder_lr * _schedule(step, r.vq_decoder_steps, 20)
            pick = torch.randint(0, len(images), (r.vq_batch,), generator=gen)
            x = _to_tensor(images[pick.numpy()])
            weight = 1 + r.object_weight * F.max_pool2d(torch.from_numpy(coverage[pick.numpy()]).unsqueeze(1), 5, 1,
                                                         2)
            batch_codes = codes[pick]
            if r.vq_decoder_mix:
                both, batch_codes = cut_together(torch.cat([x, weight], 1), batch_codes, r.vq_decoder_mix, gen, cell)
                x, weight = both[:, :3], both[:, 3:]
            spikes.ratios.clear()
            err = model.decoder(model.post_quant_conv(book[batch_codes].permute(0, 3, 1, 2))) - x
            loss = (weight * (err.abs() + err.square())).mean() / weight.mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if step % 100 == 0 or step == r.vq_decoder_steps - 1:
                log(f"  decoder step {step:5d}  reconstruction {loss.item():.4f}  "
                    f"peak activation {spikes.peak().max().item():.1f} x RMS")
    for p in frozen:
        p.requires_grad_(True)
    return model.eval()


@torch.no_grad()
def encode_dataset(model: VQModel, images: np.ndarray, batch: int = 256) -> torch.Tensor:
    return torch.cat([model.encode(_to_tensor(images[i:i + batch])) for i in range(0, len(images), batch)])


# -- the GPT and its text encoder ------------------------------------------------------
def train_gpt(r: Recipe, codes: torch.Tensor, captions: list[str], vocabulary, log=print):
    torch.manual_seed(r.seed + 2)
    gpt = LlamaGenGPT(gpt_spec(r))
    text = TextEncoder(list(vocabulary), dim=r.text_dim, layers=r.text_layers, max_length=r.words)
    with torch.no_grad():  # small initial weights, as LlamaGen's initialiser
        for name, p in gpt.named_parameters():
            if p.dim() > 1:
                torch.nn.init.normal_(p, 0.0, 0.02)
        gpt.cls_embedding.uncond_embedding.normal_(0, r.text_dim ** -0.5)
    gpt.train()
    text.train()
    params = list(gpt.parameters()) + list(text.parameters())
    decay = [p for p in params if p.dim() > 1]
    rest = [p for p in params if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": rest, "weight_decay": 0.0}],
                            lr=r.gpt_lr, betas=(0.9, 0.95))
    ids, masks = text.tokenize(captions)
    gen = torch.Generator().manual_seed(r.seed + 3)
    codes = codes.flatten(1)
    for step in range(r.gpt_steps):
        for g in opt.param_groups:
            g["lr"] = r.gpt_lr * _schedule(step, r.gpt_steps, 100)
        pick = torch.randint(0, len(codes), (r.gpt_batch,), generator=gen)
        feats, mask = left_pad(text(ids[pick], masks[pick]), masks[pick])
        drop = torch.rand(r.gpt_batch, generator=gen) < r.cond_drop
        uncond = gpt.cls_embedding.uncond_embedding.expand_as(feats)
        feats = torch.where(drop[:, None, None], uncond, feats)
        logits = gpt.sequence_logits(gpt.cls_embedding.cap_proj(feats), codes[pick], r.grid, mask)
        loss = F.cross_entropy(logits.reshape(-1, r.codebook), codes[pick].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 100 == 0 or step == r.gpt_steps - 1:
            log(f"  gpt step {step:5d}  loss {loss.item():.4f}  lr {opt.param_groups[0]['lr']:.2e}")
    return gpt.eval(), text.eval()


# -- files -------------------------------------------------------------------------------
def save(out: pathlib.Path, r: Recipe, vq: VQModel, gpt: LlamaGenGPT, text: TextEncoder, stats: dict):
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for prefix, module in (("gpt.", gpt), ("vq.", vq), ("text.", text)):
        for k, v in module.state_dict().items():
            if k == "quantize.codebook_used":
                continue
            tensors[prefix + k] = v.detach().to(torch.float16).contiguous()
    save_file(tensors, str(out / "model.safetensors"))
    config = {"format": "spec_ar-embedded", "version": 1, "recipe": asdict(r), "vocabulary": text.vocabulary[2:],
              "resolution": r.size, "grid": r.grid, "sampling_defaults": {"cfg_scale": 2.5, "top_k": None},
              "training": stats}
    (out / "config.json").write_text(json.dumps(config, indent=1))


def run(r: Recipe, out: pathlib.Path = WEIGHTS, log=print) -> dict:
    from ..embedded import domain, judge

    stats = {}
    t0 = time.perf_counter()

    def lap(name):
        now = time.perf_counter()
        stats[f"{name}_minutes"] = round((now - lap.t) / 60, 2)
        log(f"{name}: {stats[f'{name}_minutes']} min")
        lap.t = now

    lap.t = t0
    images, scenes, captions, coverage = domain.make_dataset(r.images, seed=r.seed, size=r.size, drop=r.drop,
                                                             coverage=True)
    lap("dataset")
    vq = train_vq(r, images, coverage, log)
    lap("vq")
    codes = encode_dataset(vq, images)
    used = len(torch.unique(codes))
    stats["codes_used"] = used
    log(f"  dataset uses {used}/{r.codebook} codes")
    lap("encode")
    vq = train_decoder(r, vq, images, coverage, codes, log)
    lap("decoder")
    gpt, text = train_gpt(r, codes, captions, domain.VOCABULARY, log)
    lap("gpt")
    jm = judge.train_judge(n_images=r.judge_images, seed=r.seed + 4, epochs=r.judge_epochs, log=log)
    lap("judge")
    stats["total_minutes"] = round((time.perf_counter() - t0) / 60, 2)
    save(out, r, vq, gpt, text, stats)
    judge.save_judge(jm, out / "judge.safetensors")
    log(f"wrote {out}/config.json, model.safetensors, judge.safetensors in {stats['total_minutes']} min")
    return stats


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="spec-ar train-embedded", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(WEIGHTS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="a few steps of each stage (to check the pipeline)")
    ap.add_argument("--decoder-only", metavar="FOLDER",
                    help="only the decoder stage, on a model folder trained before it existed (written to --out)")
    ap.add_argument("--sibling", metavar="FOLDER",
                    help="a smaller sibling of the model in FOLDER, to draft for it: the same data, tokenizer and "
                         "codes, a GPT of --layers layers with its own text encoder (written to --out)")
    ap.add_argument("--layers", type=int, default=2, help="the sibling's GPT layers (with --sibling)")
    args = ap.parse_args(argv)
    if args.sibling:
        sibling(pathlib.Path(args.sibling), pathlib.Path(args.out), layers=args.layers, quick=args.quick)
        return 0
    r = Recipe(seed=args.seed)
    if args.quick:
        r = Recipe(seed=args.seed, images=512, vq_steps=5, gpt_steps=5, judge_images=512, judge_epochs=1,
                   vq_decoder_steps=5)
    if args.decoder_only:
        decoder_only(pathlib.Path(args.decoder_only), pathlib.Path(args.out), quick=args.quick)
    else:
        run(r, pathlib.Path(args.out))
    return 0


#: the decoder stage's recipe fields: what ``--decoder-only`` takes from today's recipe
DECODER_FIELDS = ("vq_dec_mult", "vq_decoder_padding", "vq_decoder_steps", "vq_decoder_lr", "vq_decoder_mix")


def widened(vq: VQModel, r: Recipe) -> VQModel:
    """``vq`` with the decoder ``r`` asks for: the encoder, codebook and every decoder
    tensor whose shape is unchanged carried over, the rest freshly initialised (the
    decoder stage then trains it, codebook frozen)."""
    spec = vq_spec(r)
    if spec == vq.spec:
        return vq
    new = VQModel(spec).set_padding("encoder", r.vq_encoder_padding).set_padding("decoder", r.vq_decoder_padding)
    mine = new.state_dict()
    new.load_state_dict({k: v for k, v in vq.state_dict().items() if k in mine and mine[k].shape == v.shape},
                        strict=False)
    return new


def decoder_only(folder: pathlib.Path, out: pathlib.Path, quick: bool = False, log=print) -> dict:
    """The decoder stage on an existing model folder: same data (the folder's recipe
    and seed), its codes, then the folder written again with the new decoder."""
    import shutil

    from ..loaders import embedded
    from ..embedded import domain

    model = embedded.load(folder)
    config = json.loads((folder / "config.json").read_text())
    r = replace(embedded.recipe_of(config), **{k: getattr(Recipe(), k) for k in DECODER_FIELDS})
    if quick:
        r = Recipe(**{**asdict(r), "images": 512, "vq_decoder_steps": 5})
    t0 = time.perf_counter()
    images, _, captions, coverage = domain.make_dataset(r.images, seed=r.seed, size=r.size, drop=r.drop,
                                                        coverage=True)
    vq = model.modules["vq"].float()
    codes = encode_dataset(vq, images)
    vq = train_decoder(r, widened(vq, r), images, coverage, codes, log)
    stats = dict(config.get("training", {}), decoder_minutes=round((time.perf_counter() - t0) / 60, 2))
    save(out, r, vq, model.modules["gpt"].float(), model.modules["text"].float(), stats)
    if (folder / "judge.safetensors").is_file() and folder.resolve() != out.resolve():
        shutil.copy(folder / "judge.safetensors", out / "judge.safetensors")
    log(f"wrote {out}/config.json and model.safetensors (decoder stage: {stats['decoder_minutes']} min)")
    return stats


def sibling(folder: pathlib.Path, out: pathlib.Path, layers: int = 2, quick: bool = False, log=print) -> dict:
    """A sibling of the model in ``folder`` that can draft for it: the folder's recipe,
    data and tokenizer (so the same codes), a GPT of ``layers`` layers and its own
    text encoder trained as in :func:`run`.  Written as a model folder of its own."""
    import shutil

    from ..loaders import embedded
    from ..embedded import domain

    model = embedded.load(folder)
    config = json.loads((folder / "config.json").read_text())
    r = replace(embedded.recipe_of(config), layers=layers, **({"images": 512, "gpt_steps": 5} if quick else {}))
    t0 = time.perf_counter()
    images, _, captions, _ = domain.make_dataset(r.images, seed=r.seed, size=r.size, drop=r.drop, coverage=True)
    vq = model.modules["vq"].float()
    with torch.no_grad():
        codes = encode_dataset(vq, images)
    gpt, text = train_gpt(r, codes, captions, domain.VOCABULARY, log)
    stats = {"sibling_of": f"{folder.name} ({config['recipe']['layers']} layers)",
             "gpt_minutes": round((time.perf_counter() - t0) / 60, 2)}
    save(out, r, vq, gpt, text, stats)
    if (folder / "judge.safetensors").is_file():
        shutil.copy(folder / "judge.safetensors", out / "judge.safetensors")
    log(f"wrote {out}/config.json and model.safetensors ({layers}-layer sibling: {stats['gpt_minutes']} min)")
    return stats
