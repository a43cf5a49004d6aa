"""cudnn_graph graphs inside ``jax.jit``: an XLA FFI custom call, with gradients through backward graphs.

The one module of the package that imports jax; ``import cudnn_graph`` never imports it (import
``cudnn_graph.jax`` yourself).

``function(build)`` makes a jax-callable from a graph builder: ``build(*avals)`` (each a
``jax.ShapeDtypeStruct``; called with ``device="cuda:N"`` / ``"cpu"`` too when it takes that keyword)
describes a cudnn_graph graph for the traced shapes and dtypes and returns ``(graph, inputs,
outputs)``, its input and output Tensors in the order of the call's arguments and results. The graph
is built once per (shapes, dtypes, device) and registered with the custom-call handler
(cudnn_graph._xla_ffi); ``fn(*arrays)`` then works eagerly and under ``jax.jit`` and returns jax arrays.
``wrap(graph, inputs, outputs)`` does the same for one graph built already.

The ready-made ``matmul_bias_relu``, ``layernorm``, ``sdpa``, ``gdn`` and ``kda`` are built on it;
``layernorm``, ``sdpa``, ``gdn`` and ``kda`` are ``jax.custom_vjp`` functions whose backward runs the
matching backward graph (layernorm_backward, sdpa_backward, gdn_bwd, kda_bwd), so ``jax.grad`` works.

What runs where: a cuDNN plan runs in C inside the handler (no Python, no GIL) and reports the
command-buffer trait (XLA may capture it in its CUDA graphs); a CuTe plan with a C launch is called
from C too; any other Python engine's plan (cuTile, the reference engine of a host graph) runs through
the handler's GIL fallback. See docs/jax.md.

Devices: a plan runs only on the device it was built for. The custom call names a family of plans, one
per device it may run on, and the handler runs the member of the device XLA runs it on. Its device is
known only when XLA runs it (under ``shard_map`` every device of the mesh runs the one traced call),
and the handler cannot build a plan (no GIL), so a traced call builds the plans of every local GPU (or
the ``devices`` given to ``function``) when it is traced.

Example (a host graph, run by the reference engine through XLA on the CPU):
    >>> import jax, jax.numpy as jnp, cudnn_graph.jax as cgjax
    >>> y = jax.jit(cgjax.matmul_bias_relu)(jnp.ones((1, 4, 8)), jnp.ones((1, 8, 2)), jnp.zeros((1, 1, 2)))
    >>> y.shape
    (1, 4, 2)
"""
from __future__ import annotations

import functools
import inspect
import logging
import math
import re
import threading
import weakref
from pathlib import Path
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from . import _xla_ffi
from ._layout import row_major_strides   # re-exported: the strides of a tensor an XLA buffer feeds
from .errors import (DataTypeMismatchError, FfiRegistrationError, GraphNotSupportedError, InvalidArgumentError,
                     ShapeMismatchError)

logger = logging.getLogger(__name__)

__all__ = ["function", "wrap", "GraphFunction", "matmul_bias_relu", "layernorm", "sdpa", "gdn", "kda",
           "register_targets", "row_major_strides", "TARGET", "TARGET_COMMAND_BUFFER"]

TARGET = "cudnn_graph_plan"                                  # the handler without traits
TARGET_COMMAND_BUFFER = "cudnn_graph_plan_command_buffer"   # the same handler, command-buffer compatible

_registered: set = set()
_register_lock = threading.Lock()


def _framework_api_version() -> Optional[tuple]:
    """(major, minor) of the XLA FFI API of the installed jaxlib, read from the header it ships."""
    try:
        header = Path(jax.ffi.include_dir()) / "xla" / "ffi" / "api" / "c_api.h"
        text = header.read_text()
    except (OSError, AttributeError):
        return None
    major = re.search(r"#define\s+XLA_FFI_API_MAJOR\s+(\d+)", text)
    minor = re.search(r"#define\s+XLA_FFI_API_MINOR\s+(\d+)", text)
    if major is None or minor is None:
        return None
    return int(major.group(1)), int(minor.group(1))


def register_targets(platform: str) -> None:
    """Register the handler's two targets (TARGET, TARGET_COMMAND_BUFFER) for ``platform`` ("cpu" or
    "CUDA"), once per process.

    Example:
        >>> register_targets("cpu")
    """
    key = platform.lower()
    if key in _registered:
        return
    with _register_lock:
        if key in _registered:
            return
        version = _framework_api_version()
        if version is not None:
            _xla_ffi.set_reported_api_version(*version)
        for name, command_buffer in ((TARGET, False), (TARGET_COMMAND_BUFFER, True)):
            jax.ffi.register_ffi_target(name, _xla_ffi.handler_capsule(command_buffer), platform=platform)
        _registered.add(key)
        logger.debug("registered the cudnn_graph XLA FFI targets for %s (API version %s)", platform,
                     _xla_ffi.reported_api_version())


# ---- one built graph as a jax callable ------------------------------------------------------------------

class _Plan:
    """A registered graph: what a call needs to emit the custom call."""

    def __init__(self, graph, inputs, outputs, command_buffer: bool):
        self.graph = graph      # kept alive here: the handler's entry goes with the graph
        self.registration = _xla_ffi.register_graph(graph, inputs, outputs, command_buffer=command_buffer)
        reg = self.registration
        self.n_inputs = len(inputs)
        self.inputs = reg.tensors[:self.n_inputs]      # (name, uid, shape, numpy dtype name)
        self.outputs = reg.tensors[self.n_inputs:]
        self.platform = "cpu" if reg.device < 0 else "CUDA"
        self.target = TARGET_COMMAND_BUFFER if reg.command_buffer_compatible else TARGET
        results = [jax.ShapeDtypeStruct(shape, jnp.dtype(dtype)) for _, _, shape, dtype in self.outputs]
        if reg.workspace_size > 0:
            results.append(jax.ShapeDtypeStruct((reg.workspace_size,), jnp.uint8))
        self.results = results
        register_targets(self.platform)
        self._call = jax.ffi.ffi_call(self.target, results)

    def check(self, arrays) -> None:
        """Each argument against the tensor it feeds: a typed error naming the tensor (at trace time)."""
        if len(arrays) != self.n_inputs:
            raise InvalidArgumentError(f"the graph takes {self.n_inputs} inputs "
                                       f"({', '.join(t[0] for t in self.inputs)}); got {len(arrays)} arrays")
        for array, (name, uid, shape, dtype) in zip(arrays, self.inputs):
            got_shape = tuple(int(d) for d in jnp.shape(array))
            if got_shape != tuple(shape):
                raise ShapeMismatchError(name, uid, "shape", tuple(shape), got_shape)
            got_dtype = jnp.result_type(array).name
            if got_dtype != dtype:
                raise DataTypeMismatchError(name, uid, "data type", dtype, got_dtype)

    def __call__(self, *arrays):
        self.check(arrays)
        return _emit(self._call, arrays, self.registration.plan_id, len(self.outputs))


def _varying_axes(array) -> frozenset:
    """The mesh axes a value varies over inside ``shard_map`` (empty elsewhere)."""
    aval = jax.typeof(array) if hasattr(jax, "typeof") else jax.core.get_aval(array)
    manual = getattr(aval, "manual_axis_type", None)        # jax >= 0.9 spelling
    if manual is not None:
        return frozenset(manual.varying)
    return frozenset(getattr(aval, "vma", ()) or ())


def _emit(call, arrays, plan_id: int, n_outputs: int):
    """The custom call on ``arrays``, its outputs (one array or a tuple). Under ``shard_map`` the outputs
    vary over the mesh axes the arguments vary over: each device computes its own (XLA's ffi_call
    types its results as invariant, which a custom_vjp's cotangents would then contradict)."""
    results = call(*arrays, plan_id=np.int64(plan_id))
    outs = tuple(results[:n_outputs])
    axes = frozenset().union(*(_varying_axes(a) for a in arrays)) if arrays else frozenset()
    if axes:
        axes = tuple(sorted(axes))
        if hasattr(jax.lax, "pcast"):
            outs = tuple(jax.lax.pcast(o, axes, to="varying") for o in outs)
        else:
            outs = tuple(jax.lax.pvary(o, axes) for o in outs)
    return outs[0] if len(outs) == 1 else outs


class _Family:
    """The custom call of a GraphFunction for a set of devices: one registered plan per device, joined in
    the handler's table as a family whose id the call carries; the handler runs the member of the
    device XLA runs the call on (under ``shard_map``, every device of the mesh)."""

    def __init__(self, plans: dict, on_cuda: bool):
        self.plans = plans                  # {device ordinal: _Plan}
        first = next(iter(plans.values()))
        for ordinal, plan in plans.items():
            if [r[2:] for r in plan.outputs] != [r[2:] for r in first.outputs]:
                raise FfiRegistrationError(f"the graphs built for the devices disagree on their outputs: "
                                           f"{plan.outputs} on device {ordinal}, {first.outputs} on another")
        self.family_id = _xla_ffi.register_family({o: p.registration.plan_id for o, p in plans.items()},
                                                  on_cuda=on_cuda)
        weakref.finalize(self, _xla_ffi.release_plan, self.family_id)
        self.n_inputs = first.n_inputs
        self.inputs, self.outputs = first.inputs, first.outputs
        results = first.results[:len(first.outputs)]
        workspace = max(p.registration.workspace_size for p in plans.values())
        if workspace > 0:       # one result list for all members: the largest workspace
            results.append(jax.ShapeDtypeStruct((workspace,), jnp.uint8))
        self.results = results
        command_buffer = all(p.target == TARGET_COMMAND_BUFFER for p in plans.values())
        self.target = TARGET_COMMAND_BUFFER if command_buffer else TARGET
        register_targets(first.platform)
        self._call = jax.ffi.ffi_call(self.target, results)
        self.check = first.check

    def __call__(self, *arrays):
        self.check(arrays)
        return _emit(self._call, arrays, self.family_id, len(self.outputs))


def _ordinal(device) -> int:
    """A jax device's ordinal on its platform: the CUDA ordinal (cudnn_graph's cuda:N, the handler's view
    of XLA's stream) for a GPU, XLA's device ordinal for a host device."""
    hardware = getattr(device, "local_hardware_id", None)
    return int(device.id if hardware is None else hardware)


def _name(device) -> str:
    return "cpu" if device.platform == "cpu" else f"cuda:{_ordinal(device)}"


def _committed_device(arrays):
    """The one device of the concrete arrays among ``arrays`` (None: all traced, or several devices)."""
    tracer = getattr(getattr(jax, "core", None), "Tracer", ())
    for a in arrays:
        devices = getattr(a, "devices", None)
        if devices is None or (tracer and isinstance(a, tracer)):
            continue
        try:
            ds = devices()
        except Exception:
            continue
        if len(ds) == 1:
            return next(iter(ds))
    return None


def _default_device():
    # jax.default_device(...) sets this; traced arrays land there.
    default = getattr(jax.config, "jax_default_device", None)
    if isinstance(default, str):
        default = jax.devices(default)[0]
    return default if default is not None else jax.devices()[0]


def _device_of(arrays, device) -> str:
    """'cuda:N' or 'cpu': ``device`` if given, else the one committed device of concrete arrays, else
    jax's default device."""
    if device is not None:
        return device
    found = _committed_device(arrays)
    return _name(found if found is not None else _default_device())


def _jax_device(spec):
    """A jax device for ``spec``: a jax device, 'cpu' (the first host device) or 'cuda:N'."""
    if not isinstance(spec, str):
        return spec
    if spec == "cpu":
        return jax.local_devices(backend="cpu")[0]
    match = re.fullmatch(r"cuda:(\d+)", spec)
    if match is None:
        raise InvalidArgumentError("device", "'cpu', 'cuda:N' or a jax device", repr(spec))
    try:
        gpus = jax.local_devices(backend="gpu")
    except RuntimeError:
        gpus = []
    for d in gpus:
        if _ordinal(d) == int(match.group(1)):
            return d
    raise InvalidArgumentError("device", f"a local GPU of jax ({[_name(d) for d in gpus] or 'none'})", spec)


class GraphFunction:
    """``function(build)``'s result: call it with jax arrays (eagerly or traced) to run the graph
    ``build`` describes for their shapes and dtypes. ``plans`` holds the registered graphs by (avals,
    device), ``families`` the custom calls by (avals, devices)."""

    def __init__(self, build: Callable, *, device: Optional[str] = None, devices: Optional[Sequence] = None,
                 command_buffer: bool = True, name: Optional[str] = None):
        self.build = build
        self.device = device
        self.devices = None if devices is None else tuple(devices)
        self.command_buffer = command_buffer
        self.__name__ = name or getattr(build, "__name__", "graph_function")
        self.plans: dict = {}
        self.families: dict = {}
        self._lock = threading.RLock()
        try:
            self._pass_device = "device" in inspect.signature(build).parameters
        except (TypeError, ValueError):
            self._pass_device = False

    @staticmethod
    def _avals(arrays) -> tuple:
        return tuple(jax.ShapeDtypeStruct(tuple(int(d) for d in jnp.shape(a)), jnp.result_type(a)) for a in arrays)

    def plan_for(self, *arrays, device: Optional[str] = None) -> _Plan:
        """The registered plan for arrays (or avals) like these on ``device`` ('cuda:N' / 'cpu'; default:
        the function's device, the arrays' one, or jax's default device), built on first use."""
        return self._plan(self._avals(arrays), _device_of(arrays, device or self.device))

    def _plan(self, avals: tuple, device: str) -> _Plan:
        key = (tuple((a.shape, a.dtype.name) for a in avals), device)
        plan = self.plans.get(key)
        if plan is not None:
            return plan
        with self._lock:
            plan = self.plans.get(key)
            if plan is None:
                made = self.build(*avals, device=device) if self._pass_device else self.build(*avals)
                try:
                    graph, inputs, outputs = made
                except (TypeError, ValueError):
                    raise FfiRegistrationError(f"{self.__name__}: build must return (graph, inputs, outputs); got "
                                               f"{type(made).__name__}") from None
                _ensure_built(graph)
                plan = _Plan(graph, list(inputs), list(outputs), self.command_buffer)
                self.plans[key] = plan
                logger.debug("%s: built plan %d for %s", self.__name__, plan.registration.plan_id, key)
        return plan

    def members_for(self, *arrays) -> dict:
        """{device ordinal: 'cuda:N' | 'cpu'}: the devices a call on ``arrays`` gets a plan for. The
        ``devices`` the function was made with; else its pinned ``device``; else the concrete arrays'
        device; else (a traced call, whose device is known only when XLA runs it: under ``shard_map``
        each device of the mesh runs it) every local device of the platform. Host devices share one
        plan (host memory is everyone's)."""
        if self.devices is not None:
            chosen = [_jax_device(d) for d in self.devices]
        elif self.device is not None:
            chosen = [_jax_device(self.device)]
        else:
            found = _committed_device(arrays)
            chosen = [found] if found is not None else None
            if chosen is None:
                chosen = jax.local_devices(backend=_default_device().platform)
        if all(d.platform == "cpu" for d in chosen):
            chosen = jax.local_devices(backend="cpu")
        elif any(d.platform == "cpu" for d in chosen):
            raise InvalidArgumentError("devices", "devices of one platform", str([_name(d) for d in chosen]))
        return {_ordinal(d): _name(d) for d in chosen}

    def family_for(self, *arrays) -> _Family:
        """The custom call for arrays (or avals) like these: a family holding the plan of every device of
        ``members_for``, built and registered on first use (at trace time: the handler cannot build)."""
        avals = self._avals(arrays)
        members = self.members_for(*arrays)
        key = (tuple((a.shape, a.dtype.name) for a in avals), tuple(sorted(members.items())))
        family = self.families.get(key)
        if family is not None:
            return family
        with self._lock:
            family = self.families.get(key)
            if family is None:
                on_cuda = any(name != "cpu" for name in members.values())
                family = _Family({o: self._plan(avals, name) for o, name in members.items()}, on_cuda)
                self.families[key] = family
        return family

    def __call__(self, *arrays):
        return self.family_for(*arrays)(*arrays)


def _ensure_built(graph) -> None:
    if graph.compiled_plan() is None:
        from . import heur_mode
        graph.build([heur_mode.A, heur_mode.FALLBACK])


def function(build: Callable, *, device: Optional[str] = None, devices: Optional[Sequence] = None,
             command_buffer: bool = True, name: Optional[str] = None) -> GraphFunction:
    """A jax-callable running the graph ``build(*avals)`` describes, built once per (shapes, dtypes, device).

    ``build`` returns ``(graph, inputs, outputs)``: the graph (built here when it is not yet) and its
    input and output Tensors in the order of the call's arguments and results; the tensors must be
    dense row-major (XLA's layout). A call's custom call carries one plan per device it may run on:
    an eager call's arrays' device; a traced call (``jax.jit``, ``shard_map``), whose device XLA picks
    when it runs, every local GPU (or host device), each plan built when the call is first traced.
    ``devices`` (jax devices or 'cuda:N' strings, e.g. a mesh's ``devices.flat``) limits that set;
    ``device`` ('cpu', 'cuda:N') pins one device (a call on another is a typed runtime error).
    ``command_buffer=False`` keeps a cuDNN plan from reporting the command-buffer trait.

    Example:
        >>> import jax, jax.numpy as jnp, cudnn_graph as cudnn
        >>> def build(a, b, device):
        ...     g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT,
        ...                       device=device)
        ...     ta, tb = g.tensor_like(a, name="a"), g.tensor_like(b, name="b")
        ...     y = g.add(ta, tb).set_output(True)
        ...     return g, [ta, tb], [y]
        >>> add = function(build)
        >>> jax.jit(add)(jnp.ones((2, 3)), jnp.ones((2, 3)))[0, 0]
        Array(2., dtype=float32)
    """
    return GraphFunction(build, device=device, devices=devices, command_buffer=command_buffer, name=name)


def wrap(graph, inputs: Sequence, outputs: Sequence, *, command_buffer: bool = True) -> Callable:
    """A jax-callable running one graph built already; arguments must match its inputs exactly (a
    mismatch is a ShapeMismatchError / DataTypeMismatchError naming the tensor, at trace time).

    Example (a built graph ``g`` with inputs ``a``, ``b`` and output ``y``):
        >>> f = wrap(g, [a, b], [y]); jax.jit(f)(A, B)     # doctest: +SKIP
    """
    _ensure_built(graph)
    return _Plan(graph, list(inputs), list(outputs), command_buffer)


# ---- tensors for avals ------------------------------------------------------------------------------------

def _tensor(g, name: str, aval, data_type=None):
    from .data_type import data_type_of
    shape = [int(d) for d in aval.shape]
    return g.tensor(name=name, dim=shape, stride=row_major_strides(shape),
                    data_type=data_type if data_type is not None else data_type_of(aval.dtype.name))


def _graph(device, io_dtype, name):
    from . import pygraph, data_type
    from .data_type import data_type_of
    return pygraph(io_data_type=data_type_of(io_dtype.name), intermediate_data_type=data_type.FLOAT,
                   compute_data_type=data_type.FLOAT, device=device, name=name)


def _cached_function(key, build):
    """One GraphFunction per ready-made op configuration (so its plans are cached across calls)."""
    found = _FUNCTIONS.get(key)
    if found is None:
        found = _FUNCTIONS.setdefault(key, function(build, name=key[0]))
    return found


_FUNCTIONS: dict = {}


# ---- matmul + bias + relu ---------------------------------------------------------------------------------

def _matmul_bias_relu_build(a, b, bias, device):
    g = _graph(device, a.dtype, "matmul_bias_relu")
    ta, tb, tbias = _tensor(g, "a", a), _tensor(g, "b", b), _tensor(g, "bias", bias)
    y = g.relu(g.add(g.matmul(ta, tb), tbias))
    y.set_output(True).set_name("y").set_data_type(ta.get_data_type())
    return g, [ta, tb, tbias], [y]


def matmul_bias_relu(a, b, bias):
    """relu(a @ b + bias) as one graph: a (B, M, K), b (B, K, N), bias broadcasting to (B, M, N).

    Example:
        >>> import jax.numpy as jnp
        >>> matmul_bias_relu(jnp.ones((1, 2, 3)), jnp.ones((1, 3, 4)), jnp.zeros((1, 1, 4)))[0, 0, 0]
        Array(3., dtype=float32)
    """
    return _cached_function(("matmul_bias_relu",), _matmul_bias_relu_build)(a, b, bias)


# ---- layer norm -------------------------------------------------------------------------------------------

def _layernorm_fwd_build(eps):
    def build(x, scale, bias, device):
        from . import data_type, norm_forward_phase
        g = _graph(device, x.dtype, "layernorm")
        tx, ts, tb = _tensor(g, "x", x), _tensor(g, "scale", scale), _tensor(g, "bias", bias)
        y, mean, inv = g.layernorm(norm_forward_phase=norm_forward_phase.TRAINING, input=tx, scale=ts, bias=tb,
                                   epsilon=g.tensor_scalar(float(eps), data_type=data_type.FLOAT))
        y.set_output(True).set_name("y").set_data_type(tx.get_data_type())
        mean.set_output(True).set_name("mean").set_data_type(data_type.FLOAT)
        inv.set_output(True).set_name("inv_variance").set_data_type(data_type.FLOAT)
        return g, [tx, ts, tb], [y, mean, inv]
    return build


def _layernorm_bwd_build(dy, x, scale, mean, inv, device):
    from . import data_type
    g = _graph(device, x.dtype, "layernorm_backward")
    t = [_tensor(g, n, a) for n, a in (("dy", dy), ("x", x), ("scale", scale), ("mean", mean),
                                       ("inv_variance", inv))]
    dx, dscale, dbias = g.layernorm_backward(grad=t[0], input=t[1], scale=t[2], mean=t[3], inv_variance=t[4])
    dx.set_output(True).set_name("dx").set_data_type(t[1].get_data_type())
    dscale.set_output(True).set_name("dscale").set_data_type(t[2].get_data_type())
    dbias.set_output(True).set_name("dbias").set_data_type(t[2].get_data_type())
    return g, t, [dx, dscale, dbias]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _layernorm(x, scale, bias, eps):
    return _cached_function(("layernorm", float(eps)), _layernorm_fwd_build(eps))(x, scale, bias)[0]


def _layernorm_vjp_fwd(x, scale, bias, eps):
    y, mean, inv = _cached_function(("layernorm", float(eps)), _layernorm_fwd_build(eps))(x, scale, bias)
    return y, (x, scale, mean, inv)


def _layernorm_vjp_bwd(eps, saved, dy):
    x, scale, mean, inv = saved
    dx, dscale, dbias = _cached_function(("layernorm_backward",), _layernorm_bwd_build)(dy, x, scale, mean, inv)
    return dx, dscale, dbias


_layernorm.defvjp(_layernorm_vjp_fwd, _layernorm_vjp_bwd)


def layernorm(x, scale, bias, *, eps: float = 1e-5):
    """Layer norm over the axes where ``scale`` is not 1 (scale and bias: x's rank, 1 on the batch axes),
    differentiable (its backward runs layernorm_backward).

    Example:
        >>> import jax.numpy as jnp
        >>> layernorm(jnp.arange(8.0).reshape(2, 4), jnp.ones((1, 4)), jnp.zeros((1, 4))).shape
        (2, 4)
    """
    return _layernorm(x, scale, bias, float(eps))


# ---- scaled dot-product attention -------------------------------------------------------------------------

def _sdpa_kw(causal, scale, d):
    kw = {"attn_scale": float(scale) if scale is not None else 1.0 / math.sqrt(d)}
    if causal:
        kw["diagonal_band_right_bound"] = 0
        kw["diagonal_alignment"] = _top_left()
    return kw


def _top_left():
    from . import diagonal_alignment
    return diagonal_alignment.TOP_LEFT


def _sdpa_fwd_build(causal, scale):
    def build(q, k, v, device):
        from . import data_type
        g = _graph(device, q.dtype, "sdpa")
        tq, tk, tv = _tensor(g, "q", q), _tensor(g, "k", k), _tensor(g, "v", v)
        o, stats = g.sdpa(tq, tk, tv, generate_stats=True, **_sdpa_kw(causal, scale, q.shape[-1]))
        o.set_output(True).set_name("o").set_dim(list(q.shape[:-1]) + [v.shape[-1]])
        o.set_stride(row_major_strides(list(q.shape[:-1]) + [v.shape[-1]]))
        stats.set_output(True).set_name("stats").set_data_type(data_type.FLOAT)
        return g, [tq, tk, tv], [o, stats]
    return build


def _sdpa_bwd_build(causal, scale):
    def build(q, k, v, o, do, stats, device):
        g = _graph(device, q.dtype, "sdpa_backward")
        t = [_tensor(g, n, a) for n, a in (("q", q), ("k", k), ("v", v), ("o", o), ("dO", do), ("stats", stats))]
        dq, dk, dv = g.sdpa_backward(*t, **_sdpa_kw(causal, scale, q.shape[-1]))
        for name, out, like in (("dQ", dq, q), ("dK", dk, k), ("dV", dv, v)):
            out.set_output(True).set_name(name).set_dim(list(like.shape)).set_stride(row_major_strides(like.shape))
        return g, t, [dq, dk, dv]
    return build


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _sdpa(q, k, v, causal, scale):
    return _cached_function(("sdpa", causal, scale), _sdpa_fwd_build(causal, scale))(q, k, v)[0]


def _sdpa_vjp_fwd(q, k, v, causal, scale):
    o, stats = _cached_function(("sdpa", causal, scale), _sdpa_fwd_build(causal, scale))(q, k, v)
    return o, (q, k, v, o, stats)


def _sdpa_vjp_bwd(causal, scale, saved, do):
    q, k, v, o, stats = saved
    return tuple(_cached_function(("sdpa_backward", causal, scale), _sdpa_bwd_build(causal, scale))(
        q, k, v, o, do, stats))


_sdpa.defvjp(_sdpa_vjp_fwd, _sdpa_vjp_bwd)


def sdpa(q, k, v, *, causal: bool = False, scale: Optional[float] = None):
    """Scaled dot-product attention, q (b, h, s_q, d), k / v (b, h_k, s_kv, d): softmax(scale q k^T) v with
    an optional causal (top-left) mask; differentiable (its backward runs sdpa_backward). ``scale``
    defaults to 1 / sqrt(d).

    Example:
        >>> import jax.numpy as jnp
        >>> sdpa(*(jnp.ones((1, 1, 4, 8)),) * 3, causal=True).shape
        (1, 1, 4, 8)
    """
    return _sdpa(q, k, v, bool(causal), None if scale is None else float(scale))


# ---- linear attention (gated delta net, Kimi delta attention) ----------------------------------------------

# the training forward keeps the state at each 64-token chunk's start (state_checkpoints), which its backward
# starts from instead of running the state recurrence again: the GPU kernels' chunk, so their fastest pair
_CHECKPOINT_EVERY = 64


def _la_fwd_build(op, scale, l2, checkpoints=False):
    def build(q, k, v, g_, beta, cu_seqlens, device):
        # the training forward also keeps its chunk cache where a plan can write it (BF16 / FP16 on sm_90: the
        # backward then runs no prepare); elsewhere the graph is made again without it
        for cache in ((True, False) if checkpoints else (False,)):
            g = _graph(device, q.dtype, op)
            t = [_tensor(g, n, a) for n, a in (("q", q), ("k", k), ("v", v), ("g", g_), ("beta", beta),
                                               ("cu_seqlens", cu_seqlens))]
            kept = g.tensor(name="chunk_cache") if cache else None
            o, _, states = getattr(g, op)(*t[:5], cu_seqlens=t[5], scale=scale, use_qk_l2norm=l2,
                                          checkpoint_every_n_tokens=_CHECKPOINT_EVERY if checkpoints else 0,
                                          **({"chunk_cache": kept} if cache else {}))
            o.set_output(True).set_name("o")
            outputs = [o] + ([states.set_output(True).set_name("state_checkpoints")] if checkpoints else [])
            if not cache:
                return g, t, outputs
            kept.set_output(True)
            try:
                _ensure_built(g)
            except GraphNotSupportedError as exc:
                logger.debug("%s: no plan keeps the chunk cache here (%s); the backward forms it again", op, exc)
                continue
            return g, t, outputs + [kept]
    return build


def _la_bwd_build(op, scale, l2, checkpoints=False, cache=False):
    def build(q, k, v, g_, beta, cu_seqlens, do, *kept, device):
        g = _graph(device, q.dtype, op)
        named = [("q", q), ("k", k), ("v", v), ("g", g_), ("beta", beta), ("cu_seqlens", cu_seqlens), ("dO", do)]
        names = (("state_checkpoints",) if checkpoints else ()) + (("chunk_cache",) if cache else ())
        named += list(zip(names, kept))
        t = [_tensor(g, n, a) for n, a in named]
        given = {name: tensor for name, tensor in zip(names, t[7:])}
        if checkpoints:
            given["checkpoint_every_n_tokens"] = _CHECKPOINT_EVERY
        outs = getattr(g, op)(*t[:5], t[6], cu_seqlens=t[5], scale=scale, use_qk_l2norm=l2, **given)
        grads = [x for x in outs[:5]]
        for name, x in zip(("dq", "dk", "dv", "dg", "dbeta"), grads):
            x.set_output(True).set_name(name)
        return g, t, grads
    return build


def _linear_attention(op: str, bwd_op: str):
    @functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
    def run(q, k, v, g, beta, cu_seqlens, scale, l2):
        return _cached_function((op, scale, l2), _la_fwd_build(op, scale, l2))(q, k, v, g, beta, cu_seqlens)

    def fwd(q, k, v, g, beta, cu_seqlens, scale, l2):
        o, *kept = _cached_function((op, scale, l2, "checkpoints"), _la_fwd_build(op, scale, l2, True))(
            q, k, v, g, beta, cu_seqlens)
        return o, (q, k, v, g, beta, cu_seqlens, tuple(kept))

    def bwd(scale, l2, saved, do):
        q, k, v, g, beta, cu_seqlens, kept = saved
        cache = len(kept) > 1            # state_checkpoints, and the chunk cache where the forward kept it
        key = (bwd_op, scale, l2, "checkpoints") + (("chunk_cache",) if cache else ())
        dq, dk, dv, dg, dbeta = _cached_function(key, _la_bwd_build(bwd_op, scale, l2, True, cache))(
            q, k, v, g, beta, cu_seqlens, do, *kept)
        # cu_seqlens is an integer input: its cotangent is float0 zeros.
        dcu = np.zeros(jnp.shape(cu_seqlens), dtype=jax.dtypes.float0)
        return dq, dk, dv, dg, dbeta, dcu

    run.defvjp(fwd, bwd)
    return run


_gdn = _linear_attention("gdn", "gdn_bwd")
_kda = _linear_attention("kda", "kda_bwd")


def gdn(q, k, v, g, beta, cu_seqlens, *, scale: Optional[float] = None, use_qk_l2norm: bool = False):
    """Gated delta net over packed sequences: q, k (T, H, K), v (T, H, V), g (T, H) float32 log decay,
    beta (T, H), cu_seqlens (N + 1,) int32; returns o (T, H, V). Differentiable (gdn_bwd) in q, k, v,
    g and beta: under differentiation the forward also keeps the state at each 64-token chunk's start
    ((T // 64 + N) x H x K x V in q's type), and the backward starts from those.

    Example (on a GPU with the cuTile engine):
        >>> o = gdn(q, k, v, g, beta, cu_seqlens)      # doctest: +SKIP
    """
    return _gdn(q, k, v, g, beta, cu_seqlens, None if scale is None else float(scale), bool(use_qk_l2norm))


def kda(q, k, v, g, beta, cu_seqlens, *, scale: Optional[float] = None, use_qk_l2norm: bool = False):
    """Kimi delta attention: ``gdn`` with a per-key-channel decay g (T, H, K); differentiable (kda_bwd).

    Example (on a GPU with the cuTile engine):
        >>> o = kda(q, k, v, g, beta, cu_seqlens)      # doctest: +SKIP
    """
    return _kda(q, k, v, g, beta, cu_seqlens, None if scale is None else float(scale), bool(use_qk_l2norm))
