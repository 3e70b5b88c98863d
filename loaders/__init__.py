"""Model families: each turns a checkpoint into a ``sampling.ImageAdapter``."""
