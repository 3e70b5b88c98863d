"""Speculative AR Sampler and VQ Decode."""
from __future__ import annotations

import time
from dataclasses import dataclass

from comfy_api.v0_0_2 import io

from . import common
from .models import ARModel, VQDecoder

Tokens = io.Custom("SPEC_AR_TOKENS")
Report = io.Custom("SPEC_AR_REPORT")
MODES = ["ar", "sjd", "gsd", "lantern", "vvs"]
INITS = ["random", "repeat-left", "repeat-above", "sample-left", "sample-above"]
RESOLUTIONS = ["model default", "256", "384", "512", "768", "1024"]
SCHEDULES = ["uniform", "similarity"]


@dataclass
class TokenGrid:
    """What flows along a SPEC_AR_TOKENS link."""

    tokens: object  # int64 [B, rows, cols]
    model_name: str


def _slider(cls, id, default, lo, hi, step, tooltip):
    return cls.Input(id, default=default, min=lo, max=hi, step=step, tooltip=tooltip,
                     display_mode=io.NumberDisplay.slider)


def code_grid_image(tokens):
    """Without a decoder: the code ids as colours, one 4-px square per token."""
    import torch

    t = tokens.long()
    rgb = torch.stack([(t * 97) % 256, (t * 57 + 80) % 256, (t * 31 + 160) % 256], -1).float() / 255
    return rgb.repeat_interleave(4, 1).repeat_interleave(4, 2)


def _label(config) -> str:
    if config.mode == "gsd":
        return f"gsd G={config.group_size}"
    if config.mode == "lantern":
        return f"lantern k={config.lantern_k} d={config.lantern_delta}"
    if config.mode == "vvs":
        return f"vvs i={config.skip_interval}"
    return config.mode


class SpeculativeARSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SpecAR_Sampler", display_name="Speculative AR Sampler", category="SpeculativeAR",
            description="Generates images with an autoregressive model, several image tokens per forward pass: "
                        "SJD (lossless), GSD and LANTERN (relaxed acceptance), VVS (verification skipping).",
            inputs=[
                ARModel.Input("model", tooltip="From Load AR Image Model."),
                io.String.Input("prompt", multiline=True, default="a red circle in the top left on a striped "
                                "blue background", tooltip="What to draw. Class-conditional models take a class "
                                "id (an integer) here. Connect a Prompt List to render many prompts."),
                io.String.Input("negative_prompt", multiline=True, default="", optional=True,
                                tooltip="Only for families with negative-prompt guidance; leave empty otherwise."),
                io.Combo.Input("mode", options=MODES, default="sjd",
                               tooltip="ar: one token per forward (reference). sjd: Speculative Jacobi Decoding, "
                                       "same distribution as ar. gsd: grouped acceptance (faster, lossy). "
                                       "lantern: latent-neighbourhood acceptance. vvs: lantern plus skipped "
                                       "verifications."),
                _slider(io.Int, "window", 16, 1, 64, 1, "Draft tokens scored per forward pass (SJD paper: 16)."),
                io.Combo.Input("draft_init", options=INITS, default="random",
                               tooltip="How new draft positions start: random tokens, a copy of the token to the "
                                       "left / above, or a sample from that token's distribution."),
                _slider(io.Int, "G", 10, 1, 200, 1, "GSD group size: how many likely tokens around a draft count "
                                                    "as interchangeable (paper: 10 for quality, 50 for speed)."),
                _slider(io.Float, "gsd_delta", 0.15, 0.0, 1.0, 0.01,
                        "GSD: group members whose probability differs from the draft's by more than this are "
                        "dropped."),
                _slider(io.Int, "k", 300, 1, 2000, 1, "LANTERN/VVS neighbourhood size in the codebook's latent "
                                                     "space (paper: 1000)."),
                _slider(io.Float, "lantern_delta", 0.1, 0.0, 1.0, 0.01,
                        "LANTERN/VVS total-variation budget: 0 is exact, larger accepts more."),
                _slider(io.Int, "skip_interval", 2, 2, 8, 1, "VVS: every i-th step commits without verifying."),
                io.Combo.Input("vvs_schedule", options=SCHEDULES, default="uniform",
                               tooltip="VVS: skip every i-th verification (uniform), or when the drafts' paths "
                                       "agree by at least the threshold (similarity)."),
                _slider(io.Float, "skip_threshold", 0.7, -1.0, 1.0, 0.01,
                        "VVS similarity schedule: skip a verification when the drafts agree this much."),
                io.Boolean.Input("family_defaults", default=True,
                                 tooltip="Use the model family's reference CFG, top-k, top-p and temperature; "
                                         "turn off to use the four values below."),
                _slider(io.Float, "cfg", 3.0, 0.0, 20.0, 0.1, "Classifier-free guidance scale (1 = none)."),
                io.Int.Input("top_k", default=0, min=0, max=1 << 20, tooltip="Keep the k most likely tokens; 0 = off."),
                _slider(io.Float, "top_p", 1.0, 0.01, 1.0, 0.01, "Nucleus sampling; 1 = off."),
                _slider(io.Float, "temperature", 1.0, 0.0, 3.0, 0.01, "0 = greedy."),
                io.Int.Input("seed", default=0, min=0, max=2**63 - 1, control_after_generate=True,
                             tooltip="Image i of a batch uses seed + i, so it matches a batch-of-one render."),
                io.Int.Input("batch_size", default=1, min=1, max=64, tooltip="Images per prompt."),
                io.Combo.Input("resolution", options=RESOLUTIONS, default="model default",
                               tooltip="Image size for families that offer several (LlamaGen 256/384/512)."),
                VQDecoder.Input("vq", optional=True,
                                tooltip="A decoder other than the model's own; without any, the image output "
                                        "shows the token grid and VQ Decode turns the tokens into pictures."),
            ],
            outputs=[
                io.Image.Output(display_name="images"),
                io.String.Output(display_name="report", tooltip="Forward passes, tokens per forward, latency."),
                io.Int.Output(display_name="steps", tooltip="Forward passes (NFE) for the first image."),
                io.Float.Output(display_name="latency", tooltip="Seconds for the batch, device-synchronised."),
                io.Float.Output(display_name="tokens_per_forward"),
                io.Image.Output(display_name="accept_map", tooltip="How each token was obtained: blue sampled, "
                                "green accepted draft, red resampled, amber committed by a VVS skip, grey forced."),
                Report.Output(display_name="report_data", tooltip="For the report table and plot nodes."),
                Tokens.Output(display_name="tokens", tooltip="Image tokens, for VQ Decode."),
            ],
        )

    @classmethod
    def validate_inputs(cls, mode=None, draft_init=None, vvs_schedule=None, resolution=None):
        return common.check_choices(mode=(mode, MODES), draft_init=(draft_init, INITS),
                                    vvs_schedule=(vvs_schedule, SCHEDULES), resolution=(resolution, RESOLUTIONS))

    @classmethod
    def execute(cls, model, prompt, mode, window, draft_init, G, gsd_delta, k, lantern_delta, skip_interval,
                vvs_schedule, skip_threshold, family_defaults, cfg, top_k, top_p, temperature, seed, batch_size,
                resolution, negative_prompt="", vq=None):
        import comfy.model_management as mm
        import comfy.utils

        from ..loaders.base import decode_in_chunks
        from ..sampling import SpeculativeDecoder
        from ..sampling.memory import check_fits

        # every check before any model work
        config = common.decode_config(mode, family_defaults, cfg, top_k, top_p, temperature, vvs_schedule,
                                      window=window, draft_init=draft_init, G=G, gsd_delta=gsd_delta, k=k,
                                      lantern_delta=lantern_delta, skip_interval=skip_interval,
                                      skip_threshold=skip_threshold)
        loaded = model.loaded
        if resolution != "model default" and int(resolution) != loaded.resolution:
            if loaded.resize is None:
                raise ValueError(f"resolution: {loaded.name} makes {loaded.resolution} px images only "
                                 f"(got {resolution}); choose 'model default'")
            loaded = loaded.resize(int(resolution))  # the family checks the size and names what it allows
        condition = prompt.strip()
        if loaded.condition == "class":
            if not condition.isdigit():
                raise ValueError(f"prompt: {loaded.name} is class-conditional; give a class id (an integer)")
            condition = int(condition)
        elif not condition:
            raise ValueError("prompt: empty; describe the image")
        negatives = [negative_prompt.strip()] * batch_size if negative_prompt and negative_prompt.strip() else None
        conditions = [condition] * batch_size
        loaded.adapter.check_conditions(conditions, negatives)
        decode = vq.decode if vq is not None else loaded.decode
        decoder = SpeculativeDecoder(loaded.adapter, config)  # checks k against the codebook, before any loading
        layout = loaded.adapter.layout
        decode_bytes = (vq.bytes_per_image(layout.grid) if vq is not None and vq.bytes_per_image
                        else loaded.decode_bytes_per_image if vq is None else 0)
        if decode is not None:
            check_fits({"VQ decoder": decode_bytes}, 1, loaded.device, what="decode")

        model.ready()
        bar = comfy.utils.ProgressBar(layout.length)
        throttle = common.PreviewThrottle()

        def progress(event):
            mm.throw_exception_if_processing_interrupted()
            done = min(event.committed)
            preview = None
            if decode is not None and throttle.due() and done < layout.length:
                t = time.perf_counter()
                preview = ("JPEG", common.partial_preview(decode, event.tokens, done, layout), 512)
                throttle.record(time.perf_counter() - t)
            bar.update_absolute(done, layout.length, preview)

        result = decoder.generate(conditions, negatives, seeds=seed, callback=progress)
        tokens = result.image_tokens(layout)
        images = (decode_in_chunks(decode, tokens, decode_bytes, loaded.device).permute(0, 2, 3, 1)
                  if decode is not None else code_grid_image(tokens))
        reports = result.reports
        first = reports[0]
        label = _label(config)
        rows = [common.report_row(r, label, str(condition)) for r in reports]
        text = "\n".join(r.summary() for r in reports[:1])
        text += (f"\npreviews: {throttle.count} in {throttle.spent * 1000:.0f} ms "
                 f"({throttle.spent / max(first.latency_s, 1e-9):.1%} of sampling)")
        if decode is None:
            text += "\n(no VQ decoder: the image shows the token grid; connect a decoder or VQ Decode)"
        text += "".join(f"\nwarning: {w}" for w in loaded.warnings)
        return io.NodeOutput(images, text, first.nfe, first.latency_s, first.tokens_per_forward,
                             common.accept_map_images(reports, layout), rows, TokenGrid(tokens.cpu(), loaded.name),
                             ui=common.report_ui(reports))


class VQDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SpecAR_VQDecode", display_name="VQ Decode", category="SpeculativeAR",
            description="Image tokens from the sampler -> images, with a VQ decoder.",
            inputs=[Tokens.Input("tokens", tooltip="The sampler's tokens output."),
                    VQDecoder.Input("vq", tooltip="From Load VQ Decoder.")],
            outputs=[io.Image.Output(display_name="images")],
        )

    @classmethod
    def execute(cls, tokens, vq):
        from ..loaders.base import decode_in_chunks

        grid = tuple(tokens.tokens.shape[1:])
        per_image = vq.bytes_per_image(grid) if vq.bytes_per_image else 0
        return io.NodeOutput(decode_in_chunks(vq.decode, tokens.tokens, per_image, vq.device).permute(0, 2, 3, 1))
