"""ComfyUI node classes: thin wrappers over the engine and loaders.

ComfyUI's API is imported here only, and guarded, so the package imports (and
its tests run) without ComfyUI; outside ComfyUI the mappings are empty.
"""
try:  # pragma: no cover - exercised inside a ComfyUI server
    from comfy_api.v0_0_2 import io  # noqa: F401
except ImportError:  # not running inside ComfyUI
    io = None

NODE_CLASS_MAPPINGS: dict = {}
NODE_DISPLAY_NAME_MAPPINGS: dict = {}
