"""What happened while an image was decoded: the figures nodes and benchmarks read."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

# How each token of the stream was obtained (the accept map).
PENDING, SAMPLED, ACCEPTED, RESAMPLED, COMMITTED, FORCED, ROW_DRAWN = range(7)
ORIGINS = {
    SAMPLED: "sampled from the target (AR step, first token or bonus)",
    ACCEPTED: "accepted draft",
    RESAMPLED: "resampled after a rejection",
    COMMITTED: "committed without verification (VVS skip)",
    FORCED: "forced structural token",
    ROW_DRAWN: "drawn in a lower row, committed without verification (row-parallel)",
}


@dataclass
class DecodeReport:
    """Per image.  ``nfe`` counts target forward passes, the prefill included, so
    plain AR has ``nfe == tokens``.  ``mean_accepted_length`` is tokens per
    *verified* forward (LANTERN's MAL); ``tokens_per_forward`` also counts tokens
    committed by skipped verifications (VVS's TPF).  Timings are for the whole
    batch, measured with device synchronisation."""

    mode: str
    seed: int
    tokens: int
    nfe: int
    tokens_per_forward: float
    mean_accepted_length: float
    accepted_length_histogram: list[int]  # index n: verified steps that produced n tokens
    skipped_verifications: int
    unverified_tokens: int  # committed by skipped verifications (structural ones included)
    draft_stability: float  # share of re-drafted positions whose draft survived a pass (coupled drafts: high)
    origins: list[int]  # one ORIGINS code per stream position
    step_kinds: str  # per step: "P" prefill, "V" verified forward, "S" skipped verification
    latency_s: float
    model_time_s: float  # inside the target model's calls
    engine_time_s: float  # outside every model call
    batch_size: int
    device: str
    memory_mb: float  # engine state and KV cache at the end (CPU); peak allocated during decoding (CUDA)
    settings: dict = field(default_factory=dict)
    drafter: str = ""  # the draft model, if one drafted (else Jacobi drafts)
    drafter_time_s: float = 0.0  # inside the draft model's calls
    window_choice: str = ""  # why the window on auto is the width it is (sampling/window.py)

    def origin_counts(self) -> dict[str, int]:
        return {name: self.origins.count(code) for code, name in ORIGINS.items()}

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        if self.mode == "ar":
            drafts = ""
        elif self.window_choice and not self.settings.get("window"):
            drafts = "window on auto: plain AR steps, faster here than any window, "
        elif self.drafter:
            drafts = f"drafts from {self.drafter} ({self.drafter_time_s * 1000:.0f} ms), "
        else:
            drafts = (f"{self.settings.get('draft_coupling', 'none')} coupling: drafts kept "
                      f"{self.draft_stability:.0%}, window {self.settings.get('window')}"
                      f"{' (auto)' if self.window_choice else ''}, ")
        return (
            f"{self.mode}: {self.tokens} tokens in {self.nfe} forwards "
            f"({self.tokens_per_forward:.2f} tokens/forward, MAL {self.mean_accepted_length:.2f}, {drafts}"
            f"{self.skipped_verifications} skipped), {self.latency_s * 1000:.0f} ms for a batch of "
            f"{self.batch_size} ({self.engine_time_s / max(self.latency_s, 1e-9):.0%} outside model forwards)"
        )


def build_reports(st, config, timer, memory_mb: float, device, drafter: str = "",
                  window_choice: str = "") -> list[DecodeReport]:
    """Origins, counts and histograms, rebuilt from the step log."""
    B, T = st.batch, st.length
    device = st.seq.device
    origins, nfe, hist, skipped, unverified = _counts(st)
    stability = st.draft_stability()
    kinds = "".join(k for k, *_ in st.log)
    settings = config.to_dict()
    return [
        DecodeReport(
            mode=config.mode, seed=st.seeds[b], tokens=T, nfe=nfe[b], tokens_per_forward=T / nfe[b],
            mean_accepted_length=(T - unverified[b]) / nfe[b], accepted_length_histogram=hist[b],
            skipped_verifications=skipped[b], unverified_tokens=unverified[b], draft_stability=stability[b],
            origins=origins[b],
            step_kinds=kinds, latency_s=timer.total, model_time_s=timer.model_total,
            engine_time_s=timer.total - sum(timer.spent.values()), batch_size=B,
            device=str(device), memory_mb=memory_mb, settings=settings,
            drafter=drafter, drafter_time_s=timer.spent["drafter"], window_choice=window_choice,
        )
        for b in range(B)
    ]


def _counts(st):
    """Each image's origins, forwards, accepted-length histogram, skipped verifications and unverified
    tokens, counted in Python from the step log (:func:`_host_log`: its tensors read at once; counting
    on the device took a few operations an entry, 2-7 ms an image of 256 tokens)."""
    B, T = st.batch, st.length
    log = _host_log(st.log, B)
    row_drawn = (st.fixed[:, :T] >= 0).tolist() if st.fixed is not None else None
    forced = st.forced_host()[:T] if st.any_forced else None
    counts = [], [], [], [], []
    for b in range(B):
        origin, hist = [PENDING] * T, [0] * (st.max_window + 2)
        nfe = skipped = unverified = 0
        for kind, before, after, flag, new in log:
            before, after, flag = before[b], after[b], flag[b]
            span = max(min(after, T) - before, 0)  # (inside the stream: a slice given more items would grow the list)
            if kind == "S":
                origin[before:before + span] = [COMMITTED] * span
                skipped += bool(flag)
                unverified += after - before
            else:
                origin[before:before + span] = [ACCEPTED] * span
                if before <= new[b] < before + span:  # the drawn token (past the end when all stood)
                    origin[new[b]] = RESAMPLED if flag else SAMPLED
                if before < T:
                    nfe += 1
                    hist[min(after - before, len(hist) - 1)] += 1
        if row_drawn is not None:
            origin = [ROW_DRAWN if r else o for o, r in zip(origin, row_drawn[b])]
        if forced is not None:
            origin = [FORCED if f else o for o, f in zip(origin, forced)]
        for out, value in zip(counts, (origin, nfe, hist, skipped, unverified)):
            out.append(value)
    return counts


def _host_log(log: list[tuple], batch: int) -> list[tuple]:
    """The step log with each value a host list of ``batch`` numbers (a skip's drawn token None): its
    tensor entries stacked and read to the host in one go (a batch of one on the host step logs host
    numbers already: engine._commit_on_host)."""
    tensors = [v for _, *entry in log for v in entry if isinstance(v, torch.Tensor)]
    read = iter(torch.stack(tensors).tolist() if tensors else ())
    def host(v):
        return None if v is None else next(read) if isinstance(v, torch.Tensor) else [v] * batch
    return [(kind, *map(host, entry)) for kind, *entry in log]


#: accept-map colours (RGB) per origin code
COLOURS = {
    PENDING: (0, 0, 0),
    SAMPLED: (66, 133, 244),  # blue
    ACCEPTED: (52, 168, 83),  # green
    RESAMPLED: (234, 67, 53),  # red
    COMMITTED: (251, 188, 5),  # amber
    FORCED: (160, 160, 160),  # grey
    ROW_DRAWN: (171, 71, 188),  # purple
}


def accept_map(origins: list[int], row_stride: int, scale: int = 8):
    """How each token was obtained, as an RGB uint8 array laid out in raster rows
    (structural columns included), each token a ``scale``-pixel square."""
    import numpy as np

    codes = np.asarray(origins, dtype=np.int64)
    rows = -(-codes.size // row_stride)
    grid = np.zeros(rows * row_stride, dtype=np.int64)
    grid[: codes.size] = codes
    palette = np.array([COLOURS[c] for c in sorted(COLOURS)], dtype=np.uint8)
    img = palette[grid.reshape(rows, row_stride)]
    return img.repeat(scale, 0).repeat(scale, 1)
