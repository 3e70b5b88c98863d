"""Training what the engine drafts with (``spec-ar train-drafter``)."""
