"""File formats every layer above reads: checkpoint files and configurations
(``checkpoints.py``; a tokenizer's YAML is read with PyYAML's ``safe_load``).
Imports nothing else of the pack, so loaders/ and decoders/ both stand on it."""
