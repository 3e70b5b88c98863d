"""The small text-to-image model shipped with the pack: its domain (procedural
images and their prompts), training pipeline and quality judge."""
