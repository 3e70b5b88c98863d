"""GLM-Image DiT Decode: the sampler's GLM-Image prior tokens -> images through the model's DiT stage, with its
steps, guidance and seed set (``decoders/glm_dit.py``'s settings table).  The sampler leaves the DiT to this node
(its own image output shows the token grid), so the 7B DiT runs once per picture."""
from __future__ import annotations

from comfy_api.v0_0_2 import io

from .models import ARModel
from .sampler import Tokens

PROMPT_TOOLTIP = ("The prompt: only its quoted text ('...', \"...\") conditions the DiT, through its ByT5 glyph "
                  "encoder. Empty: the prompt the sampler sampled these tokens for.")


def _setting(s):
    """A widget for one of the DiT stage's settings (:data:`..decoders.glm_dit.SETTINGS`)."""
    cls = io.Int if s.kind == "int" else io.Float
    from ..decoders.glm_dit import FALLBACK_DEFAULTS

    default = int(s.default) if s.kind == "int" else float(s.default)
    whose = ", the pipeline's" if s.name in FALLBACK_DEFAULTS else ""
    return cls.Input(s.name, default=default, min=s.lo, max=s.hi, step=s.step,
                     tooltip=f"{s.help[0].upper()}{s.help[1:]} (default {s.default:g}{whose}).")


class GlmDiTDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        from ..decoders.glm_dit import SETTINGS

        return io.Schema(
            node_id="SpecAR_GlmDiTDecode", display_name="GLM-Image DiT Decode", category="SpeculativeAR",
            description="GLM-Image's second stage: the sampler's prior tokens -> images through its DiT "
                        "(diffusers' GlmImagePipeline), with the DiT's steps, guidance and seed set here (the "
                        "sampler's own image output shows the token grid).",
            inputs=[
                ARModel.Input("model", tooltip="A GLM-Image release with its DiT stage (transformer/, vae/, "
                                               "text_encoder/, tokenizer/, scheduler/), from Load AR Image Model."),
                Tokens.Input("tokens", tooltip="The sampler's tokens output, sampled with this model."),
                io.String.Input("prompt", multiline=True, default="", tooltip=PROMPT_TOOLTIP),
                *[_setting(s) for s in SETTINGS.values()],
            ],
            outputs=[io.Image.Output(display_name="images", tooltip="The DiT's pictures, one per token grid.")],
        )

    @classmethod
    def execute(cls, model, tokens, prompt="", **settings):
        import comfy.model_management as mm
        import comfy.utils

        from ..decoders.glm_dit import SETTINGS
        from ..loaders import glm_image
        from ..loaders.base import decode_in_chunks

        values = {n: s.check(settings.get(n, s.default), n) for n, s in SETTINGS.items()}
        loaded = model.loaded
        if loaded.family != glm_image.FAMILY_NAME:
            raise ValueError(f"model: {loaded.name} is not GLM-Image; GLM-Image DiT Decode renders GLM-Image's "
                             "prior tokens (other models: the sampler's images, or VQ Decode)")
        if not isinstance(loaded.decode, glm_image.PriorDecode):
            raise ValueError(f"model: {loaded.name} has no DiT stage: "
                             f"{loaded.info.get('no_decoder') or 'it was loaded without one'}")
        if tokens.model_name != loaded.name:
            raise ValueError(f"tokens: sampled with {tokens.model_name}, not with the connected model "
                             f"{loaded.name}; connect the model the sampler used")
        size = tuple(tokens.size) if tokens.size else None
        if size and size != (loaded.info["width"], loaded.info["height"]):
            loaded = loaded.resize(size)  # the size the sampler made them at
        text = prompt.strip() or (tokens.prompt or "").strip()
        if not text:
            raise ValueError("prompt: empty, and the tokens carry no prompt: give the prompt they were sampled for")
        decode = glm_image.PriorDecode(loaded.decode.dit, loaded.adapter, **values)
        grid = tokens.tokens
        try:
            decode.prior(grid)
        except ValueError as err:
            raise ValueError(f"tokens: {err}") from None
        mm.throw_exception_if_processing_interrupted()
        # the DiT's turn: room for its weights and one image's work made among ComfyUI's models, then the AR
        # stage moves out of the way as the model's stages wait (loaders/stages.py) and the DiT comes in
        mm.free_memory(decode.dit.weight_bytes() + loaded.decode_bytes_per_image, loaded.device)
        loaded.turns.turn("decoding")
        steps, n = values["steps"], len(grid)
        bar = comfy.utils.ProgressBar(steps * n)
        finished = [0]  # images decoded by earlier chunks

        def run(chunk):
            base = finished[0] * steps

            def progress(done, total):  # after each DiT step; raises when the run is interrupted
                mm.throw_exception_if_processing_interrupted()
                bar.update_absolute(base + done * len(chunk), steps * n)

            images = decode(chunk, prompts=[text] * len(chunk), progress=progress)
            finished[0] += len(chunk)
            return images

        images = decode_in_chunks(run, grid, loaded.decode_bytes_per_image, loaded.device)
        return io.NodeOutput(images.permute(0, 2, 3, 1))
