"""Report table and plot: compare runs inside a graph."""
from __future__ import annotations

from comfy_api.v0_0_2 import io, ui

from . import common
from .sampler import Report

SLOTS = 6


def _inputs():
    first = Report.Input("reports", tooltip="A sampler's report_data (a prompt list's runs are all collected).")
    more = [Report.Input(f"reports_{i}", optional=True, tooltip="Another sampler, to compare modes.")
            for i in range(2, SLOTS + 1)]
    return [first] + more


def _rows(reports, extra) -> list[dict]:
    rows = []
    for group in [reports] + [extra.get(f"reports_{i}") for i in range(2, SLOTS + 1)]:
        for item in group or []:  # is_input_list: each input is a list of sampler runs
            rows.extend(item)
    return rows


class ReportTable(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SpecAR_ReportTable", display_name="Speculative AR Report Table", category="SpeculativeAR",
            description="Sampler reports as a table: NFE, tokens per forward, MAL, latency, speed-up vs ar.",
            inputs=_inputs(), outputs=[io.String.Output(display_name="table")],
            is_input_list=True, is_output_node=True,
        )

    @classmethod
    def execute(cls, reports, **extra):
        text = common.table(_rows(reports, extra))
        return io.NodeOutput(text, ui=ui.PreviewText(text))


class ReportPlot(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SpecAR_ReportPlot", display_name="Speculative AR Report Plot", category="SpeculativeAR",
            description="Forward passes and latency per run, as a bar chart image.",
            inputs=_inputs(), outputs=[io.Image.Output(display_name="plot")],
            is_input_list=True, is_output_node=True,
        )

    @classmethod
    def execute(cls, reports, **extra):
        import numpy as np
        import torch

        picture = common.plot(_rows(reports, extra))
        image = torch.from_numpy(np.asarray(picture, dtype=np.float32) / 255.0)[None]
        return io.NodeOutput(image, ui=ui.PreviewImage(image, cls=cls))
