"""File formats every layer above reads: checkpoint files and configurations
(``checkpoints.py``) and the YAML subset of model configs (``yaml_subset.py``).
Imports nothing else of the pack, so loaders/ and decoders/ both stand on it."""
