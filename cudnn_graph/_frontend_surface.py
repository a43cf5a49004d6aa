"""nvidia-cudnn-frontend 1.32's graph-level Python surface, name by name, and what each is here.

One table (data, not code) lists every top-level name of ``cudnn``, every ``cudnn.pygraph`` method
with its keywords, and the status of each here:

- ``same``: exists and works as the frontend's does;
- ``differs``: exists; how it differs is the ``why`` (docs/porting.md, "What differs");
- ``not implemented``: a stub that raises NotImplementedError saying ``why`` (docs/porting.md,
  "Not implemented"); keywords of that status are refused the same way.

The kernel-API packages (``cudnn.gemm_*``, ``cudnn.sdpa.*``, moe, frost, experimental, fla, ...) are
out of scope and not listed. ``tests/ports/test_frontend_surface.py`` checks every row; the stubs
and keyword refusals are installed from these rows (``install_module_stubs``,
``install_graph_stubs``, ``refuse_unimplemented_keywords``).

Example:
    >>> from cudnn_graph._frontend_surface import TOP_LEVEL
    >>> TOP_LEVEL["jit"][0]
    'same'
"""
from __future__ import annotations

from typing import Any

__all__ = ["FRONTEND_VERSION", "SAME", "DIFFERS", "NOT_IMPLEMENTED", "TOP_LEVEL", "PYGRAPH_METHODS",
           "PYGRAPH_STATUS", "KEYWORD_STATUS", "install_module_stubs", "install_graph_stubs",
           "refuse_unimplemented_keywords", "declined_keywords", "not_implemented_names"]

FRONTEND_VERSION = "1.32.0"

SAME = "same"
DIFFERS = "differs"
NOT_IMPLEMENTED = "not implemented"

_NAMED_KNOBS = "Python engines here take named knobs (PlanConfig.knobs), not frontend knob_type values"
_OWN_REPLAY = "CUDA graphs are replayed by cudnn_graph itself (docs/performance.md); there is no retention policy"
_FIXED_WORKSPACE = "a plan's workspace is fixed when it is built"
_BUILD_CONTEXT = "engines build with the graph's handle and device; a build context object is not taken"
_KERNEL_API = "a kernel API of the frontend (a fixed-function kernel), not a graph op; cudnn_graph has none"
_NO_OP = "cudnn_graph has no op schema (and no engine) for {}"

# name -> (status, why)
TOP_LEVEL: dict[str, tuple[str, str]] = {
    "backend_version": (DIFFERS, "0 where no libcudnn loads (every version gate then reads 'too old', so a "
                                 "port takes its CPU path); cuDNN's version otherwise"),
    "backend_version_string": (DIFFERS, "'0.0.0' where no libcudnn loads; 'major.minor.patch' otherwise"),
    "get_last_error_string": (SAME, ""),
    "norm_forward_phase": (SAME, ""),
    "reduction_mode": (SAME, ""),
    "behavior_note": (SAME, ""),
    "cuda_graph_retention": (NOT_IMPLEMENTED, _OWN_REPLAY),
    "knob_type": (SAME, ""),
    "FRONTEND_KNOB_TYPE_BASE": (NOT_IMPLEMENTED, _NAMED_KNOBS),
    "is_frontend_knob_type": (NOT_IMPLEMENTED, _NAMED_KNOBS),
    "create_kernel_cache": (SAME, ""),
    "create_device_properties": (DIFFERS, "serialize() wraps cuDNN's JSON with the cuDNN version that wrote it "
                                          "(text from another cuDNN is refused) and takes as_bytes=; cuDNN's bare "
                                          "JSON (the frontend's) is read too; cuDNN >= 9.8"),
    "numerical_note": (SAME, ""),
    "build_plan_policy": (SAME, ""),
    "data_type": (SAME, ""),
    "tensor_reordering": (SAME, ""),
    "heur_mode": (SAME, ""),
    "tensor": (DIFFERS, "an alias of cudnn_graph.Tensor (the frontend's is its compiled backend tensor)"),
    "knob": (DIFFERS, "the Knob record get_knobs_for_engine returns (type, minimum, maximum, stride)"),
    "cudnnGraphNotSupportedError": (SAME, ""),
    "diagonal_alignment": (SAME, ""),
    "attention_implementation": (SAME, ""),
    "moe_grouped_matmul_mode": (NOT_IMPLEMENTED, _NO_OP.format("moe_grouped_matmul")),
    "scalar_type": (NOT_IMPLEMENTED, "tensor_scalar(value, data_type) takes a data_type here"),
    "reshape_mode": (SAME, ""),
    "causal_conv1d_forward": (NOT_IMPLEMENTED, _KERNEL_API),
    "causal_conv1d_backward": (NOT_IMPLEMENTED, _KERNEL_API),
    "causal_conv1d_nwh_forward": (NOT_IMPLEMENTED, _KERNEL_API),
    "causal_conv1d_nwh_backward": (NOT_IMPLEMENTED, _KERNEL_API),
    "b2b_causal_conv1d_forward": (NOT_IMPLEMENTED, _KERNEL_API),
    "b2b_causal_conv1d_backward": (NOT_IMPLEMENTED, _KERNEL_API),
    "gnn_agg_op": (NOT_IMPLEMENTED, _KERNEL_API),
    "gnn_agg_simple_forward": (NOT_IMPLEMENTED, _KERNEL_API),
    "gnn_agg_simple_backward": (NOT_IMPLEMENTED, _KERNEL_API),
    "gnn_activation_op": (NOT_IMPLEMENTED, _KERNEL_API),
    "gnn_mha_gat_forward": (NOT_IMPLEMENTED, _KERNEL_API),
    "gnn_mha_gat_backward": (NOT_IMPLEMENTED, _KERNEL_API),
    "gnn_mha_gat_v2_forward": (NOT_IMPLEMENTED, _KERNEL_API),
    "gnn_mha_gat_v2_backward": (NOT_IMPLEMENTED, _KERNEL_API),
    "create_handle": (DIFFERS, "where no libcudnn loads it returns a HostHandle, which host graphs accept; "
                               "create_handle(device=N) takes the CUDA device"),
    "destroy_handle": (SAME, ""),
    "get_stream": (SAME, ""),
    "set_stream": (DIFFERS, "on a HostHandle the stream is recorded and unused (host graphs run in the call)"),
    "Handle": (DIFFERS, "the type of cuDNN handles from create_handle(); a foreign cudnnHandle_t is passed "
                        "as the int itself, not wrapped"),
    "DeviceInfo": (NOT_IMPLEMENTED, "device facts are not a public object here"),
    "__version__": (DIFFERS, "cudnn_graph's own version, not the frontend's"),
    "NodeType": (NOT_IMPLEMENTED, "a node's kind is its op name here (node.op)"),
    "Tensor": (SAME, ""),
    "pygraph": (SAME, ""),
    "GraphContext": (SAME, ""),
    "Node": (SAME, ""),
    "graph": (SAME, ""),
    "jit": (SAME, ""),
    "graph_cache": (SAME, ""),
    "sdpa_capabilities": (DIFFERS, "always empty: there is no native SDPA binder with capability flags"),
    "Graph": (SAME, ""),
    "wrapper": (SAME, ""),
}

# pygraph method (or property) -> the frontend's keywords for it (its signature, and for op builders
# the ports and attributes its op table takes by keyword).
PYGRAPH_METHODS: dict[str, tuple[str, ...]] = {
    "abs": ('input', 'name', 'compute_data_type'),
    "adalayernorm": ('input', 'scale', 'bias', 'epsilon', 'norm_forward_phase', 'name', 'compute_data_type',
        'out_dims'),
    "adalayernorm_backward": ('grad', 'input', 'scale', 'mean', 'inv_variance', 'name', 'compute_data_type',
        'out_dims'),
    "add": ('a', 'b', 'name', 'compute_data_type'),
    "add_square": ('a', 'b', 'name', 'compute_data_type'),
    "backend_plan_entries": (),
    "batchnorm": ('input', 'scale', 'bias', 'in_running_mean', 'in_running_var', 'epsilon', 'momentum', 'name',
        'compute_data_type', 'out_dims'),
    "batchnorm_backward": ('grad', 'input', 'scale', 'mean', 'inv_variance', 'name', 'compute_data_type',
        'out_dims'),
    "batchnorm_inference": ('input', 'mean', 'inv_variance', 'scale', 'bias', 'name', 'compute_data_type',
        'out_dims'),
    "bias": ('input', 'bias', 'name', 'compute_data_type'),
    "binary_select": ('input0', 'input1', 'mask', 'name', 'compute_data_type'),
    "block_scale_dequantize": ('input', 'descale', 'block_size', 'is_negative_scale', 'name',
        'compute_data_type', 'out_dims'),
    "block_scale_quantize": ('input', 'group_offset', 'block_size', 'axis', 'transpose', 'name',
        'compute_data_type', 'out_dims'),
    "build": ('heuristics', 'ctx'),
    "build_operation_graph": (),
    "build_plan_at_index": ('index',),
    "build_plans": ('ctx',),
    "ceil": ('input', 'name', 'compute_data_type'),
    "check_support": (),
    "cmp_eq": ('input', 'comparison', 'name', 'compute_data_type'),
    "cmp_ge": ('input', 'comparison', 'name', 'compute_data_type'),
    "cmp_gt": ('input', 'comparison', 'name', 'compute_data_type'),
    "cmp_le": ('input', 'comparison', 'name', 'compute_data_type'),
    "cmp_lt": ('input', 'comparison', 'name', 'compute_data_type'),
    "cmp_neq": ('input', 'comparison', 'name', 'compute_data_type'),
    "concatenate": ('axis', 'in_place_index', 'name', 'compute_data_type', 'out_dims'),
    "context": (),
    "conv_dgrad": ('loss', 'filter', 'padding', 'pre_padding', 'post_padding', 'stride', 'dilation',
        'convolution_mode', 'name', 'compute_data_type', 'out_dims'),
    "conv_fprop": ('image', 'weight', 'padding', 'pre_padding', 'post_padding', 'stride', 'dilation',
        'convolution_mode', 'name', 'compute_data_type', 'out_dims'),
    "conv_wgrad": ('image', 'loss', 'padding', 'pre_padding', 'post_padding', 'stride', 'dilation',
        'convolution_mode', 'name', 'compute_data_type', 'out_dims'),
    "cos": ('input', 'name', 'compute_data_type'),
    "create_execution_plan": ('engine_id', 'knobs'),
    "create_execution_plans": ('heuristics',),
    "deselect_behavior_notes": ('notes',),
    "deselect_engines": ('engine_names',),
    "deselect_numeric_notes": ('notes',),
    "deselect_workspace_greater_than": ('workspace_limit',),
    "deserialize": (),
    "div": ('a', 'b', 'name', 'compute_data_type'),
    "elu": ('input', 'name', 'compute_data_type'),
    "elu_backward": ('loss', 'input', 'name', 'compute_data_type'),
    "erf": ('input', 'name', 'compute_data_type'),
    "execute": ('tensor_dict', 'workspace', 'handle', 'override_uids', 'override_shapes', 'override_strides',
        'tensor_uids'),
    "execute_plan_at_index": ('tensor_dict', 'workspace', 'index', 'handle', 'tensor_uids'),
    "exp": ('input', 'name', 'compute_data_type'),
    "find_tensor": ('name_or_uid',),
    "floor": ('input', 'name', 'compute_data_type'),
    "gdn": ('q', 'k', 'v', 'g', 'beta', 'cu_seqlens', 'initial_state', 'a_log', 'dt_bias', 'state_indices',
        'scale', 'output_final_state', 'use_qk_l2norm', 'checkpoint_every_n_tokens', 'use_beta_sigmoid',
        'allow_neg_eigval', 'safe_gate', 'gate_domain', 'batch_invariant', 'overwrite_initial_state', 'name',
        'compute_data_type', 'out_dims'),
    "gdn2": ('q', 'k', 'v', 'g', 'beta', 'w', 'cu_seqlens', 'initial_state', 'a_log', 'dt_bias',
        'state_indices', 'scale', 'output_final_state', 'use_qk_l2norm', 'checkpoint_every_n_tokens',
        'use_beta_sigmoid', 'allow_neg_eigval', 'beta_guard', 'safe_gate', 'gate_domain', 'gate_lower_bound',
        'batch_invariant', 'overwrite_initial_state', 'name', 'compute_data_type', 'out_dims'),
    "gdn2_bwd": ('q', 'k', 'v', 'g', 'beta', 'w', 'cu_seqlens', 'dO', 'state_checkpoints', 'initial_state',
        'd_final_state', 'a_log', 'dt_bias', 'scale', 'use_qk_l2norm', 'checkpoint_every_n_tokens',
        'use_beta_sigmoid', 'allow_neg_eigval', 'beta_guard', 'safe_gate', 'gate_domain', 'gate_lower_bound',
        'batch_invariant', 'overwrite_initial_state', 'name', 'compute_data_type', 'out_dims'),
    "gdn2_summary": ('k', 'v', 'g', 'beta', 'w', 'cu_seqlens', 'initial_state', 'a_log', 'dt_bias',
        'output_transition', 'use_qk_l2norm', 'use_beta_sigmoid', 'allow_neg_eigval', 'beta_guard',
        'safe_gate', 'gate_domain', 'gate_lower_bound', 'batch_invariant', 'name', 'compute_data_type',
        'out_dims'),
    "gdn2_summary_bwd": ('q', 'k', 'g', 'beta', 'cu_seqlens', 'dO', 'd_final_state', 'a_log', 'dt_bias',
        'output_transition', 'scale', 'use_qk_l2norm', 'use_beta_sigmoid', 'allow_neg_eigval', 'beta_guard',
        'safe_gate', 'gate_domain', 'gate_lower_bound', 'batch_invariant', 'name', 'compute_data_type',
        'out_dims'),
    "gdn_bwd": ('q', 'k', 'v', 'g', 'beta', 'cu_seqlens', 'dO', 'state_checkpoints', 'initial_state',
        'd_final_state', 'a_log', 'dt_bias', 'scale', 'use_qk_l2norm', 'checkpoint_every_n_tokens',
        'use_beta_sigmoid', 'allow_neg_eigval', 'safe_gate', 'gate_domain', 'batch_invariant',
        'overwrite_initial_state', 'name', 'compute_data_type', 'out_dims'),
    "gdn_summary": ('k', 'v', 'g', 'beta', 'cu_seqlens', 'initial_state', 'a_log', 'dt_bias',
        'output_transition', 'use_qk_l2norm', 'use_beta_sigmoid', 'allow_neg_eigval', 'safe_gate',
        'gate_domain', 'batch_invariant', 'name', 'compute_data_type', 'out_dims'),
    "gdn_summary_bwd": ('q', 'k', 'g', 'beta', 'cu_seqlens', 'dO', 'd_final_state', 'a_log', 'dt_bias',
        'output_transition', 'scale', 'use_qk_l2norm', 'use_beta_sigmoid', 'allow_neg_eigval', 'safe_gate',
        'gate_domain', 'batch_invariant', 'name', 'compute_data_type', 'out_dims'),
    "gdp": ('q', 'k', 'v', 'g', 'beta', 'cu_seqlens', 'initial_state', 'a_log', 'dt_bias', 'state_indices',
        'num_householder', 'scale', 'output_final_state', 'use_qk_l2norm', 'checkpoint_every_n_tokens',
        'use_beta_sigmoid', 'allow_neg_eigval', 'safe_gate', 'gate_domain', 'batch_invariant',
        'overwrite_initial_state', 'name', 'compute_data_type', 'out_dims'),
    "gdp_bwd": ('q', 'k', 'v', 'g', 'beta', 'cu_seqlens', 'dO', 'state_checkpoints', 'initial_state',
        'd_final_state', 'a_log', 'dt_bias', 'num_householder', 'scale', 'use_qk_l2norm',
        'checkpoint_every_n_tokens', 'use_beta_sigmoid', 'allow_neg_eigval', 'safe_gate', 'gate_domain',
        'batch_invariant', 'overwrite_initial_state', 'name', 'compute_data_type', 'out_dims'),
    "gdp_summary": ('k', 'v', 'g', 'beta', 'cu_seqlens', 'initial_state', 'a_log', 'dt_bias',
        'num_householder', 'output_transition', 'use_qk_l2norm', 'use_beta_sigmoid', 'allow_neg_eigval',
        'safe_gate', 'gate_domain', 'batch_invariant', 'name', 'compute_data_type', 'out_dims'),
    "gdp_summary_bwd": ('q', 'k', 'g', 'beta', 'cu_seqlens', 'dO', 'd_final_state', 'a_log', 'dt_bias',
        'num_householder', 'output_transition', 'scale', 'use_qk_l2norm', 'use_beta_sigmoid',
        'allow_neg_eigval', 'safe_gate', 'gate_domain', 'batch_invariant', 'name', 'compute_data_type',
        'out_dims'),
    "gelu": ('input', 'name', 'compute_data_type'),
    "gelu_approx_tanh": ('input', 'name', 'compute_data_type'),
    "gelu_approx_tanh_backward": ('loss', 'input', 'name', 'compute_data_type'),
    "gelu_backward": ('loss', 'input', 'name', 'compute_data_type'),
    "gen_index": ('input', 'axis', 'name', 'compute_data_type'),
    "genstats": ('input', 'name', 'compute_data_type', 'out_dims'),
    "get_behavior_notes": (),
    "get_behavior_notes_for_plan_at_index": ('index',),
    "get_cuda_graph_retention": (),
    "get_engine_and_knobs_at_index": ('index',),
    "get_execution_plan_count": (),
    "get_inputs": (),
    "get_node": ('name',),
    "get_outputs": (),
    "get_plan_name_at_index": ('index',),
    "get_workspace_size": ('handle', 'override_uids', 'override_shapes', 'override_strides'),
    "get_workspace_size_plan_at_index": ('index', 'handle', 'override_uids', 'override_shapes',
        'override_strides'),
    "identity": ('input', 'name', 'compute_data_type'),
    "inspect": (),
    "instancenorm": ('input', 'scale', 'bias', 'epsilon', 'norm_forward_phase', 'name', 'compute_data_type',
        'out_dims'),
    "instancenorm_backward": ('grad', 'input', 'scale', 'mean', 'inv_variance', 'name', 'compute_data_type',
        'out_dims'),
    "kda": ('q', 'k', 'v', 'g', 'beta', 'cu_seqlens', 'initial_state', 'a_log', 'dt_bias', 'state_indices',
        'scale', 'output_final_state', 'use_qk_l2norm', 'checkpoint_every_n_tokens', 'use_beta_sigmoid',
        'allow_neg_eigval', 'safe_gate', 'gate_domain', 'gate_lower_bound', 'batch_invariant',
        'overwrite_initial_state', 'name', 'compute_data_type', 'out_dims'),
    "kda_bwd": ('q', 'k', 'v', 'g', 'beta', 'cu_seqlens', 'dO', 'state_checkpoints', 'initial_state',
        'd_final_state', 'a_log', 'dt_bias', 'scale', 'use_qk_l2norm', 'checkpoint_every_n_tokens',
        'use_beta_sigmoid', 'allow_neg_eigval', 'safe_gate', 'gate_domain', 'gate_lower_bound',
        'batch_invariant', 'overwrite_initial_state', 'name', 'compute_data_type', 'out_dims'),
    "kda_summary": ('k', 'v', 'g', 'beta', 'cu_seqlens', 'initial_state', 'a_log', 'dt_bias',
        'output_transition', 'use_qk_l2norm', 'use_beta_sigmoid', 'allow_neg_eigval', 'safe_gate',
        'gate_domain', 'gate_lower_bound', 'batch_invariant', 'name', 'compute_data_type', 'out_dims'),
    "kda_summary_bwd": ('q', 'k', 'g', 'beta', 'cu_seqlens', 'dO', 'd_final_state', 'a_log', 'dt_bias',
        'output_transition', 'scale', 'use_qk_l2norm', 'use_beta_sigmoid', 'allow_neg_eigval', 'safe_gate',
        'gate_domain', 'gate_lower_bound', 'batch_invariant', 'name', 'compute_data_type', 'out_dims'),
    "key": (),
    "layernorm": ('input', 'scale', 'bias', 'epsilon', 'norm_forward_phase', 'name', 'compute_data_type',
        'out_dims'),
    "layernorm_backward": ('grad', 'input', 'scale', 'mean', 'inv_variance', 'name', 'compute_data_type',
        'out_dims'),
    "leaky_relu": ('input', 'negative_slope', 'name', 'compute_data_type'),
    "leaky_relu_backward": ('loss', 'input', 'negative_slope', 'name', 'compute_data_type'),
    "log": ('input', 'name', 'compute_data_type'),
    "logical_and": ('a', 'b', 'name', 'compute_data_type'),
    "logical_not": ('input', 'name', 'compute_data_type'),
    "logical_or": ('a', 'b', 'name', 'compute_data_type'),
    "mamba2": ('q', 'k', 'v', 'g', 'a', 'cu_seqlens', 'initial_state', 'dt_bias', 'd', 'z', 'state_indices',
        'output_final_state', 'checkpoint_every_n_tokens', 'dt_softplus', 'dt_min', 'dt_max',
        'output_pre_gate', 'batch_invariant', 'overwrite_initial_state', 'name', 'compute_data_type',
        'out_dims'),
    "mamba2_bwd": ('q', 'k', 'v', 'g', 'a', 'cu_seqlens', 'dO', 'state_checkpoints', 'initial_state',
        'd_final_state', 'dt_bias', 'd', 'z', 'O_pre', 'checkpoint_every_n_tokens', 'dt_softplus', 'dt_min',
        'dt_max', 'batch_invariant', 'overwrite_initial_state', 'name', 'compute_data_type', 'out_dims'),
    "mamba2_summary": ('k', 'v', 'g', 'a', 'cu_seqlens', 'initial_state', 'dt_bias', 'output_transition',
        'dt_softplus', 'dt_min', 'dt_max', 'batch_invariant', 'name', 'compute_data_type', 'out_dims'),
    "mamba2_summary_bwd": ('q', 'k', 'g', 'a', 'cu_seqlens', 'dO', 'd_final_state', 'dt_bias',
        'output_transition', 'dt_softplus', 'dt_min', 'dt_max', 'batch_invariant', 'name', 'compute_data_type',
        'out_dims'),
    "matmul": ('A', 'B', 'compute_data_type', 'padding', 'name'),
    "max": ('input0', 'input1', 'name', 'compute_data_type'),
    "min": ('input0', 'input1', 'name', 'compute_data_type'),
    "mod": ('input0', 'input1', 'name', 'compute_data_type'),
    "moe_grouped_matmul": ('token', 'weight', 'first_token_offset', 'token_index', 'token_ks', 'mode', 'top_k',
        'name', 'compute_data_type', 'out_dims'),
    "moe_grouped_matmul_bwd": ('doutput', 'token', 'first_token_offset', 'name', 'compute_data_type', 'out_dims'),
    "mul": ('a', 'b', 'name', 'compute_data_type'),
    "neg": ('input', 'name', 'compute_data_type'),
    "nodes": (),
    "plans": (),
    "populate_cuda_graph": ('handle', 'variant_pack', 'workspace', 'cuda_graph'),
    "pow": ('input0', 'input1', 'name', 'compute_data_type'),
    "reciprocal": ('input', 'name', 'compute_data_type'),
    "reduction": ('input', 'group_offset', 'mode', 'name', 'compute_data_type', 'out_dims'),
    "relu": ('input', 'negative_slope', 'lower_clip', 'upper_clip', 'name', 'compute_data_type'),
    "relu_backward": ('loss', 'input', 'negative_slope', 'lower_clip', 'upper_clip', 'name', 'compute_data_type'),
    "reshape": ('input', 'reshape_mode', 'name', 'compute_data_type', 'out_dims'),
    "rmsnorm": ('input', 'scale', 'bias', 'epsilon', 'norm_forward_phase', 'name', 'compute_data_type',
        'out_dims'),
    "rmsnorm_backward": ('grad', 'input', 'scale', 'inv_variance', 'has_dbias', 'name', 'compute_data_type',
        'out_dims'),
    "rope": ('input', 'freqs', 'output_scale', 'rope_dim', 'name', 'compute_data_type', 'out_dims'),
    "rope_backward": ('dY', 'freqs', 'output_scale', 'rope_dim', 'name', 'compute_data_type', 'out_dims'),
    "rsqrt": ('input', 'name', 'compute_data_type'),
    "scale": ('input', 'scale', 'name', 'compute_data_type'),
    "sdpa": ('q', 'k', 'v', 'rng_dump', 'score_max', 'score_sum_exp', 'kv_mask', 'name', 'compute_data_type',
        'out_dims'),
    "sdpa_backward": ('q', 'k', 'v', 'o', 'dO', 'stats', 'dBias', 'dSink_token', 'rng_dump', 'name',
        'compute_data_type', 'out_dims'),
    "sdpa_fp8": ('q', 'k', 'v', 'descale_q', 'descale_k', 'descale_v', 'descale_s', 'scale_s', 'scale_o',
        'rng_dump', 'score_max', 'score_sum_exp', 'sf_o', 'name', 'compute_data_type', 'out_dims'),
    "sdpa_fp8_backward": ('q', 'k', 'v', 'o', 'dO', 'stats', 'descale_q', 'descale_k', 'descale_v',
        'descale_o', 'descale_dO', 'descale_s', 'descale_dP', 'scale_s', 'scale_dQ', 'scale_dK', 'scale_dV',
        'scale_dP', 'dSink_token', 'name', 'compute_data_type', 'out_dims'),
    "sdpa_mxfp8": ('q', 'k', 'v', 'descale_q', 'descale_k', 'descale_v', 'sf_o', 'scale_o', 'name',
        'compute_data_type', 'out_dims'),
    "sdpa_mxfp8_backward": ('q', 'q_T', 'k', 'k_T', 'v', 'o_f16', 'dO_f16', 'dO', 'dO_T', 'stats', 'descale_q',
        'descale_q_T', 'descale_k', 'descale_k_T', 'descale_v', 'descale_dO', 'descale_dO_T', 'dSink_token',
        'name', 'compute_data_type', 'out_dims'),
    "select_behavior_notes": ('notes',),
    "select_numeric_notes": ('notes',),
    "select_plan": ('index',),
    "selected_engine": (),
    "serialize": ('as_bytes', 'include_kernels'),
    "sigmoid": ('input', 'name', 'compute_data_type'),
    "sigmoid_backward": ('loss', 'input', 'name', 'compute_data_type'),
    "sin": ('input', 'name', 'compute_data_type'),
    "slice": ('input', 'slices', 'name', 'compute_data_type', 'out_dims'),
    "softplus": ('input', 'name', 'compute_data_type'),
    "softplus_backward": ('loss', 'input', 'name', 'compute_data_type'),
    "sqrt": ('input', 'name', 'compute_data_type'),
    "sub": ('a', 'b', 'name', 'compute_data_type'),
    "swish": ('input', 'swish_beta', 'name', 'compute_data_type'),
    "swish_backward": ('loss', 'input', 'swish_beta', 'name', 'compute_data_type'),
    "tan": ('input', 'name', 'compute_data_type'),
    "tanh": ('input', 'name', 'compute_data_type'),
    "tanh_backward": ('loss', 'input', 'name', 'compute_data_type'),
    "tensor": ('dim', 'stride', 'data_type', 'is_virtual', 'is_pass_by_value', 'ragged_offset',
        'reordering_type', 'name', 'uid', 'ragged_offset_multiplier', 'alignment_value'),
    "tensor_like": ('template', 'name', 'is_virtual'),
    "tensor_scalar": ('value', 'scalar_type', 'name'),
    "tensors": (),
    "transpose": ('input', 'permutation', 'name', 'compute_data_type', 'out_dims'),
    "update_cuda_graph": ('handle', 'variant_pack', 'workspace', 'cuda_graph'),
    "validate": (),
}

# pygraph methods whose status is not "same": name -> (status, why).
PYGRAPH_STATUS: dict[str, tuple[str, str]] = {
    "deserialize": (DIFFERS, "reads cudnn_graph's plan blob (docs/plan_format.md), not the frontend's; a JSON "
                             "string is refused; key the loaded graph's buffers by uid or name (a tensor of "
                             "the graph that was serialized is another graph's)"),
    "serialize": (DIFFERS, "writes cudnn_graph's plan blob (docs/plan_format.md): the graph, the plan's recipe "
                           "and cuDNN's serialized execution plan or a Python engine's kernels"),
    "get_cuda_graph_retention": (NOT_IMPLEMENTED, _OWN_REPLAY),
    "populate_cuda_graph": (DIFFERS, "the variant pack takes any buffers execute() takes (not only int "
                                     "pointers); a plan cuDNN cannot populate, and a Python-engine plan, is "
                                     "recorded by capturing one execute; host (pass-by-value) operands are "
                                     "refused (CudaGraphError)"),
    "update_cuda_graph": (DIFFERS, "as populate_cuda_graph; a captured plan's child graph is captured again "
                                   "(apply it with cuGraphExecUpdate or instantiate again)"),
    "inspect": (DIFFERS, "returns the graph's to_dict() (cudnn_graph's layout of nodes and tensors)"),
    "tensors": (DIFFERS, "a tuple of tensors in creation order (the frontend's is a dict by name); "
                         "find_tensor(name) looks one up"),
    "tensor": (DIFFERS, "the first positional parameter is name (the frontend's is dim): pass dims by keyword"),
    "execute": (DIFFERS, "the fourth positional parameter is stream; the buffers are passed positionally "
                         "(tensor_dict is not a keyword here)"),
    "execute_plan_at_index": (DIFFERS, "the buffers are passed positionally (tensor_dict is not a keyword here)"),
    "key": (DIFFERS, "a structural fingerprint of the graph made here, not cuDNN's cache key"),
    "selected_engine": (DIFFERS, "the Python engine serving the selected plan, None when cuDNN's backend "
                                 "serves it (the frontend's meaning), as cudnn_graph engine objects"),
}
for _op in ("gdn2_summary", "gdn2_summary_bwd", "gdn_summary", "gdn_summary_bwd", "gdp", "gdp_bwd",
            "gdp_summary", "gdp_summary_bwd", "kda_summary", "kda_summary_bwd", "mamba2", "mamba2_bwd",
            "mamba2_summary", "mamba2_summary_bwd", "moe_grouped_matmul", "moe_grouped_matmul_bwd", "rope",
            "rope_backward", "sdpa_fp8", "sdpa_fp8_backward", "sdpa_mxfp8", "sdpa_mxfp8_backward"):
    PYGRAPH_STATUS[_op] = (NOT_IMPLEMENTED, _NO_OP.format(_op))

_LINEAR_ATTENTION_EXTRA = "this linear-attention variant option is not in cudnn_graph's op schema"
_TENSOR_KEYWORD = "not a keyword of this method here (the tensor constructors are cudnn_graph's own)"

# (method, keyword) -> (status, why) where the keyword is not "same".
KEYWORD_STATUS: dict[tuple[str, str], tuple[str, str]] = {
    ("pygraph", "sm_count"): (NOT_IMPLEMENTED, "plans are made for the whole device; an SM budget is not "
                                               "passed to engines"),
    ("pygraph", "sm_version"): (NOT_IMPLEMENTED, "plans are made for the visible device's architecture"),
    ("pygraph", "device_property"): (DIFFERS, "cuDNN's engines plan for the described GPU without it; Python "
                                              "engines decline such a graph (they need the device); a serialized "
                                              "plan records the properties and refuses a GPU whose differ"),
    ("pygraph", "cuda_graph_retention"): (NOT_IMPLEMENTED, _OWN_REPLAY),
    ("pygraph", "is_dynamic_shape_enabled"): (DIFFERS, "a cuDNN dynamic-shape operation graph (cuDNN >= 9.4; an "
                                                       "older cuDNN builds for the one shape and logs it); Python "
                                                       "engines compile per kernel class anyway"),
    ("pygraph", "is_cuda_graph_replay_expected"): (DIFFERS, "accepted as a hint; it changes no plan here"),
    ("pygraph", "kernel_cache"): (DIFFERS, "used by the cuDNN backend (cuDNN >= 9.4); an engine that cannot use it "
                                           "builds without it and records why (KernelCache.declined_by, logged)"),
    ("build", "ctx"): (NOT_IMPLEMENTED, _BUILD_CONTEXT),
    ("build_plans", "ctx"): (NOT_IMPLEMENTED, _BUILD_CONTEXT),
    ("execute", "tensor_dict"): (DIFFERS, "pass the buffers positionally"),
    ("execute", "tensor_uids"): (DIFFERS, "not accepted: pass a mapping {uid: buffer}"),
    ("execute_plan_at_index", "tensor_dict"): (DIFFERS, "pass the buffers positionally"),
    ("execute_plan_at_index", "tensor_uids"): (DIFFERS, "not accepted: pass a mapping {uid: buffer}"),
    ("tensor", "ragged_offset_multiplier"): (DIFFERS, _TENSOR_KEYWORD),
    ("tensor", "alignment_value"): (DIFFERS, _TENSOR_KEYWORD),
    ("tensor_scalar", "scalar_type"): (DIFFERS, "named data_type here (the second positional parameter)"),
    ("block_scale_quantize", "group_offset"): (NOT_IMPLEMENTED, "grouped block-scale quantization is not in "
                                                                "cudnn_graph's op schema"),
    ("reduction", "group_offset"): (NOT_IMPLEMENTED, "grouped reductions are not in cudnn_graph's op schema"),
    ("sdpa", "kv_mask"): (NOT_IMPLEMENTED, "a key/value mask tensor is not in cudnn_graph's sdpa schema"),
}
for _method in ("get_workspace_size", "get_workspace_size_plan_at_index"):
    for _keyword in ("override_uids", "override_shapes", "override_strides"):
        KEYWORD_STATUS[(_method, _keyword)] = (NOT_IMPLEMENTED, _FIXED_WORKSPACE)
_COMMON_LA_EXTRAS = ("gate_domain", "batch_invariant", "overwrite_initial_state")
for _op, _keywords in (
        ("gdn", ("state_indices",) + _COMMON_LA_EXTRAS),
        ("gdn2", ("state_indices", "beta_guard") + _COMMON_LA_EXTRAS),
        ("gdn_bwd", _COMMON_LA_EXTRAS),
        ("gdn2_bwd", ("beta_guard",) + _COMMON_LA_EXTRAS),
        ("kda", ("state_indices",) + _COMMON_LA_EXTRAS),
        ("kda_bwd", _COMMON_LA_EXTRAS)):
    for _keyword in _keywords:
        KEYWORD_STATUS[(_op, _keyword)] = (NOT_IMPLEMENTED, _LINEAR_ATTENTION_EXTRA)
_CHECKPOINT_LAYOUT = ("each row holds a state as initial_state does here, (HV, K, V) (the frontend's rows are "
                      "(HO, V, K)); the GPU engines store and reuse them at n = 64 (one row a 64-token chunk), in "
                      "the input type or FLOAT as their plan's scratch is; other n run on the reference engine")
_STATE_LAYOUT = ("states are (N, HV, K, V) here, flash-linear-attention's layout (final_state and d_initial_state "
                 "too); the frontend's are (N, HO, V, K): swap the last two axes when porting (with K == V the "
                 "shapes agree, so validation cannot catch it)")
for _op in ("gdn", "kda", "gdn2"):
    KEYWORD_STATUS[(_op, "initial_state")] = (DIFFERS, _STATE_LAYOUT)
    KEYWORD_STATUS[(_op + "_bwd", "initial_state")] = (DIFFERS, _STATE_LAYOUT)
    KEYWORD_STATUS[(_op + "_bwd", "d_final_state")] = (DIFFERS, _STATE_LAYOUT)
    KEYWORD_STATUS[(_op, "checkpoint_every_n_tokens")] = (DIFFERS, _CHECKPOINT_LAYOUT)
    KEYWORD_STATUS[(_op + "_bwd", "checkpoint_every_n_tokens")] = (DIFFERS, _CHECKPOINT_LAYOUT)
    KEYWORD_STATUS[(_op + "_bwd", "state_checkpoints")] = (DIFFERS, _CHECKPOINT_LAYOUT)
_SOFTPLUS_WITHOUT_BOUND = ("without gate_lower_bound the gate is -exp(a_log) * softplus(g + dt_bias) (fla's "
                           "in-kernel gate; the frontend's kda / gdn2 then take the bounded form at -5); with "
                           "gate_lower_bound, the frontend's gate_lower_bound * sigmoid(exp(a_log) * (g + dt_bias))")
for _op in ("kda", "kda_bwd", "gdn2", "gdn2_bwd"):
    KEYWORD_STATUS[(_op, "safe_gate")] = (DIFFERS, _SOFTPLUS_WITHOUT_BOUND)


# ---- what the table installs ----------------------------------------------------------------------

class _Unimplemented:
    """A top-level frontend name that is not implemented: calling it, or reading any attribute of it
    (an enum member, say), raises NotImplementedError saying why."""

    def __init__(self, name: str, why: str) -> None:
        object.__setattr__(self, "_message", f"cudnn.{name} is not implemented in cudnn_graph: {why}")

    def __call__(self, *args: Any, **kwargs: Any):
        raise NotImplementedError(self._message)

    def __getattr__(self, attribute: str):
        if attribute.startswith("_"):
            # Introspection (pytest, doctest, hasattr probes) asks private names: a plain miss.
            raise AttributeError(attribute)
        raise NotImplementedError(self._message)

    def __repr__(self) -> str:
        return f"<not implemented: {self._message}>"


def _graph_stub(name: str, why: str):
    def stub(self, *args, **kwargs):
        raise NotImplementedError(f"pygraph.{name}() is not implemented in cudnn_graph: {why}")
    stub.__name__ = stub.__qualname__ = name
    stub.__doc__ = f"cudnn.pygraph.{name}: not implemented ({why})."
    return stub


def not_implemented_names() -> list:
    """``cudnn.X`` / ``pygraph.X`` / ``pygraph.X(keyword=)`` for every row whose status is not implemented."""
    names = [f"cudnn.{n}" for n, (status, _) in TOP_LEVEL.items() if status == NOT_IMPLEMENTED]
    names += [f"pygraph.{n}" for n, (status, _) in PYGRAPH_STATUS.items() if status == NOT_IMPLEMENTED]
    names += [f"{m}({k}=)" for (m, k), (status, _) in KEYWORD_STATUS.items() if status == NOT_IMPLEMENTED]
    return names


def install_module_stubs(namespace: dict) -> None:
    """Put a stub into ``namespace`` (the package's globals) for each unimplemented top-level name."""
    for name, (status, why) in TOP_LEVEL.items():
        if status == NOT_IMPLEMENTED and name not in namespace:
            namespace[name] = _Unimplemented(name, why)


def install_graph_stubs(graph_class) -> None:
    """Give ``graph_class`` (pygraph) a stub for each unimplemented frontend method it lacks."""
    for name, (status, why) in PYGRAPH_STATUS.items():
        if status == NOT_IMPLEMENTED and not hasattr(graph_class, name):
            setattr(graph_class, name, _graph_stub(name, why))


def declined_keywords(method: str) -> dict:
    """{keyword: why} of ``method``'s unimplemented keywords (op builders refuse them by name)."""
    return {k: why for (m, k), (status, why) in KEYWORD_STATUS.items() if m == method and status == NOT_IMPLEMENTED}


def refuse_unimplemented_keywords(method: str, **given: Any) -> None:
    """Raise NotImplementedError for the first unimplemented keyword of ``method`` given a value (not None)."""
    for keyword, value in given.items():
        if value is None:
            continue
        status, why = KEYWORD_STATUS.get((method, keyword), (SAME, ""))
        if status == NOT_IMPLEMENTED:
            raise NotImplementedError(f"{method}({keyword}=) is not implemented in cudnn_graph: {why}")
