"""Prompt List: many prompts, one queue entry."""
from __future__ import annotations

from comfy_api.v0_0_2 import io

from . import common

NO_FILE = common.NO_FILE


def _input_files() -> list[str]:
    import os

    import folder_paths

    base = folder_paths.get_input_directory()
    try:
        return sorted(f for f in os.listdir(base) if f.lower().endswith(".txt"))
    except FileNotFoundError:
        return []


class PromptList(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SpecAR_PromptList", display_name="Prompt List", category="SpeculativeAR",
            description="One prompt per line (lines starting with # are skipped). Connected to the sampler's "
                        "prompt, every prompt is rendered in one queue entry.",
            inputs=[
                io.String.Input("prompts", multiline=True, default="a red circle in the top left\n"
                                "a blue square in the center on a striped yellow background",
                                tooltip="One prompt per line."),
                io.Combo.Input("file", options=[NO_FILE] + _input_files(), default=NO_FILE,
                               tooltip="Or a .txt file in ComfyUI's input folder, one prompt per line."),
                io.Int.Input("shard", default=0, min=0, max=4096, optional=True,
                             tooltip="Which part of the list this queue entry renders (0 to shards - 1): "
                                     "give each machine of a ComfyUI-Distributed run its own."),
                io.Int.Input("shards", default=1, min=1, max=4096, optional=True,
                             tooltip="Into how many contiguous, near-equal parts the list is split (1: the "
                                     "whole list)."),
            ],
            outputs=[io.String.Output(display_name="prompt", is_output_list=True,
                                      tooltip="Each prompt in turn (a list: downstream nodes run once per prompt)."),
                     io.Int.Output(display_name="count")],
        )

    @classmethod
    def validate_inputs(cls, prompts=None, file=None, shard=0, shards=1):
        try:
            common.shard([], 0 if shard is None else shard, 1 if shards is None else shards)
        except ValueError as err:
            return str(err)
        return True

    @classmethod
    def execute(cls, prompts, file=NO_FILE, shard=0, shards=1):
        import folder_paths

        every = common.prompt_list(prompts, file, folder_paths.get_input_directory())
        lines = common.shard(every, shard, shards)
        if not lines:
            raise ValueError(f"shard {shard} of {shards} holds no prompts: the list has {len(every)}; use at most "
                             f"{len(every)} shards")
        return io.NodeOutput(lines, len(lines))
