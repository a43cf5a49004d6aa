"""A cuTile plan's launches prepared for C: cubins compiled for the plan's arrays, parameter buffers
prebuilt, and the ``_tile_launch.TileLaunch`` that execute() calls.

The plan's launch list (``CutileForwardPlan._launch_list``) is walked once with symbolic operands:
``OperandRef`` for a graph tensor (its shape and strides are the layout's, which every execute checks)
and ``RegionRef`` for a workspace region (its offset and shape are the plan's). Per kernel that gives
the ``KernelSignature`` the cubin is compiled for (each array 16-byte aligned at its base, its strides'
divisibility as the plan's strides have it, unit last stride) and the parameter buffer of
``_abi.ParamLayout`` with the extents and strides written and the addresses left for each call.

``LaunchPlan.describe()`` is the same as plain data (cubins, kernel names, grids, the parameter images
and where each address goes): what a C runtime needs to launch the plan without Python.
"""
from __future__ import annotations

import dataclasses
import io
import logging
import struct

from ..._layout import row_major_strides
from . import _abi
from ._geometry import ITEM_BYTES

logger = logging.getLogger(__name__)

BASE_ALIGNMENT = 16            # bytes: what the kernels are compiled to assume of every array's base
_INT32_MAX = 2 ** 31 - 1


@dataclasses.dataclass(frozen=True)
class OperandRef:
    """A graph operand as a kernel argument (geometry from the plan's layout), or a region of one: ``add`` bytes
    past its address, with that region's type, shape and strides (a chunk cache's)."""
    uid: int
    name: str
    dtype: str
    shape: tuple
    strides: tuple
    add: int = 0


@dataclasses.dataclass(frozen=True)
class RegionRef:
    """A workspace region as a kernel argument: ``offset`` bytes past the workspace base, row-major."""
    region: str
    offset: int
    dtype: str
    shape: tuple

    @property
    def strides(self) -> tuple:
        return row_major_strides(self.shape)


class Unsupported(Exception):
    """Why a plan keeps the Python launch path (logged, never raised to the caller)."""


def symbolic_readers(layout, uid_of_port: dict, geometry):
    """(slot, scratch): the plan's argument readers, returning refs instead of Slots."""
    specs = {s.uid: s for s in layout.specs}

    def slot(port):
        spec = specs.get(uid_of_port.get(port))
        if spec is None:
            raise Unsupported(f"port {port} has no tensor in the plan's layout")
        if spec.strides is None:
            raise Unsupported(f"tensor '{spec.name}' takes any layout (its strides change per call)")
        return OperandRef(spec.uid, spec.name, spec.dtype, tuple(spec.shape), tuple(spec.strides))

    scratch = {name: RegionRef(name, offset, geometry.dtypes[name], tuple(shape))
               for name, (offset, shape) in geometry.regions.items()}
    return slot, scratch


def _divisibility(stride: int, cap: int) -> int:
    """The largest power of two dividing ``stride`` (in elements), at most ``cap``."""
    if stride == 0:
        return cap
    d = 1
    while d < cap and stride % (2 * d) == 0:
        d *= 2
    return d


def array_constraint(ref):
    """The ArrayConstraint a ref's kernel is compiled for (its values hold for every call)."""
    import cuda.tile as ct
    from cuda.tile.compilation import ArrayConstraint
    item = ITEM_BYTES.get(ref.dtype)
    if item is None:
        raise Unsupported(f"{_label(ref)} is {ref.dtype}; the C path takes {sorted(ITEM_BYTES)}")
    ndim = len(ref.shape)
    if ndim == 0 or ref.strides[-1] != 1:
        raise Unsupported(f"{_label(ref)} has strides {ref.strides}; the C path needs a unit last stride")
    if any(not 0 <= v <= _INT32_MAX for v in (*ref.shape, *ref.strides)):
        raise Unsupported(f"{_label(ref)}: extents {ref.shape} / strides {ref.strides} exceed int32")
    cap = 16 // item
    dtype = {"bfloat16": ct.bfloat16, "float16": ct.float16, "float32": ct.float32, "int32": ct.int32}[ref.dtype]
    return ArrayConstraint(dtype, ndim, index_dtype=ct.int32, stride_lower_bound_incl=0, alias_groups=(),
                           may_alias_internally=False, stride_constant=(None,) * (ndim - 1) + (1,),
                           stride_divisible_by=tuple(_divisibility(s, cap) for s in ref.strides[:-1]) + (1,),
                           base_addr_divisible_by=BASE_ALIGNMENT)


def _label(ref) -> str:
    return f"tensor '{ref.name}'" if isinstance(ref, OperandRef) else f"workspace region {ref.region}"


@dataclasses.dataclass
class KernelLaunch:
    """One kernel of the plan, ready for C."""
    name: str                    # the plan's name for the launch ("prepare", "state_pass", ...)
    symbol: str                  # the cubin's entry
    grid: tuple
    cubin: bytes
    layout: _abi.ParamLayout
    image: bytes                 # the parameter buffer with the extents and strides written
    patches: list                # (offset, source, add): source an operand index or -1 (the workspace)
    block: tuple = (1, 1, 1)     # a tile kernel's; a CuTe DSL kernel in the plan gives its own
    shared_bytes: int = 0        # dynamic shared memory (a CuTe DSL kernel's)


@dataclasses.dataclass
class LaunchPlan:
    kernels: list
    operands: list               # (uid, alignment, name), the index a patch's source refers to
    workspace_size: int
    # per kernel (lane, wait, record) where its launches overlap (engines/cutile/_segments), else None; the
    # kernels' order is a serial one as well, which describe() gives
    schedule: list | None = None

    def describe(self) -> dict:
        """Plain data for a C runtime (issue 24 scope 3): no cuTile, no Python objects.

        ``kernels``: in launch order, each ``{"name", "symbol", "cubin" (bytes), "grid" [3], "block" [3]
        ([1, 1, 1] for a tile kernel), "shared_bytes" (0 for a tile kernel), "param_size", "param_offsets", "param_sizes" (per parameter), "param_image"
        (bytes), "addresses": [{"offset", "operand_uid" (None: the workspace), "add"}]}``; ``operands``:
        ``[{"uid", "name", "alignment"}]``; ``workspace_size``: bytes of scratch the addresses of
        ``operand_uid`` None are offsets into. Launch with cuLaunchKernel's ``kernelParams`` (one pointer
        per parameter, ``param_image + param_offsets[i]``), never as one ``extra`` buffer: the cubin's
        parameter bank is larger and its tail is filled by the driver's tile-kernel hooks."""
        uids = [u for u, _, _ in self.operands]
        return {
            "abi": "cutile_python_v1/int32-index",
            "kernels": [{"name": k.name, "symbol": k.symbol, "cubin": k.cubin, "grid": list(k.grid),
                         "block": list(k.block), "shared_bytes": k.shared_bytes, "param_size": k.layout.size,
                         "param_offsets": list(k.layout.offsets),
                         "param_sizes": [f.size for f in k.layout.fields], "param_image": k.image,
                         "addresses": [{"offset": o, "operand_uid": None if s < 0 else uids[s], "add": a}
                                       for o, s, a in k.patches]}
                        for k in self.kernels],
            "operands": [{"uid": u, "name": n, "alignment": a} for u, a, n in self.operands],
            "workspace_size": self.workspace_size,
        }


def parameter_image(layout: _abi.ParamLayout, args, operand_index) -> tuple:
    """(image, patches) of one kernel: extents and strides written as int32, each address a patch."""
    image = bytearray(layout.size)
    patches = []
    for f in layout.fields:
        ref = args[f.arg]
        if f.role == "address":
            if isinstance(ref, OperandRef):
                patches.append((f.offset, operand_index(ref), ref.add))
            else:
                patches.append((f.offset, -1, ref.offset))
        else:
            value = (ref.shape if f.role == "extent" else ref.strides)[f.dim]
            struct.pack_into("<i", image, f.offset, value)
    return bytes(image), patches


def _compile(kernel, signature, arch: str) -> bytes:
    from cuda.tile.compilation import export_kernel
    buffer = io.BytesIO()
    export_kernel(kernel, [signature], buffer, gpu_code=arch, output_format="cubin")
    return buffer.getvalue()


def prepare(launches, workspace_size: int, arch: str, compile_kernel=_compile) -> LaunchPlan:
    """The plan's launch list (with refs) as a LaunchPlan: each kernel compiled for ``arch`` and its cubin's
    parameter table checked against the layout written here (Unsupported / AbiMismatchError otherwise)."""
    from cuda.tile.compilation import CallingConvention, KernelSignature
    operands, index = [], {}

    def operand_index(ref):
        if ref.uid not in index:
            index[ref.uid] = len(operands)
            operands.append((ref.uid, BASE_ALIGNMENT, ref.name))
        return index[ref.uid]

    cconv = CallingConvention.cutile_python_v1()
    kernels = []
    compiled = {}                # a segmented plan launches each kernel with the same signature per segment
    for name, grid, kernel, args in launches:
        if hasattr(kernel, "c_launch"):
            # a CuTe DSL kernel among the tile kernels (its own cubin, parameters, block and shared memory)
            kernels.append(kernel.c_launch(name, grid, args, operand_index))
            continue
        params = []
        for a in args:
            if isinstance(a, (OperandRef, RegionRef)):
                params.append(array_constraint(a))
            elif isinstance(a, (bool, int, float)):
                params.append(a)
            else:
                raise Unsupported(f"launch {name}: argument {a!r} is neither an array nor a constant")
        signature = KernelSignature(params, cconv).with_mangled_symbol(kernel._pyfunc.__name__)
        layout = _abi.ParamLayout.of([len(a.shape) if isinstance(a, (OperandRef, RegionRef)) else None
                                      for a in args])
        key = (id(kernel), signature.symbol, repr(params))
        cubin = compiled.get(key)
        if cubin is None:
            cubin = compiled[key] = compile_kernel(kernel, signature, arch)
        layout.check_against(_abi.cubin_parameters(cubin, signature.symbol))
        image, patches = parameter_image(layout, args, operand_index)
        grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        kernels.append(KernelLaunch(name, signature.symbol, grid, cubin, layout, image, patches))
    return LaunchPlan(kernels, operands, workspace_size, getattr(launches, "schedule", None))


def load(plan: LaunchPlan, layout, workspaces, ordinal: int, lanes_for=None):
    """The TileLaunch of a LaunchPlan: each cubin loaded once (cuLibraryLoadData) on ``ordinal``; ``lanes_for``
    (stream -> ``_lanes.Lanes``) where the plan has a schedule."""
    from ..._driver import kernel_allow_shared, library_kernel, library_load, library_unload
    from ..._tile_launch import TileLaunch
    libraries = _Libraries(library_unload)
    rows = []
    loaded = {}                  # (cubin, symbol) -> its CUkernel: a segmented plan's kernels recur
    for i, k in enumerate(plan.kernels):
        kernel = loaded.get((k.cubin, k.symbol))
        if kernel is None:
            library = library_load(k.cubin, ordinal)
            libraries.handles.append(library)
            kernel = loaded[(k.cubin, k.symbol)] = library_kernel(library, k.symbol)
            kernel_allow_shared(kernel, k.shared_bytes, ordinal)      # past 48 KB only
        schedule = plan.schedule[i] if plan.schedule is not None else (0, -1, -1)
        rows.append((kernel, k.grid, k.image, k.layout.offsets, k.patches, k.block, k.shared_bytes, schedule))
    return TileLaunch.create(layout, rows, plan.operands, workspaces, ordinal, libraries,
                             lanes_for if plan.schedule is not None else None)


class _Libraries:
    """The loaded cubins of one TileLaunch, unloaded with it."""

    def __init__(self, unload):
        self.handles = []
        self._unload = unload

    def __del__(self):
        for h in self.handles:
            try:
                self._unload(h)
            except Exception:       # noqa: BLE001  (nothing to raise to from a finalizer)
                pass
