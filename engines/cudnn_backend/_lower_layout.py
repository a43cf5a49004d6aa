"""Layout ops (reshape, transpose, slice, concatenate), block-scale quantize / dequantize, rng and resample lowered to backend descriptors."""
from __future__ import annotations

from .lowering import Ref, Step, lowers  # noqa: F401
