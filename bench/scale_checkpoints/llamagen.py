"""LlamaGen's c2i GPT at any size: its tensor shapes under the checkpoint's names (written as a header over a
sparse hole by :func:`.weight_files.write_holes`, for what reads headers or redraws the values)."""
from __future__ import annotations


def llamagen_shapes(dim: int, layers: int, ffn: int, vocab: int = 16384, classes: int = 1000) -> dict:
    """Tensor shapes of a LlamaGen c2i GPT of the given size (its checkpoint names)."""
    shapes = {"tok_embeddings.weight": (vocab, dim), "cls_embedding.embedding_table.weight": (classes + 1, dim),
              "norm.weight": (dim,), "output.weight": (vocab, dim)}
    for i in range(layers):
        shapes.update({f"layers.{i}.{key}": shape for key, shape in (
            ("attention.wqkv.weight", (3 * dim, dim)), ("attention.wo.weight", (dim, dim)),
            ("feed_forward.w1.weight", (ffn, dim)), ("feed_forward.w3.weight", (ffn, dim)),
            ("feed_forward.w2.weight", (dim, ffn)), ("attention_norm.weight", (dim,)), ("ffn_norm.weight", (dim,)))})
    return shapes
