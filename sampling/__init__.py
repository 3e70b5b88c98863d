"""The model-agnostic decoding engine (no ComfyUI, no model-family code).

    from spec_ar.sampling import DecodeConfig, SpeculativeDecoder
    result = SpeculativeDecoder(adapter, DecodeConfig(mode="gsd", group_size=10)).generate(prompts, seeds=0)
    result.tokens, result.reports[0].summary()
"""
from .adapter import ImageAdapter, TokenLayout
from .config import DRAFT_INITS, MODES, ConfigError, DecodeConfig
from .checks import NonFiniteError, NonFiniteImageError
from .engine import DecodeResult, SpeculativeDecoder, StepEvent
from .head_drafts import HeadDrafts
from .model_drafts import ModelDrafts
from .report import ORIGINS, DecodeReport


def generate(adapter, conditions, config: DecodeConfig | None = None, negatives=None, seeds=0, callback=None):
    """One-call form of ``SpeculativeDecoder(adapter, config).generate(...)``."""
    return SpeculativeDecoder(adapter, config or DecodeConfig()).generate(conditions, negatives, seeds, callback)


__all__ = [
    "ConfigError", "DecodeConfig", "DecodeReport", "DecodeResult", "DRAFT_INITS", "HeadDrafts", "ImageAdapter",
    "MODES", "ModelDrafts", "NonFiniteError", "NonFiniteImageError", "ORIGINS", "SpeculativeDecoder", "StepEvent",
    "TokenLayout", "generate",
]
