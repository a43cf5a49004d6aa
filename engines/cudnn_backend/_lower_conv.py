"""Convolutions (fprop, dgrad, wgrad) lowered to backend descriptors."""
from __future__ import annotations

from .lowering import Ref, Step, lowers  # noqa: F401
