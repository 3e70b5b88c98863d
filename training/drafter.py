"""Train a draft head for any model the pack loads (self-distilled, as LANTERN does).

    spec-ar train-drafter --model M [--vq V --text-encoder T] --prompts FILE --out DIR
    spec-ar train-drafter --model embedded --out DIR    # captions of its own world

1. **Data**: the target draws its own images for the prompts (``--sample-mode``,
   lossless: ``ar`` or ``sjd``; seeds 0, 1, ...), then reads each one again in a
   single forward to keep its last hidden states, for every guidance branch.
   Shards go to ``--work`` (default ``DIR.work``) as they are made.
2. **Head**: one Llama decoder layer (``--layers``) of the target's width over
   ``fc([token embedding ; feature])`` (``loaders/draft_head.py``); its token
   embeddings start from the target's and stay frozen, as LANTERN's do.  Rotary
   positions: LlamaGen's 2D table for LlamaGen-family targets, 1D otherwise.
3. **Loss** (EAGLE/LANTERN): SmoothL1 between predicted and true next feature,
   plus 0.1 x the cross-entropy of the target's output head on the predicted
   feature against its distribution on the true one, per guidance branch; plus
   ``--cfg-loss`` x the same on the guidance-mixed distributions, which is what
   drafts are judged on.  Input features get LANTERN's uniform noise.  With
   ``--passes k`` (as EAGLE-3's training-time test) the head is also run as the
   2nd .. k-th draft of a chain, on its own earlier outputs, with exactly the
   context drafting gives it (``DraftHead.unrolled``), and those passes' losses
   are added (weights 0.8, 0.64, ...): LANTERN trains the first step only.
4. **Out**: ``DIR/config.json`` and ``DIR/model.safetensors`` (``--drafter DIR``
   loads it), with the held-out acceptance per chain depth in ``config.json``.

Resumable: rerunning the same command skips the shards already made and goes on
from the last saved training step (``--work/train_state.pt``).
"""
from __future__ import annotations

import argparse
import math
import pathlib
import time

import torch
import torch.nn.functional as F

from ..formats.checkpoints import load_file
from ..loaders.draft_head import DraftHead, HeadSpec, save_head
from ..prompt_files import read_prompts
from ..sampling import ConfigError, DecodeConfig, ImageAdapter, SpeculativeDecoder

#: the embedded model's training prompts: scenes other than the quality probe's (seed 12345)
EMBEDDED_PROMPT_SEED = 2025


# -- data ------------------------------------------------------------------------------------
@torch.no_grad()
def features_of(adapter, conditions, tokens: torch.Tensor, guided: bool) -> torch.Tensor:
    """``[R, B, T + 1, H]``: the target's last hidden states for ``tokens`` ``[B, T]``
    (slot 0: the condition's last position, slot ``s + 1``: position ``s``), one
    block of rows per guidance branch it runs."""
    adapter.keep_features = True
    try:
        adapter.prefill(conditions, None, guided)
        first = adapter.features[:, :, -1:]
        adapter.forward(tokens.to(adapter.device))
        return torch.cat([first, adapter.features], 2)
    finally:
        adapter.features = None
        adapter.release()


def make_data(model, prompts, images: int, batch: int, mode: str, work: pathlib.Path, log=print) -> list:
    """Shards of (tokens, features) in ``work``; existing ones are kept (resuming)."""
    from safetensors.torch import save_file

    work.mkdir(parents=True, exist_ok=True)
    decoder = SpeculativeDecoder(model.adapter, DecodeConfig(mode=mode))
    shards = []
    bar = _progress(range(0, images, batch), "drafting data", "batch")
    for start in bar:
        path = work / f"shard_{start // batch:05d}.safetensors"
        shards.append(path)
        if path.is_file():
            continue
        n = min(batch, images - start)
        conditions = [prompts[(start + i) % len(prompts)] for i in range(n)]
        tokens = decoder.generate(conditions, seeds=start).tokens
        feats = features_of(model.adapter, conditions, tokens, decoder.guided)
        tmp = path.with_suffix(".partial")
        save_file({"tokens": tokens.int().cpu().contiguous(),
                   "features": feats.transpose(0, 1).half().cpu().contiguous()}, str(tmp))
        tmp.replace(path)  # a shard is there whole or not at all
    return shards


def load_data(shards) -> tuple[torch.Tensor, torch.Tensor]:
    parts = [load_file(p) for p in shards]
    return torch.cat([p["tokens"] for p in parts]).long(), torch.cat([p["features"] for p in parts])


# -- the head --------------------------------------------------------------------------------
def head_for(model, layers: int) -> DraftHead:
    """A head of the target's width, heads and feed-forward size, its token embeddings
    copied from the target (and frozen)."""
    ad = model.adapter
    spec = getattr(ad, "spec", None)
    hidden = ad.feature_size
    heads = getattr(spec, "n_head", None) or max(1, hidden // 64)
    inter = getattr(spec, "ffn_hidden", None) or 256 * math.ceil(8 * hidden / 3 / 256)
    head = DraftHead(HeadSpec(hidden=hidden, heads=heads, kv_heads=heads, intermediate=inter, layers=layers,
                              vocab=ad.vocab_size, grid=ad.rope_grid))
    table = ad.input_embeddings()
    with torch.no_grad():
        if table is not None:
            head.embed_tokens.weight.copy_(table)
        for name, p in head.named_parameters():
            if name != "embed_tokens.weight" and p.dim() > 1:
                torch.nn.init.normal_(p, 0.0, 0.02)
    head.embed_tokens.weight.requires_grad_(table is None)
    return head


def _mixed(logits, cfg: float):
    """Guidance-mixed logits of ``[R, ...]`` branch logits (linear, as the family's
    default scale), or the one branch."""
    return logits[1] + cfg * (logits[0] - logits[1]) if logits.shape[0] >= 2 else logits[0]


def _passes(head, tokens, feats, rope, passes: int, noise: float = 0.0):
    """``(outputs per pass [N*R, T, H], true next features)`` of a batch: ``tokens``
    ``[N, T]``, ``feats`` ``[N, R, T + 1, H]``."""
    N, R, S, H = feats.shape
    T = S - 1
    x = feats[:, :, :T].reshape(N * R, T, H).float()
    if noise:  # LANTERN's: uniform, scaled by the sequence length
        x = x + (torch.rand_like(x) - 0.5) * noise * 512 / S
    outs = head.unrolled(tokens.repeat_interleave(R, 0), x, rope[:T].expand(N * R, -1, -1, -1), passes)
    return outs, feats[:, :, 1:].reshape(N * R, T, H).float()


def _logits(adapter, h, N: int, R: int):
    """Output-head logits ``[R, N, T, V]`` of features ``[N * R, T, H]``."""
    return adapter.logits_from_features(h.view(N, R, *h.shape[1:]).transpose(0, 1))


def sequence_loss(head, adapter, tokens, feats, rope, cfg: float, cfg_weight: float, noise: float, passes: int):
    """Teacher-forced losses of a batch, summed over the chained passes (pass ``k``
    weighted ``0.8 ** (k - 1)``, on the positions it exists for)."""
    N, R = feats.shape[:2]
    outs, target = _passes(head, tokens, feats, rope, passes, noise)
    with torch.no_grad():
        lt = _logits(adapter, target, N, R)
        pt, pt_mix = torch.softmax(lt, -1), torch.softmax(_mixed(lt, cfg), -1)
    loss, parts = 0.0, {}
    for k, pred in enumerate(outs, 1):
        s = slice(k - 1, None)
        vloss = F.smooth_l1_loss(pred[:, s], target[:, s], reduction="none").mean()
        lp = _logits(adapter, pred, N, R)
        ploss = -(pt[:, :, s] * torch.log_softmax(lp[:, :, s], -1)).sum(-1).mean()
        closs = (-(pt_mix[:, s] * torch.log_softmax(_mixed(lp, cfg)[:, s], -1)).sum(-1).mean()
                 if cfg_weight and R >= 2 else torch.zeros(()))
        loss = loss + 0.8 ** (k - 1) * (vloss + 0.1 * ploss + cfg_weight * closs)
        parts[k] = {"feature": round(vloss.item(), 4), "token": round(ploss.item(), 4),
                    "guided": round(closs.item(), 4)}
    return loss, parts


@torch.no_grad()
def draft_acceptance(head, adapter, tokens, feats, rope, cfg: float, passes: int) -> list[float]:
    """Per chain depth, mean ``sum(min(p, q))`` (teacher-forced, guidance-mixed, no
    top-k): the share of drafts at that depth that exact acceptance keeps, given the
    drafts before them stood."""
    head.eval()
    N, R = feats.shape[:2]
    outs, target = _passes(head, tokens, feats, rope, passes)
    p = torch.softmax(_mixed(_logits(adapter, target, N, R), cfg), -1)
    out = []
    for k, pred in enumerate(outs, 1):
        q = torch.softmax(_mixed(_logits(adapter, pred, N, R), cfg), -1)
        out.append(torch.minimum(p, q).sum(-1)[:, k - 1:-1].mean().item())  # the last slot predicts past the image
    head.train()
    return out


def train(head, adapter, tokens, feats, steps: int, batch: int, lr: float, cfg: float, cfg_weight: float,
          noise: float, passes: int, work: pathlib.Path, seed: int = 0, save_every: int = 200, log=print) -> dict:
    """AdamW (LANTERN's betas, gradients clipped by value 0.5), warmup then cosine;
    resumes from ``work/train_state.pt``."""
    device = next(head.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    held = max(1, len(tokens) // 20)  # 5 % held out
    order = torch.randperm(len(tokens), generator=gen)
    test, fit = order[:held], order[held:]
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    rope = head.rope_table(tokens.shape[1]).to(device)
    state_path, step = work / "train_state.pt", 0
    if state_path.is_file():
        state = load_file(state_path, mmap=False)  # it is saved again over itself as training goes on
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["optimizer"])
        step, gen = state["step"], torch.Generator().manual_seed(seed + state["step"])
        log(f"resuming at step {step} of {steps}")
    head.train()
    warmup = max(1, steps // 30)
    bar = _progress(range(step, steps), "training the head", "step", total=steps, initial=step)
    parts = {}
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr * min((step + 1) / warmup, 0.5 * (1 + math.cos(math.pi * step / steps)))
        pick = fit[torch.randint(0, len(fit), (batch,), generator=gen)]
        loss, parts = sequence_loss(head, adapter, tokens[pick].to(device), feats[pick].to(device), rope, cfg,
                                    cfg_weight, noise, passes)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_value_(params, 0.5)
        opt.step()
        if hasattr(bar, "set_postfix"):
            bar.set_postfix(loss=f"{loss.item():.3f}")
        if (step + 1) % save_every == 0 or step + 1 == steps:
            tmp = state_path.with_suffix(".partial")
            torch.save({"head": head.state_dict(), "optimizer": opt.state_dict(), "step": step + 1}, tmp)
            tmp.replace(state_path)
    held_out = torch.tensor([draft_acceptance(head, adapter, tokens[i].to(device), feats[i].to(device), rope, cfg,
                                              passes) for i in test.split(batch)]).mean(0)
    return {"steps": steps, "final_losses": parts,
            "held_out_acceptance_by_depth": [round(a, 4) for a in held_out.tolist()]}


def _progress(iterable, desc: str, unit: str, **kw):
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm comes with transformers; plain iteration otherwise
        return iterable
    return tqdm(iterable, desc=desc, unit=unit, dynamic_ncols=True, **kw)


# -- the command -----------------------------------------------------------------------------
def run(args, log=print) -> dict:
    from ..loaders.base import resolve_device
    from ..loaders.detect import detect, load_model

    device = resolve_device(args.device)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    if args.prompts:
        prompts = read_prompts(args.prompts, f"--prompts {args.prompts}")
    elif detect(args.model).family == "embedded":  # captions of random scenes of its world
        from ..embedded_tools.quality import scenes_and_prompts

        prompts = scenes_and_prompts(args.images, EMBEDDED_PROMPT_SEED)[1]
    else:
        raise ConfigError("--prompts is needed (a UTF-8 file, one prompt or class id per line) for any model but "
                          "the embedded one")
    if detect(args.model).condition == "class":
        bad = [p for p in prompts if not p.isdigit()]
        if bad:
            raise ConfigError(f"{args.model} is class-conditional: --prompts must hold one class id per line "
                              f"(got {bad[0]!r})")
        prompts = [int(p) for p in prompts]
    out = pathlib.Path(args.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: is a file, not a folder")
    work = pathlib.Path(args.work) if args.work else out.with_name(out.name + ".work")
    model = load_model(args.model, args.vq, args.text_encoder, args.resolution, device=device, dtype=dtype)
    ad = model.adapter
    if type(ad).logits_from_features is ImageAdapter.logits_from_features:
        raise ConfigError(f"{model.name}: its adapter gives no hidden states, so no draft head can read them")
    for module in model.modules.values():
        module.requires_grad_(False)
    t0 = time.perf_counter()
    shards = make_data(model, prompts, args.images, args.data_batch, args.sample_mode, work, log)
    tokens, feats = load_data(shards)
    minutes_data = (time.perf_counter() - t0) / 60
    head = head_for(model, args.layers).to(device)
    cfg = DecodeConfig().with_defaults(getattr(ad, "sampling_defaults", {})).cfg_scale
    t1 = time.perf_counter()
    stats = train(head, ad, tokens, feats, args.steps, args.batch, args.lr,
                  cfg, args.cfg_loss, args.noise, args.passes, work, args.seed, log=log)
    stats.update(images=len(tokens), prompts=len(prompts), sample_mode=args.sample_mode,
                 data_minutes=round(minutes_data, 2), train_minutes=round((time.perf_counter() - t1) / 60, 2),
                 cfg_scale=cfg, cfg_loss=args.cfg_loss, noise=args.noise, lr=args.lr, batch=args.batch,
                 passes=args.passes, layers=args.layers)
    info = {"name": args.name or f"draft head for {model.name}",
            "target": {"name": model.name, "family": model.family, "vocab_size": ad.vocab_size,
                       "hidden_size": ad.feature_size, "grid": list(ad.layout.grid)},
            "training": stats}
    head = head.to(torch.float16 if args.half else torch.float32)
    save_head(head, out, info)
    kept = ", ".join(f"{a:.0%}" for a in stats["held_out_acceptance_by_depth"])
    log(f"wrote {out}/config.json and model.safetensors: drafts kept by chain depth {kept} (held out); data "
        f"{stats['data_minutes']} min, training {stats['train_minutes']} min")
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="spec-ar train-drafter", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="checkpoint file or folder (any family), or 'embedded'")
    ap.add_argument("--vq", help="VQ tokenizer file, where the family keeps it apart (LlamaGen)")
    ap.add_argument("--text-encoder", help="T5 folder for LlamaGen t2i")
    ap.add_argument("--resolution", type=int)
    ap.add_argument("--prompts", help="UTF-8 text file, one prompt (or class id) per line (the embedded model: "
                                      "captions of random scenes of its world when left out)")
    ap.add_argument("--out", required=True, help="folder to write the head to")
    ap.add_argument("--work", help="folder for the data shards and the training state (default: OUT.work)")
    ap.add_argument("--name", help="the head's name in reports")
    ap.add_argument("--images", type=int, default=2048, help="images the target draws (prompts cycled)")
    ap.add_argument("--data-batch", type=int, default=32)
    ap.add_argument("--sample-mode", choices=("ar", "sjd"), default="ar", help="how the target draws them")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--steps", type=int, default=1800)
    ap.add_argument("--batch", type=int, default=16, help="images per training step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--cfg-loss", type=float, default=0.1, help="weight of the guidance-mixed token loss")
    ap.add_argument("--noise", type=float, default=0.2, help="LANTERN's uniform feature noise (0: none)")
    ap.add_argument("--passes", type=int, default=3, help="chained passes trained at once (1: EAGLE's "
                                                          "teacher-forced step only; k: also drafts k deep)")
    ap.add_argument("--half", action="store_true", help="write float16 weights")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", help="cpu, cuda, cuda:N (default: cuda if available)")
    args = ap.parse_args(argv)
    for name in ("images", "data_batch", "layers", "steps", "batch", "passes"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(args, name)})")
    run(args)
    return 0
