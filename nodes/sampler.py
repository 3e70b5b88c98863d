"""Speculative AR Sampler and VQ Decode."""
from __future__ import annotations

import time
from dataclasses import dataclass

from comfy_api.v0_0_2 import io

from . import common
from .models import ARModel, Drafter, VQDecoder

Tokens = io.Custom("SPEC_AR_TOKENS")
Report = io.Custom("SPEC_AR_REPORT")
RESOLUTIONS = ["model default", "256", "384", "512", "768", "1024"]
UNLOAD = "unload_after_run"


@dataclass
class TokenGrid:
    """What flows along a SPEC_AR_TOKENS link."""

    tokens: object  # int64 [B, rows, cols]
    model_name: str
    prompt: str | None = None  # the condition sampled for (GLM-Image DiT Decode conditions its DiT on it)
    size: tuple | None = None  # (width, height) of the images sampled for, where the family says


def _widget(w: dict):
    """A ComfyUI input for one entry of :func:`common.sampler_widgets` (the knob table)."""
    optional = {"optional": True} if w["appended"] else {}
    if w["widget"] == "combo":
        return io.Combo.Input(w["label"], options=w["options"], default=w["default"], tooltip=w["tooltip"],
                              **optional)
    cls = io.Int if w["kind"] == "int" else io.Float
    extra = {"display_mode": io.NumberDisplay.slider} if w["widget"] == "slider" else {}
    return cls.Input(w["label"], default=w["default"], min=w["min"], max=w["max"], step=w["step"],
                     tooltip=w["tooltip"], **extra, **optional)


def _decoding_inputs(appended: bool = False) -> list:
    """The knob table's widgets, with the family-defaults switch before the sampling ones;
    ``appended``: the knobs added since workflows were shared, which go last."""
    from ..sampling.config import SAMPLING_FIELDS

    out = []
    for w in common.sampler_widgets():
        if w["appended"] != appended:
            continue
        if w["field"] == SAMPLING_FIELDS[0]:
            out.append(io.Boolean.Input(common.FAMILY_DEFAULTS, default=True,
                                        tooltip="Use the model family's reference CFG, top-k, top-p and temperature; "
                                                "turn off to use the four values below."))
        out.append(_widget(w))
    return out


def _mode_input(modes, helps):
    """The mode combo, carrying to the web page which knobs each mode reads (``web/sampler_knobs.js``);
    set after construction because ``Combo.Input`` takes no ``extra_dict`` in ComfyUI 0.3.x."""
    mode = io.Combo.Input("mode", options=list(modes), default="sjd",
                          tooltip=" ".join(f"{m}: {h}." for m, h in helps.items()))
    mode.extra_dict = {**getattr(mode, "extra_dict", {}), common.KNOB_VISIBILITY: common.knob_visibility()}
    return mode


def code_grid_image(tokens):
    """Without a decoder: the code ids as colours, one 4-px square per token."""
    import torch

    t = tokens.long()
    rgb = torch.stack([(t * 97) % 256, (t * 57 + 80) % 256, (t * 31 + 160) % 256], -1).float() / 255
    return rgb.repeat_interleave(4, 1).repeat_interleave(4, 2)


class SpeculativeARSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        from ..sampling.config import MODE_HELP, MODES

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
                _mode_input(MODES, MODE_HELP),
                *_decoding_inputs(),
                io.Int.Input("seed", default=0, min=0, max=2**63 - 1, control_after_generate=True,
                             tooltip="Image i of a batch uses seed + i, so it matches a batch-of-one render."),
                io.Int.Input("batch_size", default=1, min=1, max=64, tooltip="Images per prompt."),
                io.Combo.Input("resolution", options=RESOLUTIONS, default="model default",
                               tooltip="Image size for families that offer several (LlamaGen 256/384/512)."),
                VQDecoder.Input("vq", optional=True,
                                tooltip="A decoder other than the model's own; without any, the image output "
                                        "shows the token grid and VQ Decode turns the tokens into pictures."),
                Drafter.Input(common.DRAFTER_INPUT, optional=True,
                              tooltip="A draft model (from Load Drafter) in place of Jacobi self-drafting: it "
                                      "proposes drafter_depth tokens per forward from the accepted prefix; the "
                                      "window, draft_init and draft_coupling knobs then do not apply."),
                io.Boolean.Input(UNLOAD, default=False, optional=True,
                                 tooltip="After the images are made, give the model's memory (GPU and CPU) back "
                                         "for the rest of the workflow; the next run loads it again."),
                *_decoding_inputs(appended=True),
            ],
            outputs=[
                io.Image.Output(display_name="images"),
                io.String.Output(display_name="report", tooltip="Forward passes, tokens per forward, latency."),
                io.Int.Output(display_name="nfe", tooltip="Forward passes (NFE) for the first image."),
                io.Float.Output(display_name="latency_s", tooltip="Seconds for the batch, device-synchronised."),
                io.Float.Output(display_name="tokens_per_forward"),
                io.Image.Output(display_name="accept_map", tooltip="How each token was obtained: blue sampled, "
                                "green accepted draft, red resampled, amber committed by a VVS skip, grey forced, "
                                "purple drawn in a lower row (row-parallel, unverified)."),
                Report.Output(display_name="report_data", tooltip="For the report table and plot nodes."),
                Tokens.Output(display_name="tokens", tooltip="Image tokens, for VQ Decode (GLM-Image: for "
                                                                             "GLM-Image DiT Decode)."),
            ],
        )

    @classmethod
    def validate_inputs(cls, mode=None, resolution=None, **widgets):
        from ..sampling.config import MODES

        combos = {w["label"]: (widgets.get(w["label"]), w["options"]) for w in common.sampler_widgets()
                  if w["widget"] == "combo"}
        return common.check_choices(mode=(mode, list(MODES)), resolution=(resolution, RESOLUTIONS), **combos)

    @classmethod
    def execute(cls, model, prompt, mode, seed, batch_size, resolution, negative_prompt="", vq=None,
                family_defaults=True, drafter=None, unload_after_run=False, **widgets):
        import comfy.model_management as mm
        import comfy.utils

        from ..loaders.base import decode_in_chunks
        from ..sampling import SpeculativeDecoder
        from ..sampling.memory import check_fits

        # every check before any model work
        config = common.decode_config(mode, family_defaults, **widgets)
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
        stage = getattr(decode, "stage", None)  # a decoder with a node of its own (GLM-Image's DiT) runs there
        if stage:
            decode = None
        if drafter is not None and not config.drafts:
            raise ValueError(f"drafter: a draft model drafts for the speculative modes, not mode {mode!r}; "
                             "disconnect it or choose another mode")
        # k against the codebook, named "k"; a draft model checked against this (maybe resized) model
        decoder = SpeculativeDecoder(loaded.adapter, config, drafter=drafter, surface="node")
        layout = loaded.adapter.layout
        decode_bytes = (vq.bytes_per_image(layout.grid) if vq is not None and vq.bytes_per_image
                        else loaded.decode_bytes_per_image if vq is None else 0)
        if decode is not None:
            check_fits({"VQ decoder": decode_bytes}, 1, loaded.device, what="decode")

        per_image = sum(decoder.memory_per_image(conditions, negatives).values())
        model.ready(memory_required=per_image * batch_size + decode_bytes)  # room ComfyUI leaves for the run
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

        label = config.label() if drafter is None else decoder.config.label()  # "sjd depth=4"
        try:
            result = decoder.generate(conditions, negatives, seeds=seed, callback=progress)
            tokens = result.image_tokens(layout)
            images = (decode_in_chunks(decode, tokens, decode_bytes, loaded.device).permute(0, 2, 3, 1)
                      if decode is not None else code_grid_image(tokens))
        finally:
            name, warnings, decoded = loaded.name, list(loaded.warnings), decode is not None
            size = (loaded.info["width"], loaded.info["height"]) if loaded.info.get("width") and \
                loaded.info.get("height") else None
            why = loaded.info.get("no_decoder")
            if unload_after_run:  # nothing here may keep the weights alive
                decoder = decode = loaded = None
                model.release()
        # the node's in-page preview ends on the finished picture, not on the last partial one
        bar.update_absolute(layout.length, layout.length, ("JPEG", common.image_preview(images[0]), 512))
        reports = result.reports
        first = reports[0]
        rows = [common.report_row(r, label, str(condition)) for r in reports]
        text = "\n".join(r.summary() for r in reports[:1])
        text += (f"\npreviews: {throttle.count} in {throttle.spent * 1000:.0f} ms "
                 f"({throttle.spent / max(first.latency_s, 1e-9):.1%} of sampling)")
        if stage:
            text += f"\n(the image shows the token grid: connect the tokens output to {stage} for the picture)"
        elif not decoded:
            text += (f"\n({why}; the image shows the token grid)" if why else
                     "\n(no VQ decoder: the image shows the token grid; connect a decoder or VQ Decode)")
        text += "".join(f"\nwarning: {w}" for w in warnings)
        return io.NodeOutput(images, text, first.nfe, first.latency_s, first.tokens_per_forward,
                             common.accept_map_images(reports, layout), rows,
                             TokenGrid(tokens.cpu(), name, str(condition), size),
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
