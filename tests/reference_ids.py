"""Prompt ids and stream grammar as each family's reference code produces them, recorded by running that
code, unmodified and outside this repository, on the tiny tokenizers these tests write (or, where a line says
so, by reading it).  Only modules the prompt path never touches were replaced for those runs (VQ models,
attention kernels, torchvision, sentencepiece's ``.model`` path).  A change to one of our templates or to how
a tokenizer is called shows up here as a mismatch.

``IMAGE`` stands for a free image-token position of a stream; every other entry is the one token the reference
allows there.
"""
from __future__ import annotations

IMAGE = None

# -- Lumina-mGPT: Alpha-VLLM/Lumina-mGPT @104abe45 ------------------------------------------------------------
#: run: ``xllmx.data.item_processor.MMConvItemProcessor.process_item`` with ``lumina_mgpt/data/convertsation.py``'s
#: ``Conversation`` and xllmx's ``Tokenizer`` on ``chameleon_files.write_tokenizer(vocabulary())``, the item that
#: ``inference_solver.py`` ``FlexARInferenceSolver.generate`` builds for ``generate_examples/generate.py``'s
#: question ``f"Generate an image of {w}x{h} according to the following prompt:\n{prompt}"`` (answer None).
#: Keys: (width, height, prompt).
LUMINA_PROMPTS = {
    (96, 64, "a red fox in snow"): [0, 4, 5, 6, 7, 24, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 93],
    (512, 512, "a red fox in snow"): [0, 4, 5, 6, 7, 26, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 93],
    (64, 96, "blue sky"): [0, 4, 5, 6, 7, 25, 8, 9, 10, 11, 12, 18, 19, 93],
}
#: read: what the model then writes for a 96 x 64 image (``lumina_mgpt/data/item_processor.py``
#: ``FlexARItemProcessor.process_image`` / ``decode_image``, ``inference_solver.py``'s logits processors):
#: <racm3:break> 92, <reserved08802> 97 (64 / 32 = 2 high), <reserved08803> 98 (96 / 32 = 3 wide), 4 rows of
#: 6 image tokens each closed by <reserved08799> 94, then <eoss> 91.  The first three are sampled there.
LUMINA_STREAM_96x64 = [92, 97, 98] + ([IMAGE] * 6 + [94]) * 4 + [91]
#: read: the unconditional context is the stream from <racm3:break> on (``inference_solver.py``,
#: ``get_unconditional_logits``: ``input_ids[:, image_start_token_id_index:]``)
LUMINA_UNCONDITIONAL_START = [92]

# -- Anole: GAIR-NLP/anole @af563fa1 ---------------------------------------------------------------------------
#: run: ``text2image.py``'s prompt ``[{"type": "text", ...}, {"type": "sentinel", "value": "<END-OF-TURN>"}]``
#: through ``chameleon/inference/chameleon.py`` ``TokenManager.tokens_from_ui`` (``tokenizers.Tokenizer`` of
#: ``chameleon_meta_files.write_text_tokenizer``), then ``ImageDecoder``'s begin-image append and
#: ``_split_inputs_for_cfg``: the full, image-only and unconditional rows.
ANOLE_ROWS = {
    "a red fox in snow": [[0, 13, 14, 15, 16, 17, 93, 92], [0, 92], [0, 92]],
    "cat on mat": [[0, 20, 21, 22, 93, 92], [0, 92], [0, 92]],
}
#: read: ``ImageDecoder.__next__`` samples 1024 image tokens (only image tokens allowed), then gives <eoss> 91
ANOLE_STREAM = [IMAGE] * 1024 + [91]

# -- Janus-Pro: deepseek-ai/Janus @1daa72fa ---------------------------------------------------------------------
#: run: ``VLChatProcessor.apply_sft_template_for_multi_turn_prompts`` (``janus/models/processing_vlm.py``, the
#: ``deepseek`` template of ``janus/utils/conversation.py``) on ``[{"role": "<|User|>", "content": prompt},
#: {"role": "<|Assistant|>", "content": ""}]`` as README.md's Janus-Pro text-to-image example and
#: ``demo/app_januspro.py`` build it, plus ``image_start_tag``, encoded with ``tokenizer.encode`` (BOS added) on
#: ``checkpoints.janus_tokenizer()``; the unconditional row is that row with ``[1:-1]`` set to ``pad_id``.
JANUS_PROMPTS = {
    "a red cat": [264, 267, 58, 257, 263, 260, 256, 268, 58, 269],
    "a red cat\n": [264, 267, 58, 257, 263, 260, 256, 268, 58, 269],
    "  a red cat  ": [264, 267, 58, 257, 263, 260, 256, 268, 58, 269],
    "": [264, 267, 58, 268, 58, 269],
    " \n": [264, 267, 58, 268, 58, 269],
}
JANUS_PAD = 266

# -- Emu3: baaivision/Emu3 @f6ea9aaa -------------------------------------------------------------------------------
#: run: ``emu3/mllm/tokenization_emu3.py``'s ``Emu3Tokenizer`` on the text (``bos_token + prompt + boi_token +
#: f"{H}*{W}" + img_token``, as ``emu3/mllm/processing_emu3.py`` writes it in mode "G"), with ``emu3.tiktoken``
#: holding the ranks of ``emu3_files.text_vocabulary()`` (bytes, then ``MERGES``; padded with unused non-ASCII
#: ranks up to 151643 so that its special ids follow without a gap, as in the real vocabulary) and
#: ``emu3_vision_tokens.txt`` = ``emu3_files.BAAI_VISION_TOKENS``: the ids of
#: ``emu3_files.write_baai_converted_tokenizer``.  Keys: (prompt, tokens per side).
EMU3_PROMPTS = {
    ("a cat, 1290 px.Wide\n\n", 90): [151849, 97, 259, 44, 32, 49, 50, 57, 48, 32, 112, 120, 260, 105, 100, 101, 10,
                                      10, 151851, 57, 48, 42, 57, 48, 151853],
    ("a cat 90", 90): [151849, 97, 259, 32, 57, 48, 151851, 57, 48, 42, 57, 48, 151853],
    (" a cat\n", 4): [151849, 32, 97, 259, 10, 151851, 52, 42, 52, 151853],
}
#: run: ``emu3/mllm/utils_emu3.py`` ``Emu3PrefixConstrainedLogitsHelper`` (height 4, width 4) step by step from
#: <|image token|>: what each stream position allows (visual tokens or the one structural token)
EMU3_STREAM_4x4 = ([IMAGE] * 4 + ["eol"]) * 4 + ["eof", "eoi", "eos"]

# -- LlamaGen: FoundationVision/LlamaGen @ce98ec41 -----------------------------------------------------------------
#: run: ``language/t5.py`` ``T5Embedder.get_text_embeddings`` (``use_text_preprocessing`` True: ``clean_caption``
#: twice; ``model_max_length`` 120, as ``autoregressive/sample/sample_t2i.py`` sets it) on ``checkpoints.write_t5``'s
#: tokenizer: the ids it tokenizes, right-padded with 0 to 120.
LLAMAGEN_T5_IDS = {
    "A Red Circle in the Top Left ": [3, 4, 7, 10, 11, 12, 13, 1],
    "a blue square on a striped background": [3, 5, 8, 16, 3, 17, 19, 1],
}
LLAMAGEN_T5_LENGTH = 120
#: read: ``autoregressive/models/generate.py`` ``generate``: the unconditional class is ``model.num_classes``
#: (c2i), the unconditional caption ``cls_embedding.uncond_embedding`` (t2i); the stream is ``latent_size ** 2``
#: image tokens with nothing forced.
