"""Which kernel instances a plan needs, and their export signatures (for the compile-only CI check).

A ``Variant`` is everything that specialises the kernels: the op's gate/beta/write-gate shapes, the
input type, K, V, the value block, the number of sequences (it sizes the chunk-locating tile), the value
heads per query/key head (``group``), the gate options (``GateOptions``) and the optional inputs/outputs. ``signatures(variant)`` gives one ``(kernel, KernelSignature)`` per kernel, with
the array constraints the engine's launches satisfy (row-major, no aliasing between outputs and inputs).
"""
from __future__ import annotations

from dataclasses import dataclass

CHUNK = 64
# Per-channel decays exp(gc_t - gc_i) are formed as two factors split at this row of a chunk (_kernels), so
# either factor spans at most CHUNK - 1 - SPLIT_ROW tokens of decay.
SPLIT_ROW = CHUNK // 2 - 1
# The largest exponent a split factor may reach: float32 (and bf16) overflow past 88.7, and the factor still
# multiplies a key or query value.
SPLIT_EXPONENT_LIMIT = 80.0
# warps a CTA of the CuTe backward chunk kernels may have (engines/cute/_delta_chunk ``ChunkKernel.set_warps``;
# knobs grads_warps and values_warps: chunk_bwd_grads and chunk_bwd_values)
BLOCK_WARPS = (4, 8)


def split_safe_lower_bound() -> float:
    """The most negative per-token log decay for which the split factors of a per-channel decay stay finite
    whatever the data: a bounded gate (``gate_lower_bound``) below it can overflow to inf / NaN."""
    return -SPLIT_EXPONENT_LIMIT / (CHUNK - 1 - SPLIT_ROW)

# op -> (per-channel gate, per-channel beta, write gate)
OP_FEATURES = {
    "gdn": (False, False, False),
    "kda": (True, False, False),
    "gdn2": (True, True, True),
}


# cudnn_graph.ops._linear_attention.gate_transform's forms as the gate kernels' GATE_FORM constant
GATE_FORMS = {"none": 0, "softplus": 1, "sigmoid": 2}


@dataclass(frozen=True)
class GateOptions:
    """The in-kernel gate and beta transforms (cudnn_graph.ops._linear_attention: gate_transform,
    beta_transform) and the raw inputs' types; a type of None is an absent input."""
    form: str = "none"               # none | softplus | sigmoid
    lower_bound: float = 0.0         # the sigmoid form's bound
    beta_factor: float = 0.0         # 0: beta as given; else beta_factor * sigmoid(beta)
    g_dtype: str = "float32"         # the raw gate's type
    beta_dtype: str = "float32"      # the beta logits' type
    a_log_dtype: str | None = None
    dt_bias_dtype: str | None = None

    @property
    def on_gate(self) -> bool:
        return self.form != "none"

    @property
    def on_beta(self) -> bool:
        return self.beta_factor != 0.0


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@dataclass(frozen=True)
class Variant:
    op: str                 # gdn | kda | gdn2
    io_dtype: str           # bfloat16 | float16 | float32 (q, k, v, o)
    beta_dtype: str         # type of beta
    w_dtype: str            # type of the write gate (gdn2), else io_dtype
    K: int
    V: int
    block_v: int
    n_seq: int
    scale: float
    use_l2: bool
    has_h0: bool
    store_ht: bool
    low_mma: bool = False   # BF16 inputs for the w / u, state and output products (else TF32)
    # with low_mma, the cuTile state pass's products take FP16 inputs instead (FP16 scratch; forward plans whose
    # other kernels are CuTe)
    fp16_products: bool = False
    has_dht: bool = False   # backward: d_final_state is given
    output_block_v: int = 0  # value columns per CTA of the output kernel (0: block_v)
    scratch_dtype: str = "float32"   # w, u, kd, the deltas and the chunk-start states of the forward
    # the backward's own scratch (P / dD, qg / dCg, dhs, T / dA, dq / dk before the norm): "io_all" plans'
    own_dtype: str = "float32"
    group: int = 1          # value heads per query/key head (HV // H)
    gates: GateOptions = GateOptions()
    prepare: str = "cutile"  # forward chunk_prepare: "cutile", or "cute" (engines/cute/_delta_prepare, sm_90)
    output: str = "cutile"   # forward chunk_output: "cutile", or "cute" (engines/cute/_delta_output, sm_90)
    state_pass: str = "cutile"  # forward chunk_state_pass: "cutile", or "cute" (engines/cute/_delta_state)
    state_form: str = "staged"  # the CuTe state pass's form: a key of engines/cute/_delta_state.FORMS
    scores: str = "kernel"  # the fused form's scores: their own launch ("kernel") or gdn's prepare ("prepare")
    intra: str = "cutile"   # backward chunk_bwd_intra: "cutile", or "cute" (engines/cute/_delta_bwd_intra, sm_90)
    grads: str = "cutile"   # backward chunk_bwd_grads: "cutile", or "cute" (engines/cute/_delta_bwd_grads*)
    bwd_state: str = "cutile"  # backward chunk_bwd_state_pass: "cutile", or "cute" (_delta_state_reverse)
    # backward chunk_bwd_values: "cutile", or "cute" (engines/cute/_delta_bwd_values; T from the CuTe prepare)
    values: str = "cutile"
    grads_warps: int = 4    # warps a CTA of the CuTe chunk_bwd_grads (BLOCK_WARPS)
    values_warps: int = 4   # warps a CTA of the CuTe chunk_bwd_values (BLOCK_WARPS)
    # a backward's chunk_bwd_intra work done by the recompute's CuTe prepare (DeltaPrepareInverseIntra)
    intra_in_prepare: bool = False
    # the state_checkpoints port (one row a chunk) holds the chunk-start states: a forward writes them there
    # instead of its scratch; a backward reads them there and runs no state pass (chunk_bwd_values forms the
    # deltas)
    checkpoints: bool = False
    # gdn's / kda's chunk_cache port (ops chunk_cache_layout): a forward writes its gate sums, w, kd and T there (its
    # prepare the one that stores T too); a backward from the checkpoints reads them there and runs no prepare
    chunk_cache: bool = False
    # a backward's: value columns a CTA of its recompute's cuTile state pass (0: block_v, the reverse pass's width)
    state_pass_block_v: int = 0
    # a forward's one sequence run as this many segments whose state passes overlap the others' kernels
    # (engines/cutile/_segments; 0: not cut)
    segments: int = 0
    # a backward's: value columns a CTA of its reverse state pass (0: block_v, chunk_bwd_values' and _grads' width)
    reverse_block_v: int = 0
    # a backward's recompute state pass on the side stream, beside chunk_bwd_intra and the reverse state pass
    # (neither reads the forward's states; engines/cutile/_schedule.side_lane)
    overlap: bool = False

    @property
    def pass_block_v(self) -> int:
        """Value columns a CTA of the forward state pass (a backward's recompute may run it narrower than its
        reverse pass)."""
        return self.state_pass_block_v or self.block_v

    @property
    def reverse_width(self) -> int:
        """Value columns a CTA of the backward's reverse state pass (it may run narrower than the gradient
        kernels after it)."""
        return self.reverse_block_v or self.block_v

    @property
    def per_channel(self) -> bool:
        return OP_FEATURES[self.op][0]

    @property
    def kernel_g_dtype(self) -> str:
        """The type of g as the chunked kernels read it: gate_activation's f32 output where a gate option is on,
        else the port's (beta's counterpart is ``beta_dtype`` itself)."""
        return "float32" if self.gates.on_gate else self.gates.g_dtype

    @property
    def beta_per_channel(self) -> bool:
        return OP_FEATURES[self.op][1]

    @property
    def has_w(self) -> bool:
        return OP_FEATURES[self.op][2]

    @property
    def seq_tile(self) -> int:
        """The tile width that holds every sequence's chunk count (a power of two >= N + 1)."""
        return next_pow2(self.n_seq + 1)

    @property
    def gate_block(self) -> int:
        """Key channels per CTA of chunk_gates: all of K (blocks of 64 measured 0.14 ms against 0.10 for kda
        on the H200, though they take half the registers)."""
        return self.K

    def gates_constants(self) -> tuple:
        return (self.n_seq, self.seq_tile, self.gate_block)

    def prepare_constants(self) -> tuple:
        return (self.n_seq, self.seq_tile, self.K, self.V, self.per_channel, self.beta_per_channel,
                self.has_w, self.use_l2, self.low_mma, self.group)

    def state_pass_constants(self) -> tuple:
        return (self.n_seq, self.seq_tile, self.K, self.pass_block_v, self.per_channel, self.has_h0, self.store_ht,
                self.low_mma, self.fp16_products)

    def bwd_intra_constants(self) -> tuple:
        return (float(self.scale), self.n_seq, self.seq_tile, self.K, self.V, self.per_channel, self.use_l2,
                self.group)

    def bwd_state_pass_constants(self) -> tuple:
        return (self.n_seq, self.seq_tile, self.K, self.reverse_width, self.per_channel, self.has_dht, self.has_h0,
                self.low_mma)

    def bwd_values_constants(self) -> tuple:
        return (self.n_seq, self.seq_tile, self.K, self.V, self.block_v, self.per_channel, self.beta_per_channel,
                self.has_w, self.use_l2, self.group)

    def bwd_grads_constants(self) -> tuple:
        return (float(self.scale), self.n_seq, self.seq_tile, self.K, self.V, self.block_v, self.per_channel,
                self.beta_per_channel, self.use_l2, self.group)

    @property
    def out_block_v(self) -> int:
        return self.output_block_v or self.block_v

    def output_constants(self) -> tuple:
        return (float(self.scale), self.n_seq, self.seq_tile, self.K, self.out_block_v, self.per_channel,
                self.use_l2, self.low_mma, self.group)

    def group_sum_constants(self) -> tuple:
        return (self.K, self.group)

    def gate_activation_constants(self) -> tuple:
        o = self.gates
        return (self.K, GATE_FORMS[o.form], float(o.lower_bound), o.a_log_dtype is not None,
                o.dt_bias_dtype is not None, self.per_channel, float(o.beta_factor), self.beta_per_channel)


def array(dtype, ndim: int):
    """The launch's constraint on an array argument: row-major with unit last stride, 32-bit indices, no
    aliasing, and the 16-byte aligned base and outer strides that a JIT launch on CuPy, JAX or torch arrays
    (and on our workspace regions) specialises for, so an export compiles what the GPU compiles. ``dtype``: a
    name ("bfloat16", "float16", "float32") or a cuTile type."""
    import cuda.tile as ct
    from cuda.tile.compilation import ArrayConstraint
    if isinstance(dtype, str):
        dtype = {"bfloat16": ct.bfloat16, "float16": ct.float16, "float32": ct.float32}[dtype]
    # 16 is cudnn_graph._layout.ALIGNMENT_BYTES, spelled out: the export tests load this module by path,
    # without the package.
    per_16_bytes = 128 // dtype.bitwidth
    return ArrayConstraint(dtype, ndim, index_dtype=ct.int32, stride_lower_bound_incl=0, alias_groups=(),
                           may_alias_internally=False, stride_constant=(None,) * (ndim - 1) + (1,),
                           stride_divisible_by=(per_16_bytes,) * (ndim - 1) + (1,), base_addr_divisible_by=16)


def _gate_parameter_arrays(v: Variant) -> list:
    """a_log and dt_bias as the gate kernels take them (an f32 stand-in where one is absent)."""
    o = v.gates
    return [array(o.a_log_dtype or "float32", 1), array(o.dt_bias_dtype or "float32", 2 if v.per_channel else 1)]


def gate_activation_signature(v: Variant):
    """(gate_activation, KernelSignature): raw g, a_log, dt_bias, raw beta -> the f32 log decay and beta."""
    from cuda.tile.compilation import CallingConvention, KernelSignature

    from . import _kernels

    gate_ndim = 3 if v.per_channel else 2
    beta_ndim = 3 if v.beta_per_channel else 2
    params = [array(v.gates.g_dtype, gate_ndim), *_gate_parameter_arrays(v), array(v.gates.beta_dtype, beta_ndim),
              array("float32", gate_ndim), array("float32", beta_ndim), *v.gate_activation_constants()]
    return (_kernels.gate_activation, KernelSignature(params, CallingConvention.cutile_python_v1())
            .with_mangled_symbol("gate_activation"))


def segment_bounds_signature(segment_tokens: int):
    """(segment_bounds, KernelSignature): a one-sequence cu_seqlens -> its segments' rows of bounds (S, 4) int32
    (a segmented forward's first launch; its kernels are the plain ones')."""
    import cuda.tile as ct
    from cuda.tile.compilation import CallingConvention, KernelSignature

    from . import _kernels
    params = [array(ct.int32, 1), array(ct.int32, 2), int(segment_tokens)]
    return (_kernels.segment_bounds, KernelSignature(params, CallingConvention.cutile_python_v1())
            .with_mangled_symbol("segment_bounds"))


def signatures(variant: Variant) -> list:
    """[(kernel, KernelSignature)] for the forward kernels of ``variant`` in launch order: gate_activation
    (with a gate option only), chunk_gates (per-channel gates only), chunk_prepare, chunk_state_pass and
    chunk_output."""
    import cuda.tile as ct
    from cuda.tile.compilation import CallingConvention, KernelSignature

    from . import _kernels

    v = variant
    f32 = "float32"
    gate_ndim = 3 if v.per_channel else 2
    beta_ndim = 3 if v.beta_per_channel else 2
    cconv = CallingConvention.cutile_python_v1()
    sc = v.scratch_dtype
    prepare = [array(v.io_dtype, 3), array(v.io_dtype, 3), array(f32, gate_ndim), array(v.beta_dtype, beta_ndim),
               array(v.w_dtype, 3), array(ct.int32, 1), array(sc, 4), array(sc, 4), array(f32, gate_ndim),
               array(sc, 4), *v.prepare_constants()]
    gates_kernel, prepare_kernel, state_pass_kernel, output_kernel = _kernels.forward_kernels(v.per_channel)
    prepared = [(prepare_kernel, KernelSignature(prepare, cconv).with_mangled_symbol("chunk_prepare"))]
    if v.per_channel:
        gates = [array(f32, 3), array(ct.int32, 1), array(f32, 3), *v.gates_constants()]
        prepared.insert(0, (gates_kernel, KernelSignature(gates, cconv).with_mangled_symbol("chunk_gates")))
    state_pass = [array(sc, 4), array(sc, 4), array(sc, 4), array(f32, gate_ndim), array(ct.int32, 1),
                  array(f32, 4), array(sc, 4), array(f32, 4), array(sc, 4), *v.state_pass_constants()]
    output = [array(v.io_dtype, 3), array(v.io_dtype, 3), array(sc, 4), array(f32, gate_ndim),
              array(ct.int32, 1), array(sc, 4), array(v.io_dtype, 3), *v.output_constants()]
    if v.gates.on_gate or v.gates.on_beta:
        prepared.insert(0, gate_activation_signature(v))
    return [*prepared,
            (state_pass_kernel, KernelSignature(state_pass, cconv).with_mangled_symbol("chunk_state_pass")),
            (output_kernel, KernelSignature(output, cconv).with_mangled_symbol("chunk_output"))]


def backward_signatures(variant: Variant) -> list:
    """[(kernel, KernelSignature)] for the backward of ``variant`` (op gdn, kda or gdn2, store_ht=False):
    the forward recompute (gate options, gates, prepare, state pass), then chunk_bwd_intra, the reverse
    state pass, chunk_bwd_values and chunk_bwd_grads; then group_sum with grouped value heads (chunk_bwd_grads
    writes each value head's dq / dk share to f32 scratch) and gate_activation_bwd with a gate option."""
    import cuda.tile as ct
    from cuda.tile.compilation import CallingConvention, KernelSignature

    from . import _kernels

    v = variant
    f32, io = "float32", v.io_dtype
    gate_ndim = 3 if v.per_channel else 2
    beta_ndim = 3 if v.beta_per_channel else 2
    cconv = CallingConvention.cutile_python_v1()
    intra = [array(io, 3), array(io, 3), array(io, 3), array(f32, gate_ndim), array(ct.int32, 1), array(f32, 4),
             array(f32, 4), *v.bwd_intra_constants()]
    state_pass = [array(io, 3), array(f32, 4), array(f32, 4), array(f32, 4), array(f32, gate_ndim),
                  array(ct.int32, 1), array(f32, 4), array(f32, 4), array(f32, 4), array(f32, 4),
                  *v.bwd_state_pass_constants()]
    # the write gate and its gradient: w and dw for gdn2; without a write gate the engine passes v and dv in
    # their place (never touched), and a variant without one has w_dtype == io_dtype
    values = [array(io, 3), array(io, 3), array(f32, gate_ndim), array(v.beta_dtype, beta_ndim),
              array(v.w_dtype, 3), array(ct.int32, 1), array(f32, 4), array(f32, 4), array(f32, 4), array(f32, 4),
              array(f32, gate_ndim), array(io, 3), array(v.w_dtype, 3), array(f32, 4), array(f32, 4), array(f32, 4),
              *v.bwd_values_constants()]
    dqk = f32 if v.group > 1 else io
    grads = [array(io, 3), array(io, 3), array(f32, gate_ndim), array(v.beta_dtype, beta_ndim), array(io, 3),
             array(ct.int32, 1), array(f32, 4), array(f32, 4), array(f32, 4), array(f32, 4), array(f32, 4),
             array(f32, 4), array(f32, 4), array(f32, 4), array(dqk, 3), array(dqk, 3), array(f32, gate_ndim),
             array(v.beta_dtype, beta_ndim), *v.bwd_grads_constants()]
    after = []
    if v.group > 1:
        params = [array(f32, 3), array(io, 3), *v.group_sum_constants()]
        after.append((_kernels.group_sum, KernelSignature(params, cconv).with_mangled_symbol("group_sum")))
    o = v.gates
    if o.on_gate or o.on_beta:
        params = [array(o.g_dtype, gate_ndim), *_gate_parameter_arrays(v), array(o.beta_dtype, beta_ndim),
                  array(f32, gate_ndim), array(f32, beta_ndim), array(f32, gate_ndim), array(o.beta_dtype, beta_ndim),
                  *_gate_parameter_arrays(v), *v.gate_activation_constants()]
        after.append((_kernels.gate_activation_bwd,
                      KernelSignature(params, cconv).with_mangled_symbol("gate_activation_bwd")))
    forward = signatures(v)
    return forward[:len(forward) - 1] + [
        (_kernels.chunk_bwd_intra, KernelSignature(intra, cconv).with_mangled_symbol("chunk_bwd_intra")),
        (_kernels.chunk_bwd_state_pass,
         KernelSignature(state_pass, cconv).with_mangled_symbol("chunk_bwd_state_pass")),
        (_kernels.chunk_bwd_values, KernelSignature(values, cconv).with_mangled_symbol("chunk_bwd_values")),
        (_kernels.chunk_bwd_grads, KernelSignature(grads, cconv).with_mangled_symbol("chunk_bwd_grads")),
    ] + after
