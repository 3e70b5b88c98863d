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
            ],
            outputs=[io.String.Output(display_name="prompt", is_output_list=True,
                                      tooltip="Each prompt in turn (a list: downstream nodes run once per prompt)."),
                     io.Int.Output(display_name="count")],
        )

    @classmethod
    def execute(cls, prompts, file=NO_FILE):
        import folder_paths

        lines = common.prompt_list(prompts, file, folder_paths.get_input_directory())
        return io.NodeOutput(lines, len(lines))
