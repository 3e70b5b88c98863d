"""How ``tests/reference/glm_image.json`` was recorded: transformers' own GLM-Image generation (transformers 5.24.0,
``GlmImageForConditionalGeneration.generate`` and ``GlmImageProcessor``; torch 2.13.0, CPU), called as diffusers'
``GlmImagePipeline.generate_prior_tokens`` (0.42.1) calls it, on the tiny folder of ``glm_image_files.py``.  Not a
test; run by hand from the repository root, in the pack's environment (transformers >= 5.0 is the pack's own
requirement for this family)::

    .venv/bin/python -m tests.glm_image_reference /tmp/glm-image-ref/GLM-Image tests/reference

It writes the folder, then for each prompt of :data:`PROMPTS`, at :data:`WIDTH` x :data:`HEIGHT`:

* ``processor.apply_chat_template([[user turn with the prompt's text]], tokenize=True, padding=False,
  target_h=HEIGHT, target_w=WIDTH, return_dict=True, return_tensors="pt")``, as the pipeline (its prompt ids and
  ``image_grid_thw``);
* ``model.generate(**inputs, max_new_tokens=<preview + large grid + 1>)`` on the model loaded in float32 with
  ``attn_implementation="eager"``, greedy (``do_sample=False``: a recorded stream must not depend on a random
  generator; the pipeline samples), with one logits processor standing for the pack's departure: ids from the
  image start on are masked at the grids' places and the image end is forced as the last token (a random tiny
  model would otherwise draw non-code ids inside the grids);
* the M-RoPE positions ``[3, L]`` the model's language model receives at every call (a forward pre-hook): the
  prompt's (prefill), then those of each token fed back (``stream_positions``: stream index ``k`` at column ``k``).
"""
from __future__ import annotations

import json
import pathlib
import sys

PROMPTS = ["a red fox in snow", "poster with the word hello , at dawn"]
WIDTH, HEIGHT = 96, 64  # a 2 x 3 large grid and a 13 x 19 preview: 254 stream tokens


def record(folder: str, out: str) -> None:
    import torch
    import transformers
    from transformers import GlmImageForConditionalGeneration, GlmImageProcessor, LogitsProcessor

    from .glm_image_files import write_glm_image

    folder, out = pathlib.Path(folder).resolve(), pathlib.Path(out).resolve()
    write_glm_image(folder)
    processor = GlmImageProcessor.from_pretrained(str(folder / "processor"))
    model = GlmImageForConditionalGeneration.from_pretrained(str(folder / "vision_language_encoder"),
                                                             dtype=torch.float32, attn_implementation="eager").eval()
    start, end = model.config.image_start_token_id, model.config.image_end_token_id
    seen: list[torch.Tensor] = []
    model.model.language_model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["position_ids"].clone()), with_kwargs=True)

    class Departure(LogitsProcessor):
        """The pack's grammar: codes only at the grids' places, the image end forced last."""

        def __init__(self, prompt: int, n: int):
            self.prompt, self.n = prompt, n

        def __call__(self, input_ids, scores):
            k = input_ids.shape[1] - self.prompt  # the stream index about to be drawn
            scores = scores.clone()
            if k < self.n:
                scores[:, start:] = -float("inf")
            else:
                scores[:] = -float("inf")
                scores[:, end] = 0.0
            return scores

    records = []
    for prompt in PROMPTS:
        messages = [[{"role": "user", "content": [{"type": "text", "text": prompt}]}]]
        inputs = processor.apply_chat_template(messages, tokenize=True, padding=False, target_h=HEIGHT, target_w=WIDTH,
                                               return_dict=True, return_tensors="pt")
        grids = inputs["image_grid_thw"].tolist()
        n = sum(h * w for _, h, w in grids)  # as _compute_generation_params: max_new_tokens = n + 1
        ids = inputs["input_ids"]
        seen.clear()
        with torch.no_grad():
            output = model.generate(**inputs, max_new_tokens=n + 1, do_sample=False,
                                    logits_processor=[Departure(ids.shape[1], n)])
        stream = output[0, ids.shape[1]:].tolist()
        assert len(stream) == n + 1 and stream[-1] == end and max(stream[:-1]) < start, stream
        prefill, steps = seen[0][:, 0], torch.cat([p[:, 0] for p in seen[1:]], 1)
        assert steps.shape[1] == n, steps.shape  # each fed token once: the stream's first n
        records.append({"prompt": prompt, "ids": ids[0].tolist(), "image_grid_thw": grids, "stream": stream,
                        "prefill_positions": prefill.tolist(), "stream_positions": steps.tolist()})
    record = {"source": f"transformers {transformers.__version__} GlmImageForConditionalGeneration.generate "
                        "(tests/glm_image_reference.py)", "width": WIDTH, "height": HEIGHT, "records": records}
    out.mkdir(parents=True, exist_ok=True)
    (out / "glm_image.json").write_text(json.dumps(record))
    print(f"recorded {len(records)} greedy streams of {len(records[0]['stream'])} tokens in {out / 'glm_image.json'}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    record(*sys.argv[1:3])
