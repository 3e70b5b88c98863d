"""The shareable workflows (``*.json``: UI format, ``api/*.json``: API format), the
conversion between ComfyUI's two formats (``format.py``) and the script that writes
both (``build.py``)."""
