"""VQ decoders: each turns image-token codes into images."""
