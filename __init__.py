"""Speculative AR: speculative decoding for autoregressive image models in ComfyUI.

ComfyUI imports this folder (under whatever name it was cloned as) and reads
``NODE_CLASS_MAPPINGS``.  Installed with pip it is the package ``spec_ar``.
Importing it loads no torch and no model code; the nodes import the engine when
they run.
"""
if __package__:  # a package: ComfyUI's import (any folder name) or pip's spec_ar
    from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
else:  # the bare file, as pytest imports a pack folder whose name is no identifier
    NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = {}, {}

#: the pack's page extension (served at /extensions/<folder>/): the sampler shows the knobs its mode reads
WEB_DIRECTORY = "./web"
__version__ = "0.1.0"
__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]
