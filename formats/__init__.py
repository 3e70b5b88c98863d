"""File formats every layer above reads: checkpoint files and configurations
(``checkpoints.py``; a tokenizer's YAML is read with PyYAML's ``safe_load``) and the
tensors of TorchScript archives, read without running them (``torchscript.py``).
Imports nothing else of the pack, so loaders/ and decoders/ both stand on it."""
