"""CuteGemmEngine: Hopper (sm_90) GEMM with fused epilogues, written in CuTe DSL.

``propose_plans`` matches the graph (``_match``: matmul -> bias / scale / activation -> output), ranks knob
sets with ``_plans``' model and returns one PlanConfig per set. ``build_plan`` compiles the kernel for the
problem and the knobs (``_kernel``; seconds) once per shape class in the process (``_spec.shape_class``: the
extents are runtime arguments, so a new batch size or sequence length of a known class compiles nothing),
or once per shape for layouts a class cannot express. ``execute`` reads only the VariantPack's slots:
their addresses go to the compiled launcher as integers (no per-call ``from_dlpack``), by-value scalars are
read from their host slots, and the kernel runs on ``ctx.stream``.
"""
from __future__ import annotations

import ctypes
import dataclasses
import logging
import threading

from .._device import compute_capability as _compute_capability
from .._dsl_common import ToolchainGatedEngine
from ..base import CompiledPlan, ExecutionContext, PlanConfig
from ..ids import CUTE_BASE
from ...errors import GraphNotSupportedError
from ... import _progress
from . import _disk, _plans, _toolchain
from ._match import match
from ._spec import ITEMSIZE, TMA_ALIGN, GemmSpec, shape_class, smem_stages

logger = logging.getLogger(__name__)

REQUIRED_ARCH = (9, 0)

_cache: dict = {}                 # GemmSpec (a shape class, or a static shape) -> compiled kernel
_cache_lock = threading.Lock()
compile_seconds: dict = {}        # GemmSpec -> seconds its compile took (bench/gemm.py reports it)
disk_hits: set = set()            # GemmSpecs this process loaded from the disk cache instead of compiling


def _device_kind_reason(graph) -> str | None:
    """Why the graph's device is not one this engine serves, asked of the graph alone (no DSL, no driver)."""
    kind = graph.device[0]
    if kind != "cuda":
        return f"the graph runs on {kind}; the CuTe GEMM runs on CUDA devices"
    return None


def _device_reason(graph) -> str | None:
    reason = _device_kind_reason(graph)
    if reason is not None:
        return reason
    ordinal = graph.device[1]
    try:
        cc = _compute_capability(ordinal)
    except RuntimeError as exc:
        return f"no CUDA device {ordinal} to query ({exc})"
    if cc != REQUIRED_ARCH:
        return (f"device {ordinal} is sm_{cc[0]}{cc[1]}; the CuTe GEMM kernel is written for sm_90 "
                "(WGMMA, TMA multicast)")
    return None


@dataclasses.dataclass
class _Device:
    sm_count: int = 132
    clusters: dict = dataclasses.field(default_factory=dict)    # cluster size -> max active clusters


_devices: dict = {}


def _device(ordinal: int) -> _Device:
    """SM count and co-resident clusters of a device (the persistent grid's size): asked once per process,
    of the disk (kept per GPU model and driver, so a warm process needs no DSL), else of the DSL's
    HardwareInfo, whose answer is then kept."""
    found = _devices.get(ordinal)
    if found is not None:
        return found
    dev = _Device()
    try:
        from ..._driver import device_info
        info = device_info(ordinal)
        name, cc = info["name"], tuple(info["compute_capability"])
    except Exception:                         # no GPU (the export tests): the DSL's answer or the default
        name = cc = None
    facts = _disk.load_device_facts(name, cc) if name else None
    if facts is not None:
        dev.sm_count, dev.clusters = facts["sm_count"], facts["clusters"]
    else:
        try:
            from cutlass.utils import HardwareInfo
            hardware = HardwareInfo(ordinal)
            dev.sm_count = int(hardware.get_device_multiprocessor_count())
            for size in (1, 2):
                dev.clusters[size] = int(hardware.get_max_active_clusters(size))
            if name:
                _disk.store_device_facts(name, cc, dev.sm_count, dev.clusters)
        except Exception as exc:              # no GPU (export tests) or an old driver: one cluster per SM group
            logger.debug("hardware info unavailable (%s); assuming %d SMs", exc, dev.sm_count)
    _devices[ordinal] = dev
    return dev


def spec_for(problem, knobs, device: _Device | None = None) -> GemmSpec:
    """The kernel specialisation of a matched problem under ``knobs`` (stages resolved)."""
    device = device or _Device()
    stages = knobs.stages or smem_stages(knobs.tile, ITEMSIZE[problem.ab_dtype], ITEMSIZE[problem.c_dtype])
    knobs = dataclasses.replace(knobs, stages=stages)
    size = knobs.cluster[0] * knobs.cluster[1]
    return GemmSpec(ab_dtype=problem.ab_dtype, c_dtype=problem.c_dtype, M=problem.M, N=problem.N, K=problem.K,
                    L=problem.L, a_stride=problem.a_stride, b_stride=problem.b_stride, c_stride=problem.c_stride,
                    knobs=knobs, epi_tensors=problem.epi_tensors, n_scalars=len(problem.scalar_uids),
                    steps=problem.steps, max_active_clusters=device.clusters.get(size, 0),
                    sm_count=device.sm_count)


def kernel_spec(spec: GemmSpec) -> GemmSpec:
    """The spec the kernel is compiled for: ``spec``'s shape class where one serves it, else ``spec``."""
    return shape_class(spec) or spec


def compiled_launcher(spec: GemmSpec, problem_label: str | None = None, require_toolchain=None):
    """The compiled kernel of ``spec`` (a kernel spec): from the disk cache or compiled at the first
    request in the process, then cached. ``problem_label`` names the problem that asked first (the log line
    of a shape class's compile); ``require_toolchain`` is called before compiling (it declines the graph
    when the DSL cannot compile here)."""
    found = _cache.get(spec)
    if found is not None:
        return found
    with _cache_lock:
        found = _cache.get(spec)
        if found is None:
            found = _disk.load(spec)
            if found is not None:
                disk_hits.add(spec)
                logger.info("cute_gemm: kernel %s loaded from the disk cache", spec.knobs.label())
        if found is None:
            if require_toolchain is not None:
                require_toolchain()
            from ._kernel import compile_spec
            shape = problem_label or ("any MxNxK" if spec.dynamic else f"{spec.M}x{spec.N}x{spec.K}")
            what = f"GEMM {shape} {spec.ab_dtype} {spec.knobs.label()}"
            if spec.dynamic:
                what += " (shape class: M, N, K, L at run time)"
            with _progress.compiling(CuteGemmEngine.name, what, logger) as watch:
                found = compile_spec(spec)
                compile_seconds[spec] = watch.elapsed_s
            _disk.store(spec, found)
        _cache[spec] = found
    return found


# execute() launches CuTe plans from C (PackedLaunch). Its first H200 run (session 10) crashed: the entry
# takes N_POINTERS pointer slots whatever the epilogue binds, and the scalars were packed right after the
# bound ones, so the stream cell was left NULL. The slot count is now passed (pointer_slots).
C_LAUNCH = True

# A knob set whose kernel this process has already compiled goes first when the model rates it at least
# this fraction of the best set: a compile costs about half a second, a slightly worse tiling of one problem
# far less.
COMPILED_PREFERENCE = 0.8


def make_launcher(kernel, spec: GemmSpec, ordinal: int, extents):
    """The launcher of a compiled kernel: a shared object's (no DSL) or the DSL's."""
    from ._shared_object import SharedKernel
    if isinstance(kernel, SharedKernel):
        from ._shared_launch import SharedLauncher
        return SharedLauncher(kernel, spec, ordinal, extents=extents)
    from ._launch import Launcher
    return Launcher(kernel, spec, ordinal, extents=extents)


_on_disk: dict = {}               # GemmSpec -> whether the disk held its kernel when first asked


def _ready(spec: GemmSpec) -> bool:
    """Whether ``spec``'s kernel needs no compile: in this process's cache, or on the disk (asked once per
    spec and process: a spec this process compiles is in ``_cache`` from then on)."""
    if spec in _cache:
        return True
    found = _on_disk.get(spec)
    if found is None:
        found = _on_disk[spec] = _disk.available(spec)
    return found


def _prefer_compiled(problem, candidates: list, device: _Device) -> list:
    """``candidates`` with the best ready knob set (compiled in this process or on the disk) moved first,
    if the model rates it close."""
    if not candidates:
        return candidates
    best = _plans.score(problem, candidates[0], device.sm_count)
    if _ready(kernel_spec(spec_for(problem, candidates[0], device))):
        return candidates
    for i, knobs in enumerate(candidates[1:], start=1):
        if _ready(kernel_spec(spec_for(problem, knobs, device))):
            if _plans.score(problem, knobs, device.sm_count) >= COMPILED_PREFERENCE * best:
                return [knobs] + candidates[:i] + candidates[i + 1:]
            break
    return candidates


def _scalar_value(value):
    """A pass-by-value tensor's value as a float (a number or a one-element array), or None."""
    if value is None:
        return None
    import numpy as np
    return float(np.asarray(value, dtype=np.float64).reshape(-1)[0])


class CuteGemmPlan(CompiledPlan):
    """A built plan: the launcher, where each argument sits in the VariantPack, the alignment each needs."""

    def __init__(self, plan: PlanConfig, problem, spec: GemmSpec, launcher):
        super().__init__(plan, 0)
        self.problem = problem
        self.spec = spec
        self._launch = launcher
        p = problem
        self._tensor_uids = (p.a_uid, p.b_uid, p.c_uid) + tuple(p.epi_uids)
        self._align = (TMA_ALIGN,) * 3 + tuple(ITEMSIZE[e.dtype] for e in p.epi_tensors)
        self._names = ("A", "B", "output") + tuple(f"epilogue operand {i}" for i in range(len(p.epi_uids)))
        self._scalar_readers = tuple(ctypes.c_double if t == "float64" else ctypes.c_float
                                     for t in p.scalar_types)
        self._positions = None
        self.scalar_defaults = (None,) * len(problem.scalar_uids)

    def export_kernels(self) -> bytes | None:
        """The compiled kernel (the DSL's exported object, with its key) for ``serialize()``."""
        compiled_for = kernel_spec(self.spec)
        found = _cache.get(compiled_for)
        return None if found is None else _disk.plan_kernels(compiled_for, found)

    def export_plan_operands(self) -> tuple:
        """The epilogue scalars whose value the graph fixed (``tensor_scalar``): host constants a reader
        binds itself, as it does a cuDNN plan's (the caller passes no such scalar)."""
        import struct
        from ..._plan_blob import OPERAND_HOST_CONSTANT, PlanOperand
        from ...enums import DataType
        out = []
        for uid, kind, value in zip(self.problem.scalar_uids, self.problem.scalar_types, self.scalar_defaults):
            if value is not None:
                double = kind == "float64"
                out.append(PlanOperand(OPERAND_HOST_CONSTANT, uid, int(DataType.DOUBLE if double else DataType.FLOAT),
                                       struct.pack("<d" if double else "<f", value), graph_scalar=True))
        return tuple(out)

    def export_launch(self, kernels: bytes | None) -> tuple:
        """The blob's DSL launch record of this plan's kernel (the C runtime's launch with no Python): the
        shared object inside ``kernels`` (``export_kernels``' bytes), the exported entry's convention and
        which operand, scalar and extent goes to each slot, as ``fast_executor`` packs them. () where the
        kernel has no shared object (no C compiler linked it)."""
        from ..._plan_launch import CONVENTION_CUTE_PACKED, LaunchKernel, PointerSlot, ScalarSlot
        from ...enums import DataType
        from ._shared_launch import PLACEHOLDER_ADDRESS
        from ._spec import N_POINTERS, N_SCALARS
        found = _disk.plan_shared_object(kernels) if kernels else None
        if found is None:
            return ()
        record, offset, size = found
        p = self.problem
        pointers = [PointerSlot(uid, align, name) for uid, align, name in zip(self._tensor_uids, self._align,
                                                                              self._names)]
        scalars = [ScalarSlot(uid, int(DataType.DOUBLE if kind == "float64" else DataType.FLOAT))
                   for uid, kind in zip(p.scalar_uids, p.scalar_types)]
        return (LaunchKernel(CONVENTION_CUTE_PACKED, tuple(pointers + [PointerSlot()] * (N_POINTERS - len(pointers))),
                             tuple(scalars + [ScalarSlot()] * (N_SCALARS - len(scalars))),
                             tuple(int(x) for x in self._launch.extents), record["entry_symbol"],
                             record.get("function_prefix", _disk.FUNCTION_PREFIX), record.get("runtime") or "",
                             code_offset=offset, code_size=size, placeholder=PLACEHOLDER_ADDRESS),)

    def fast_executor(self, layout):
        """execute()'s one-call path: pack in Cython and call the compiled host entry from C
        (``_dsl_launch.PackedLaunch``), or None where the launch must go through the DSL's Python call
        (a device other than 0: the DSL launches on the current one; a DSL whose packing differs)."""
        if not C_LAUNCH or self._launch.ordinal != 0 or layout is None:
            return None
        found = self._launch.c_entry()
        if found is None:
            return None
        entry, template, result_index = found
        from ..._dsl_launch import PackedLaunch
        from ._spec import N_POINTERS, N_SCALARS
        p = self.problem
        launch = PackedLaunch.create(layout, entry, template, self._tensor_uids, self._align, self._names,
                                     N_SCALARS, p.scalar_uids, [t == "float64" for t in p.scalar_types],
                                     self.scalar_defaults, self._launch.extents, result_index, self._launch,
                                     pointer_slots=N_POINTERS)
        return launch.execute_mapping

    def execute(self, graph, variant_pack, ctx: ExecutionContext) -> None:
        slots = variant_pack.slots
        positions = self._positions
        if positions is None:
            index = {u: i for i, u in enumerate(variant_pack.uids)}
            positions = self._positions = (tuple(index[u] for u in self._tensor_uids),
                                           tuple(index[u] for u in self.problem.scalar_uids))
        ptrs = [0, 0, 0, 0, 0, 0]
        for i, (pos, align) in enumerate(zip(positions[0], self._align)):
            ptr = slots[pos].data_ptr
            if ptr % align:
                raise ValueError(f"{self._names[i]} is at address {ptr:#x}, not {align}-byte aligned; "
                                 f"the CuTe GEMM ({'TMA' if align == TMA_ALIGN else 'vector loads'}) needs it")
            ptrs[i] = ptr
        scalars = [0.0, 0.0, 0.0]
        for j, (pos, reader) in enumerate(zip(positions[1], self._scalar_readers)):
            scalars[j] = float(reader.from_address(slots[pos].data_ptr).value)
        self._launch(ptrs, scalars, 0 if ctx.stream is None else int(ctx.stream))


class CuteGemmEngine(ToolchainGatedEngine):
    """Hopper GEMM (TMA, WGMMA, warp-specialised persistent kernel) with a fused epilogue, in CuTe DSL."""

    name = "cute_gemm"
    engine_id = CUTE_BASE
    binds_provisional_strides = True
    toolchain = _toolchain
    host_scalars = True

    def propose_plans(self, graph) -> list[PlanConfig]:
        # Cheapest first: the DSL is imported (_require_toolchain) only for a graph this engine could run.
        reason = _device_kind_reason(graph)
        if reason is not None:
            raise GraphNotSupportedError(reason)
        problem = match(graph)
        reason = _device_reason(graph)
        if reason is not None:
            raise GraphNotSupportedError(reason)
        device = _device(graph.device[1])
        candidates = _prefer_compiled(problem, _plans.candidates(problem, device.sm_count), device)
        if not (candidates and _ready(kernel_spec(spec_for(problem, candidates[0], device)))):
            self._require_toolchain()      # a compile is ahead: the DSL must import (the first call imports it)
        plans = []
        base = -1.0 if _plans.ranks_below_cudnn(problem) else 10.0   # cuDNN's entries have priority 0
        for rank, knobs in enumerate(candidates):
            plans.append(PlanConfig(CUTE_BASE, knobs=knobs.as_dict(), name=f"cute_gemm_{knobs.label()}",
                                    engine=self, priority=base - 0.01 * rank, workspace_size=0,
                                    payload=problem))
        return plans

    def load_plan(self, graph, plan: PlanConfig, ctx: ExecutionContext, kernels) -> CompiledPlan:
        """A deserialized plan: its kernel from the blob where it was built for this DSL and GPU (no
        compile), else as build_plan."""
        if kernels:
            problem = match(graph)
            spec = kernel_spec(spec_for(problem, _plans.knobs_from(plan.knobs), _device(graph.device[1])))
            if spec not in _cache:
                loaded = _disk.kernel_from_plan(spec, bytes(kernels))
                if loaded is not None:
                    with _cache_lock:
                        _cache.setdefault(spec, loaded)
        return self.build_plan(graph, plan, ctx)

    def build_plan(self, graph, plan: PlanConfig, ctx: ExecutionContext) -> CompiledPlan:
        problem = plan.payload if plan.payload is not None else match(graph)
        reason = _device_reason(graph)
        if reason is not None:
            raise GraphNotSupportedError(reason)
        try:
            knobs = _plans.knobs_from(plan.knobs)
        except ValueError as exc:
            raise GraphNotSupportedError(f"plan {plan.label}: {exc}") from None
        spec = spec_for(problem, knobs, _device(graph.device[1]))
        compiled_for = kernel_spec(spec)
        reused = compiled_for in _cache           # in memory already (a disk load counts as a compile below)
        kernel = compiled_launcher(compiled_for, f"{spec.M}x{spec.N}x{spec.K}", self._require_toolchain)
        launcher = make_launcher(kernel, compiled_for, graph.device[1], (spec.M, spec.N, spec.K, spec.L))
        built = CuteGemmPlan(plan, problem, spec, launcher)
        built.scalar_defaults = tuple(_scalar_value(getattr(graph.tensor_by_uid(u), "value", None))
                                      for u in problem.scalar_uids)
        built.kernel_reused = reused                  # the graph's build log line reports these two
        built.compile_seconds = None if reused else compile_seconds.get(compiled_for)
        return built
