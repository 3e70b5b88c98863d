"""``spec-ar bench``: every mode and setting side by side on one model and prompt list."""
