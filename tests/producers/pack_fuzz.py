"""Variant-pack fuzz cases on host graphs, shared by tests/core/test_variant_pack_fuzz.py (bounded, in CI,
driven by hypothesis) and bench/fuzz_execute.py (long runs, in child processes).

A case is one ``execute`` of a small host graph (a chain of pointwise ops over one shape and dtype, run
by the reference engine) with a variant pack mutated one way (``MUTATIONS``): keys of every kind,
buffers from NumPy and DLPack capsules (NumPy's, reused, hand-made ones misnamed, of a wrong version or
with a NULL deleter, from ``exchange_producer.make_capsule``, which counts deleter calls), wrong dtypes
and shapes, negative / zero / random strides, misalignment, read-only outputs and bare ints.

``run_host_case(spec)`` returns ``{"outcome", "detail"}``; the outcome is ``ok`` (the result equals
NumPy's), ``typed`` (a ``CudnnGraphError`` naming the tensor at fault), or a defect: ``wrong`` (a wrong
result, an untyped error, a typed one naming another tensor or none, or an error where none is due)
and ``leak`` (a hand-made capsule's deleter not called exactly once over the capsule's life).

Example:
    >>> run_host_case({"chain": 3, "seed": 1, "mutation": "duplicate", "dtype": "FLOAT"})["outcome"]
    'typed'
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

BINARY_OPS = ("add", "mul", "sub")
OPS = ("relu", "tanh", "sigmoid", "abs", "neg", "exp") + BINARY_OPS
# Ops whose results stay small integers for small integer inputs: exact in every dtype.
EXACT_OPS = ("relu", "abs", "neg") + BINARY_OPS
NUMPY_OPS = {"relu": lambda a: np.maximum(a, 0), "tanh": np.tanh, "sigmoid": lambda a: 1 / (1 + np.exp(-a)),
             "abs": np.abs, "neg": np.negative, "exp": np.exp, "add": np.add, "mul": np.multiply,
             "sub": np.subtract}

# io data type -> relative tolerance of the result (computed in FLOAT, rounded to io on the way out).
DTYPES = {"FLOAT": 1e-5, "HALF": 2e-3, "BFLOAT16": 1.6e-2, "DOUBLE": 1e-5, "INT32": 0.0, "INT64": 0.0}

MUTATIONS = ("none", "key_uid", "key_name", "foreign", "virtual", "duplicate", "missing", "extra", "dtype",
             "shape", "stride_negative", "stride_zero", "stride_overlap", "stride_random", "misaligned",
             "readonly_output", "capsule", "capsule_reused", "capsule_wrong_name", "capsule_wrong_version",
             "capsule_null_deleter", "capsule_versioned", "capsule_legacy", "int_on_host")

# What a mutation must give: "ok" (the right result), "error" (a typed error naming the tensor at fault),
# or "either" (a layout that may or may not be acceptable: right result or a typed error naming it).
EXPECT = {"none": "ok", "key_uid": "ok", "key_name": "ok", "foreign": "error", "virtual": "error",
          "duplicate": "error", "missing": "error", "extra": "error", "dtype": "error", "shape": "error",
          "stride_negative": "either", "stride_zero": "either", "stride_overlap": "either",
          "stride_random": "either", "misaligned": "error", "readonly_output": "error", "capsule": "ok",
          "capsule_reused": "error", "capsule_wrong_name": "error", "capsule_wrong_version": "error",
          "capsule_null_deleter": "ok", "capsule_versioned": "ok", "capsule_legacy": "ok",
          "int_on_host": "error"}


def host_dtype(name: str):
    """The NumPy dtype of a DataType name."""
    import ml_dtypes
    return {"FLOAT": np.float32, "HALF": np.float16, "BFLOAT16": ml_dtypes.bfloat16, "DOUBLE": np.float64,
            "INT32": np.int32, "INT64": np.int64}[name]


def dlpack_dtype(name: str) -> tuple:
    """(code, bits, lanes) of a DataType name, for hand-made capsules."""
    return {"FLOAT": (2, 32, 1), "HALF": (2, 16, 1), "BFLOAT16": (4, 16, 1), "DOUBLE": (2, 64, 1),
            "INT32": (0, 32, 1), "INT64": (0, 64, 1)}[name]


_GRAPHS: dict = {}


def chain_graph(chain: int, device: str = "cpu", dtype: str = "FLOAT"):
    """(graph, x, b, y, virtuals, dims, ops): a chain of 1-4 ops over one shape, built once per key.

    Chains with ``chain % 4 == 3`` on the host leave x's strides undeclared, so the pack takes any
    layout for it (negative, zero, random strides reach the engine); the others declare row-major.
    """
    key = (chain, device, dtype)
    if key in _GRAPHS:
        return _GRAPHS[key]
    import cudnn_graph as cudnn
    F = cudnn.data_type
    rng = np.random.default_rng(1000 + chain)
    dims = [int(d) for d in rng.integers(1, 9, int(rng.integers(1, 4)))]
    io = getattr(F, dtype)
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT, device=device)
    strides = [int(np.prod(dims[i + 1:])) for i in range(len(dims))]
    any_layout = device == "cpu" and chain % 4 == 3
    x = g.tensor(name="x", dim=dims) if any_layout else g.tensor(name="x", dim=dims, stride=strides)
    b = g.tensor(name="b", dim=dims, stride=strides)
    table = OPS if DTYPES[dtype] else EXACT_OPS
    ops = [table[int(k)] for k in rng.integers(len(table), size=int(rng.integers(0, 4)))]
    ops.insert(int(rng.integers(len(ops) + 1)), BINARY_OPS[chain % 3])   # b is always used
    t, virtuals = x, []
    for op in ops:
        t = getattr(g, op)(t, b) if op in BINARY_OPS else getattr(g, op)(t)
        virtuals.append(t)
    t.set_output(True).set_name("y").set_data_type(io)
    for i, v in enumerate(virtuals[:-1]):
        v.set_name(f"v{i}")
    g.build([cudnn.heur_mode.A])
    _GRAPHS[key] = (g, x, b, t, virtuals[:-1], dims, ops)
    return _GRAPHS[key]


def expected(ops, xv, bv, dtype: str = "FLOAT") -> np.ndarray:
    """The chain computed by NumPy in float32 (the graphs' compute type), as float64 for comparison."""
    t = np.asarray(xv).astype(np.float32)
    b = np.asarray(bv).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for op in ops:
            t = NUMPY_OPS[op](t, b) if op in BINARY_OPS else NUMPY_OPS[op](t)
        return np.asarray(t, np.float32).astype(host_dtype(dtype)).astype(np.float64)


def matches(got, want, dtype: str = "FLOAT") -> bool:
    rtol = DTYPES[dtype]
    return bool(np.allclose(np.asarray(got).astype(np.float64), want, rtol=rtol, atol=rtol, equal_nan=True))


def overlaps(shape, strides) -> bool:
    """Brute force: do two indices of ``shape`` share an element under ``strides``?"""
    if 0 in shape:
        return False
    offsets = np.zeros(1, np.int64)
    for n, s in zip(shape, strides):
        offsets = (offsets[:, None] + np.arange(n, dtype=np.int64)[None, :] * s).reshape(-1)
    return len(np.unique(offsets)) != offsets.size


def strided_view(rng, dims, fill) -> tuple:
    """(view, base, strides): a view of ``dims`` with random element strides in [-3, 3] (negative, zero,
    gapped, overlapping) over a fresh base array of ``fill(size)``."""
    strides = [int(s) for s in rng.integers(-3, 4, len(dims))]
    span = sum(abs(s) * (n - 1) for s, n in zip(strides, dims))
    base = fill(span + 1)
    start = sum(abs(s) * (n - 1) for s, n in zip(strides, dims) if s < 0)
    view = as_strided(base[start:], dims, [s * base.itemsize for s in strides])
    return view, base, strides


def _values(rng, dims, dtype: str) -> np.ndarray:
    if DTYPES[dtype]:
        return rng.uniform(-2, 2, dims).astype(host_dtype(dtype))
    return rng.integers(-2, 3, dims).astype(host_dtype(dtype))


def _names_fault(exc, at_fault) -> bool:
    """The typed error names the tensor at fault: its attributes, else its label in the message."""
    if isinstance(at_fault, int):
        return f"uid {at_fault}" in str(exc)
    return getattr(exc, "tensor_name", None) == at_fault or f"tensor '{at_fault}'" in str(exc)


def _capsule_name(capsule) -> bytes:
    import ctypes
    getname = ctypes.pythonapi.PyCapsule_GetName
    getname.restype, getname.argtypes = ctypes.c_char_p, [ctypes.py_object]
    return getname(capsule) or b""


def _numpy_capsule(array: np.ndarray, dtype: str):
    """NumPy's own capsule; a hand-made one for bfloat16, which NumPy cannot export through DLPack."""
    if dtype == "BFLOAT16":
        from cudnn_graph._testing import exchange_producer as ep
        return ep.make_capsule(array, dtype=dlpack_dtype(dtype))
    return array.__dlpack__()


def run_host_case(spec: dict) -> dict:
    """One host-graph case (``spec``: chain, seed, mutation, optional dtype); see the module docstring."""
    import cudnn_graph as cudnn
    from cudnn_graph._testing import exchange_producer as ep
    dtype = spec.get("dtype", "FLOAT")
    mutation = spec["mutation"]
    g, x, b, y, virtuals, dims, ops = chain_graph(spec["chain"], "cpu", dtype)
    rng = np.random.default_rng(spec["seed"])
    np_dtype = host_dtype(dtype)
    xv, bv = _values(rng, dims, dtype), _values(rng, dims, dtype)
    out = np.full(dims, np.nan if DTYPES[dtype] else -99, np_dtype)
    result = out                         # where the result is read (a strided output is a view)
    pack = {x: xv, b: bv, y: out}
    expect, at_fault, keep, capsule = EXPECT[mutation], None, [], None
    if mutation == "key_uid":
        pack = {x.uid: xv, b.uid: bv, y.uid: out}
    elif mutation == "key_name":
        pack = {"x": xv, "b": bv, "y": out}
    elif mutation == "foreign":
        other = chain_graph((spec["chain"] + 1 + int(rng.integers(63))) % 64, "cpu", dtype)
        which = int(rng.integers(3))
        del pack[(x, b, y)[which]]
        pack[other[1 + which]] = (xv, bv, out)[which]
        at_fault = other[1 + which].name
    elif mutation == "virtual":
        if virtuals:
            v = virtuals[int(rng.integers(len(virtuals)))]
            pack[(v, v.uid, v.name)[int(rng.integers(3))]] = np.zeros(dims, np_dtype)
            at_fault = v.name
        else:
            expect = "ok"                # a one-op chain has no virtual tensor
    elif mutation == "duplicate":
        tensor = (x, b, y)[int(rng.integers(3))]
        pack[(tensor.uid, tensor.name)[int(rng.integers(2))]] = pack[tensor]
        at_fault = tensor.name
    elif mutation == "missing":
        tensor = (x, b, y)[int(rng.integers(3))]
        del pack[tensor]
        at_fault = tensor.name
    elif mutation == "extra":
        pack[12345] = xv
        at_fault = 12345
    elif mutation == "dtype":
        others = [d for d in DTYPES if host_dtype(d) != np_dtype]
        tensor = (x, b, y)[int(rng.integers(3))]
        with np.errstate(invalid="ignore"):       # a NaN-filled output cast to an integer type
            pack[tensor] = pack[tensor].astype(host_dtype(others[int(rng.integers(len(others)))]))
        at_fault = tensor.name
    elif mutation == "shape":
        tensor = (x, b, y)[int(rng.integers(3))]
        pack[tensor] = np.zeros(dims + [2], np_dtype)
        at_fault = tensor.name
    elif mutation == "stride_negative":
        pack[x] = xv = np.flip(np.flip(xv).copy())        # the same values, every stride negative
        at_fault = "x"
    elif mutation == "stride_zero":
        pack[x] = np.broadcast_to(xv.reshape(-1)[:1].reshape([1] * len(dims)), dims)
        xv = np.asarray(pack[x])
        at_fault = "x"
    elif mutation in ("stride_overlap", "stride_random"):
        tensor = y if mutation == "stride_overlap" else (x, y)[int(rng.integers(2))]
        if mutation == "stride_overlap":
            view, base, strides = as_strided(out, dims, [0] * len(dims)), out, [0] * len(dims)
        elif tensor is x:
            view, base, strides = strided_view(rng, dims, lambda n: _values(rng, [n], dtype))
        else:
            view, base, strides = strided_view(rng, dims, lambda n: np.full(n, -7, np_dtype))
        pack[tensor] = view
        if tensor is x:
            xv = view
        else:
            result = view
            if overlaps(dims, strides):
                expect = "error"         # an overlapping output can never hold the right result
        keep.append(base)
        at_fault = tensor.name
    elif mutation == "misaligned":
        raw = np.zeros(xv.nbytes + 1, np.uint8)
        pack[x] = np.frombuffer(raw.data, np_dtype, xv.size, offset=1).reshape(dims)
        keep.append(raw)
        at_fault = "x"
    elif mutation == "readonly_output":
        out.flags.writeable = False
        at_fault = "y"
    elif mutation == "capsule":
        pack[x] = _numpy_capsule(xv, dtype)
    elif mutation == "capsule_reused":
        capsule = _numpy_capsule(xv, dtype)
        try:
            g.execute({x: capsule, b: bv, y: np.empty(dims, np_dtype)})
        except cudnn.CudnnGraphError:
            pass
        pack[x] = capsule
        at_fault = "x"
    elif mutation.startswith("capsule_"):
        kwargs = {"capsule_wrong_name": {"name": b"not_a_tensor"}, "capsule_wrong_version": {"version": (99, 0)},
                  "capsule_null_deleter": {"null_deleter": True}, "capsule_versioned": {},
                  "capsule_legacy": {"versioned": False}}[mutation]
        made_before, deleted_before = ep.counts()
        pack[x] = capsule = ep.make_capsule(xv, dtype=dlpack_dtype(dtype), **kwargs)
        at_fault = "x"
    elif mutation == "int_on_host":
        pack[x] = int(xv.ctypes.data)
        at_fault = "x"
    outcome = _execute_and_judge(g, pack, at_fault, expect, mutation, ops, xv, bv, result, dtype)
    if capsule is None or mutation == "capsule_reused":
        return outcome
    # A hand-made capsule's deleter: once by the time execute returned if it was consumed, not yet
    # otherwise; once in all, the capsule's own destructor included, after it dies (never if NULL).
    consumed = _capsule_name(capsule).startswith(b"used_")
    null = mutation == "capsule_null_deleter"
    made, deleted = ep.counts()
    during = deleted - deleted_before
    if made - made_before != 1 or during != (1 if consumed and not null else 0):
        return {"outcome": "leak", "detail": f"{mutation}: deleter called {during}x by execute, consumed={consumed}"}
    del pack, capsule                    # no cycle holds either: their references go now
    total = ep.counts()[1] - deleted_before
    if total != (0 if null else 1):
        return {"outcome": "leak", "detail": f"{mutation}: deleter called {total}x over the capsule's life"}
    return outcome


def _execute_and_judge(g, pack, at_fault, expect, mutation, ops, xv, bv, result, dtype) -> dict:
    import cudnn_graph as cudnn
    try:
        g.execute(pack)
    except cudnn.CudnnGraphError as exc:
        if expect == "ok":
            return {"outcome": "wrong", "detail": f"{mutation}: refused a valid pack: {type(exc).__name__}: "
                                                  f"{str(exc)[:200]}"}
        if not _names_fault(exc, at_fault):
            return {"outcome": "wrong", "detail": f"{mutation}: {type(exc).__name__} not naming {at_fault!r}: "
                                                  f"{str(exc)[:200]}"}
        return {"outcome": "typed", "detail": f"{mutation}: {type(exc).__name__}"}
    except Exception as exc:   # anything untyped is a defect
        return {"outcome": "wrong", "detail": f"{mutation}: untyped {type(exc).__name__}: {str(exc)[:200]}"}
    if expect == "error":
        return {"outcome": "wrong", "detail": f"{mutation}: accepted, expected a typed error naming {at_fault!r}"}
    if not matches(result, expected(ops, xv, bv, dtype), dtype):
        return {"outcome": "wrong", "detail": f"{mutation}: executed, result differs"}
    return {"outcome": "ok", "detail": mutation}
