"""The reference engine: every op of the IR in NumPy on host buffers — the numerical oracle.

It receives only VariantPack slots (like every engine), views them as NumPy arrays without copying,
runs the nodes in order with the kernels of ``_kernels_*`` and writes each output into its buffer.
"""
from .engine import ReferenceEngine

__all__ = ["ReferenceEngine"]
