"""The enums ``cudnn.pygraph`` exposes, spelled as it spells them, valued as the cuDNN backend is.

``cudnn.heur_mode.A`` becomes ``cudnn_graph.enums.heur_mode.A``: same class name, same member
names, so code written for pygraph ports by changing the import. The values differ on purpose:
pygraph numbers its members in cudnn-frontend's own order, here each member's value is the C value
of the backend constant it stands for (``heur_mode.A == CUDNN_HEUR_MODE_A == 3``), so lowering
passes ``int(member)`` straight to cudnnBackendSetAttribute. Compare members by name, not by
number, when the other side may be a pygraph enum (the op tables do).

Members with no backend counterpart get negative values (``NOT_SET`` is -1, pygraph's
frontend-only ``heur_mode.OPENSOURCE`` is -2), so they never alias a backend constant;
``backend_value()`` rejects them. ``build_plan_policy``, ``diagonal_alignment`` and
``attention_implementation`` describe cudnn-frontend behaviour, not a backend enum: they keep
pygraph's order and have no backend map.

This module is the one home of every enum the package defines: pygraph has no binding for the
sampling modes (``resample_mode``, ``padding_mode``, ``rng_distribution``) or the norm lowering's
(``norm_mode``, ``gen_stats_mode``), so those follow the same naming rule (the backend constant's
name without its prefix). ``DataType`` (cudnnDataType_t) lives here too; ``cudnn_graph.data_type``
re-exports it with its conversions. The CamelCase names the op tables used (``ReductionMode``,
``NormFwdPhase``, ...) are aliases of these classes, so a member passes between ops, engines and
user code without any conversion.

Every backend value here is checked against include/cudnn_graph/cudnn_backend.h by
tests/test_cudnn_loader.py.
"""
from __future__ import annotations

from enum import IntEnum

__all__ = [
    "heur_mode", "reduction_mode", "norm_forward_phase", "build_plan_policy", "numerical_note",
    "behavior_note", "knob_type", "pointwise_mode", "convolution_mode", "diagonal_alignment",
    "attention_implementation", "reshape_mode", "tensor_reordering", "moe_grouped_matmul_mode",
    "resample_mode", "padding_mode", "rng_distribution", "norm_mode", "gen_stats_mode", "DataType",
    "BACKEND_ENUMS", "backend_value", "backend_name", "to_backend_map",
    "HEUR_MODE_TO_BACKEND", "REDUCTION_MODE_TO_BACKEND", "NORM_FORWARD_PHASE_TO_BACKEND",
    "NUMERICAL_NOTE_TO_BACKEND", "BEHAVIOR_NOTE_TO_BACKEND", "KNOB_TYPE_TO_BACKEND",
    "POINTWISE_MODE_TO_BACKEND", "CONVOLUTION_MODE_TO_BACKEND", "RESHAPE_MODE_TO_BACKEND",
    "TENSOR_REORDERING_TO_BACKEND", "MOE_GROUPED_MATMUL_MODE_TO_BACKEND",
]

NOT_SET = -1   # value of every NOT_SET member: "no backend constant"


class DataType(IntEnum):
    """cuDNN tensor data types (values are ``cudnnDataType_t``); conversions in ``cudnn_graph.data_type``."""

    NOT_SET = NOT_SET
    FLOAT = 0
    DOUBLE = 1
    HALF = 2
    INT8 = 3
    INT32 = 4
    INT8x4 = 5
    UINT8 = 6
    UINT8x4 = 7
    INT8x32 = 8
    BFLOAT16 = 9
    INT64 = 10
    BOOLEAN = 11
    FP8_E4M3 = 12
    FP8_E5M2 = 13
    FAST_FLOAT_FOR_FP8 = 14
    FP8_E8M0 = 15
    FP4_E2M1 = 16
    INT4 = 17
    UINT4 = 18
    UINT32 = 19
    COMPLEX_FP32 = 20
    COMPLEX_FP64 = 21

    @property
    def bits(self) -> int:
        # data_type imports this module, so the size table is looked up when asked, not at import.
        from .data_type import itemsize_bits
        return itemsize_bits(self)


class heur_mode(IntEnum):
    """Engine heuristics query mode (cudnnBackendHeurMode_t)."""
    A = 3            # CUDNN_HEUR_MODE_A; the backend also keeps the older CUDNN_HEUR_MODE_INSTANT (0)
    B = 1
    FALLBACK = 2
    OPENSOURCE = -2  # cudnn-frontend's own engine list; the backend has no such mode


class reduction_mode(IntEnum):
    """Reduction operator (cudnnReduceTensorOp_t)."""
    NOT_SET = NOT_SET
    ADD = 0
    MUL = 1
    MIN = 2
    MAX = 3
    AMAX = 4
    AVG = 5
    NORM1 = 6
    NORM2 = 7
    MUL_NO_ZEROS = 8


class norm_forward_phase(IntEnum):
    """Forward normalization phase (cudnnBackendNormFwdPhase_t)."""
    NOT_SET = NOT_SET
    INFERENCE = 0
    TRAINING = 1


class build_plan_policy(IntEnum):
    """Which heuristics entries build_plans() builds (a frontend policy; no backend enum)."""
    HEURISTICS_CHOICE = 0   # the first entry that builds
    ALL = 1                 # every entry that builds


class numerical_note(IntEnum):
    """Numerical properties an engine reports (cudnnBackendNumericalNote_t)."""
    TENSOR_CORE = 0
    DOWN_CONVERT_INPUTS = 1
    REDUCED_PRECISION_REDUCTION = 2
    FFT = 3
    NONDETERMINISTIC = 4
    WINOGRAD = 5
    WINOGRAD_TILE_4x4 = 6
    WINOGRAD_TILE_6x6 = 7
    WINOGRAD_TILE_13x13 = 8
    STRICT_NAN_PROP = 9     # cuDNN >= 9.1


class behavior_note(IntEnum):
    """Runtime behaviour an engine reports (cudnnBackendBehaviorNote_t)."""
    RUNTIME_COMPILATION = 0
    REQUIRES_FILTER_INT8x32_REORDER = 1
    REQUIRES_BIAS_INT8x32_REORDER = 2
    SUPPORTS_CUDA_GRAPH_NATIVE_API = 3   # cuDNN >= 9.5
    CUBLASLT_DEPENDENCY = 4              # cuDNN >= 9.15


class knob_type(IntEnum):
    """Engine tuning knobs (cudnnBackendKnobType_t); the backend's deprecated knobs are left out."""
    NOT_SET = NOT_SET
    SWIZZLE = 1
    TILE_SIZE = 2
    EDGE = 4
    MULTIPLY = 11
    SPLIT_K_BUF = 12
    TILEK = 13
    STAGES = 14
    REDUCTION_MODE = 15
    SPLIT_K_SLC = 17
    IDX_MODE = 18            # cuDNN >= 9.7
    SPECFILT = 23
    KERNEL_CFG = 24
    WORKSPACE = 25
    TILE_CGA_M = 27
    TILE_CGA_N = 28
    BLOCK_SIZE = 29
    OCCUPANCY = 30
    ARRAY_SIZE_PER_THREAD = 31
    SPLIT_COLS = 33
    TILE_ROWS = 34
    TILE_COLS = 35
    LOAD_SIZE = 36
    CTA_COUNT = 37           # cuDNN >= 9.7
    STREAM_K = 38            # cuDNN >= 9.7
    SPLIT_P_SLC = 39         # cuDNN >= 9.7
    TILE_M = 40              # cuDNN >= 9.7
    TILE_N = 41              # cuDNN >= 9.7
    WARP_SPEC_CFG = 42       # cuDNN >= 9.7
    # Newer than pygraph 1.23's list; same naming rule.
    SWAP_AB = 43             # cuDNN >= 9.18
    INPUT_TMA_ENABLE = 44    # cuDNN >= 9.22
    OUTPUT_TMA_ENABLE = 45   # cuDNN >= 9.22


class pointwise_mode(IntEnum):
    """Pointwise operation (cudnnPointwiseMode_t). pygraph has no such enum (one method per mode);
    the names are the backend's without the CUDNN_POINTWISE_ prefix."""
    ADD = 0
    MUL = 1
    MIN = 2
    MAX = 3
    SQRT = 4
    ADD_SQUARE = 5
    DIV = 6
    MOD = 7
    POW = 8
    SUB = 9
    ABS = 10
    CEIL = 11
    COS = 12
    EXP = 13
    FLOOR = 14
    LOG = 15
    NEG = 16
    RSQRT = 17
    SIN = 18
    TAN = 19
    ERF = 20
    IDENTITY = 21
    RECIPROCAL = 22
    ATAN2 = 23                  # cuDNN >= 9.1
    FLOOR_MOD = 24              # cuDNN >= 9.27
    RELU_FWD = 100
    TANH_FWD = 101
    SIGMOID_FWD = 102
    ELU_FWD = 103
    GELU_FWD = 104
    SOFTPLUS_FWD = 105
    SWISH_FWD = 106
    GELU_APPROX_TANH_FWD = 107
    RELU_BWD = 200
    TANH_BWD = 201
    SIGMOID_BWD = 202
    ELU_BWD = 203
    GELU_BWD = 204
    SOFTPLUS_BWD = 205
    SWISH_BWD = 206
    GELU_APPROX_TANH_BWD = 207
    CMP_EQ = 300
    CMP_NEQ = 301
    CMP_GT = 302
    CMP_GE = 303
    CMP_LT = 304
    CMP_LE = 305
    LOGICAL_AND = 400
    LOGICAL_OR = 401
    LOGICAL_NOT = 402
    GEN_INDEX = 501
    BINARY_SELECT = 601


class convolution_mode(IntEnum):
    """Filter orientation (cudnnConvolutionMode_t)."""
    CONVOLUTION = 0
    CROSS_CORRELATION = 1


class diagonal_alignment(IntEnum):
    """Where an attention mask's diagonal starts (a frontend notion; no backend enum)."""
    TOP_LEFT = 0
    BOTTOM_RIGHT = 1


class attention_implementation(IntEnum):
    """Which SDPA implementation to build (a frontend choice; no backend enum)."""
    AUTO = 0
    COMPOSITE = 1   # matmul + softmax + matmul operation graph
    UNIFIED = 2     # one SDPA operation (CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, cuDNN >= 9.13)


class reshape_mode(IntEnum):
    """Reshape semantics (cudnnBackendReshapeMode_t, cuDNN >= 9.22)."""
    VIEW_ONLY = 0
    LOGICAL = 1


class tensor_reordering(IntEnum):
    """Tensor memory reordering (cudnnBackendTensorReordering_t)."""
    NONE = 0
    INT8x32 = 1
    F16x16 = 2
    F8_128x4 = 3    # cuDNN >= 9.7


class moe_grouped_matmul_mode(IntEnum):
    """Gather/scatter mode of the MoE grouped matmul (cudnnMoeGroupedMatmulMode_t, cuDNN >= 9.15)."""
    NONE = 0
    GATHER = 1
    SCATTER = 2


class resample_mode(IntEnum):
    """Resampling / pooling mode (cudnnResampleMode_t)."""
    NEAREST = 0
    BILINEAR = 1
    AVGPOOL_INCLUDE_PADDING = 2
    AVGPOOL = 2                 # cuDNN's alias of AVGPOOL_INCLUDE_PADDING
    MAXPOOL = 3
    AVGPOOL_EXCLUDE_PADDING = 4


class padding_mode(IntEnum):
    """What a resample reads outside its input (cudnnPaddingMode_t)."""
    ZERO_PAD = 0
    NEG_INF_PAD = 1
    EDGE_VAL_PAD = 2


class rng_distribution(IntEnum):
    """Random-number distribution (cudnnRngDistribution_t)."""
    BERNOULLI = 0
    UNIFORM = 1
    NORMAL = 2


class norm_mode(IntEnum):
    """Normalization kind of a norm operation (cudnnBackendNormMode_t)."""
    LAYER_NORM = 0
    INSTANCE_NORM = 1
    BATCH_NORM = 2
    GROUP_NORM = 3
    RMS_NORM = 4
    ADA_LAYER_NORM = 5          # cuDNN >= 9.7


class gen_stats_mode(IntEnum):
    """Statistics a genstats operation produces (cudnnGenStatsMode_t)."""
    SUM_SQSUM = 0


# enum class -> (backend C type, prefix that turns a member name into the backend constant's name)
BACKEND_ENUMS: dict[type[IntEnum], tuple[str, str]] = {
    heur_mode: ("cudnnBackendHeurMode_t", "CUDNN_HEUR_MODE_"),
    reduction_mode: ("cudnnReduceTensorOp_t", "CUDNN_REDUCE_TENSOR_"),
    norm_forward_phase: ("cudnnBackendNormFwdPhase_t", "CUDNN_NORM_FWD_"),
    numerical_note: ("cudnnBackendNumericalNote_t", "CUDNN_NUMERICAL_NOTE_"),
    behavior_note: ("cudnnBackendBehaviorNote_t", "CUDNN_BEHAVIOR_NOTE_"),
    knob_type: ("cudnnBackendKnobType_t", "CUDNN_KNOB_TYPE_"),
    pointwise_mode: ("cudnnPointwiseMode_t", "CUDNN_POINTWISE_"),
    convolution_mode: ("cudnnConvolutionMode_t", "CUDNN_"),
    reshape_mode: ("cudnnBackendReshapeMode_t", "CUDNN_RESHAPE_"),
    tensor_reordering: ("cudnnBackendTensorReordering_t", "CUDNN_TENSOR_REORDERING_"),
    moe_grouped_matmul_mode: ("cudnnMoeGroupedMatmulMode_t", "CUDNN_MOE_GROUPED_MATMUL_MODE_"),
    resample_mode: ("cudnnResampleMode_t", "CUDNN_RESAMPLE_"),
    padding_mode: ("cudnnPaddingMode_t", "CUDNN_"),
    rng_distribution: ("cudnnRngDistribution_t", "CUDNN_RNG_DISTRIBUTION_"),
    norm_mode: ("cudnnBackendNormMode_t", "CUDNN_"),
    gen_stats_mode: ("cudnnGenStatsMode_t", "CUDNN_GENSTATS_"),
}


def _has_backend_value(member: IntEnum) -> bool:
    return type(member) in BACKEND_ENUMS and member.value >= 0


def backend_value(member: IntEnum) -> int:
    """The backend C value for ``member``; ValueError for a member with none (NOT_SET, OPENSOURCE,
    or an enum the backend does not have)."""
    if not _has_backend_value(member):
        raise ValueError(f"{type(member).__name__}.{member.name} has no cuDNN backend value")
    return int(member)


def backend_name(member: IntEnum) -> str:
    """The backend constant's name, e.g. ``heur_mode.A`` -> ``"CUDNN_HEUR_MODE_A"``."""
    backend_value(member)
    return BACKEND_ENUMS[type(member)][1] + member.name


def to_backend_map(enum_cls: type[IntEnum]) -> dict[IntEnum, int]:
    """``{member: backend C value}`` for every member of ``enum_cls`` that has one."""
    if enum_cls not in BACKEND_ENUMS:
        raise ValueError(f"{enum_cls.__name__} is not a cuDNN backend enum")
    return {member: int(member) for member in enum_cls if member.value >= 0}


# The maps, spelled out for the common lookups.
HEUR_MODE_TO_BACKEND = to_backend_map(heur_mode)
REDUCTION_MODE_TO_BACKEND = to_backend_map(reduction_mode)
NORM_FORWARD_PHASE_TO_BACKEND = to_backend_map(norm_forward_phase)
NUMERICAL_NOTE_TO_BACKEND = to_backend_map(numerical_note)
BEHAVIOR_NOTE_TO_BACKEND = to_backend_map(behavior_note)
KNOB_TYPE_TO_BACKEND = to_backend_map(knob_type)
POINTWISE_MODE_TO_BACKEND = to_backend_map(pointwise_mode)
CONVOLUTION_MODE_TO_BACKEND = to_backend_map(convolution_mode)
RESHAPE_MODE_TO_BACKEND = to_backend_map(reshape_mode)
TENSOR_REORDERING_TO_BACKEND = to_backend_map(tensor_reordering)
MOE_GROUPED_MATMUL_MODE_TO_BACKEND = to_backend_map(moe_grouped_matmul_mode)
