"""ComfyUI node classes: thin wrappers over the engine and loaders.

ComfyUI's API is imported here only, and guarded, so the package imports (and
its tests run) without ComfyUI; outside ComfyUI the mappings are empty.  The
pure logic the nodes share lives in ``common.py``.
"""
try:  # inside a ComfyUI server
    from comfy_api.v0_0_2 import io  # noqa: F401
except ImportError:  # not running inside ComfyUI
    io = None

NODE_CLASS_MAPPINGS: dict = {}
NODE_DISPLAY_NAME_MAPPINGS: dict = {}

if io is not None:  # pragma: no cover - exercised by the ComfyUI server test
    from .glm_image import GlmDiTDecode
    from .models import LoadARImageModel, LoadDrafter, LoadVQDecoder, register_folder
    from .prompts import PromptList
    from .reports import ReportPlot, ReportTable
    from .sampler import SpeculativeARSampler, VQDecode

    register_folder()
    for node in (LoadARImageModel, LoadVQDecoder, LoadDrafter, SpeculativeARSampler, VQDecode, GlmDiTDecode,
                 PromptList, ReportTable, ReportPlot):
        schema = node.define_schema()
        NODE_CLASS_MAPPINGS[schema.node_id] = node
        NODE_DISPLAY_NAME_MAPPINGS[schema.node_id] = schema.display_name
