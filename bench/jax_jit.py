"""cudnn_graph inside jax.jit (the XLA FFI custom call) vs JAX's own ops, per jitted step.

Run on a GPU machine with jax[cuda] installed (XLA_PYTHON_CLIENT_PREALLOCATE=false leaves memory for the
plans' own allocations):

    XLA_PYTHON_CLIENT_PREALLOCATE=false python bench/jax_jit.py [--quick]

Cases (each a jitted step, timed as the wall time of a run of back-to-back calls ended by one
block_until_ready, median over repeats):

- causal SDPA, bf16 b4 h16 s4096 d128, forward and forward+backward: ``cudnn_graph.jax.sdpa`` (our cuDNN
  plan through the custom call; q/k/v as (b, h, s, d)) vs ``jax.nn.dot_product_attention(...,
  implementation="cudnn")`` (JAX's own cuDNN custom call; (b, s, h, d), its native layout).
  Acceptance: ours <= 1.05x.
- a 128^3 bf16 matmul, where host cost dominates: a one-node graph through the custom call, once with
  the cuDNN plan (run in C by the handler) and once with the default plan (the CuTe GEMM where it is
  installed: its compiled entry called from C by the handler), vs a jitted ``jnp.matmul``.
  Acceptance: ours <= 1.1x.

Each row names the plan and the handler's path for it ('cudnn', 'dsl': called from C; 'python': the
GIL fallback). A case that fails is a row saying so; the JSON is written either way. Prints a table;
writes bench/results/jax_jit-<host>.json (and $OUT/jax_jit.json when OUT is set).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import time

BIG = dict(b=4, h=16, s=4096, d=128)
logger = logging.getLogger("bench.jax_jit")


def step_ms(jax, fn, args, iters: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean wall milliseconds per call of ``iters`` back-to-back calls."""
    jax.block_until_ready(fn(*args))      # compile and warm
    jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = None
        for _ in range(iters):
            out = fn(*args)
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - start) * 1e3 / iters)
    return statistics.median(samples)


def sdpa_cases(jax, jnp, cgjax, iters, repeats):
    b, h, s, d = BIG["b"], BIG["h"], BIG["s"], BIG["d"]
    key = jax.random.PRNGKey(0)
    ks = jax.random.split(key, 4)
    bhsd = [jax.random.normal(k, (b, h, s, d), jnp.float32).astype(jnp.bfloat16) for k in ks]
    bshd = [x.transpose(0, 2, 1, 3) for x in bhsd]
    ours = lambda q, k, v: cgjax.sdpa(q, k, v, causal=True)
    theirs = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")

    def train_step(f, do):
        def loss(q, k, v):
            return jnp.sum(f(q, k, v).astype(jnp.float32) * do.astype(jnp.float32))
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))

    rows = []
    rows.append(("sdpa fwd b4 h16 s4096 d128 bf16 causal",
                 step_ms(jax, jax.jit(ours), bhsd[:3], iters, repeats),
                 step_ms(jax, jax.jit(theirs), bshd[:3], iters, repeats), 1.05))
    rows.append(("sdpa fwd+bwd b4 h16 s4096 d128 bf16 causal",
                 step_ms(jax, train_step(ours, bhsd[3]), bhsd[:3], iters, repeats),
                 step_ms(jax, train_step(theirs, bshd[3]), bshd[:3], iters, repeats), 1.05))
    return rows


def _matmul_build(a, b, device):
    import cudnn_graph as cudnn
    from cudnn_graph.jax import row_major_strides
    F = cudnn.data_type
    g = cudnn.pygraph(io_data_type=F.BFLOAT16, compute_data_type=F.FLOAT, device=device, name="mm128")
    ta = g.tensor(name="a", dim=list(a.shape), stride=row_major_strides(a.shape), data_type=F.BFLOAT16)
    tb = g.tensor(name="b", dim=list(b.shape), stride=row_major_strides(b.shape), data_type=F.BFLOAT16)
    y = g.matmul(ta, tb).set_output(True).set_name("y").set_data_type(F.BFLOAT16)
    return g, [ta, tb], [y]


def _matmul_row(jax, jnp, cgjax, iters, repeats, families, what):
    """Our custom call's step on a 128^3 bf16 matmul with the plan the router picks (``families``: the
    preferred engine families, None: the default router), and the plan that ran."""
    from cudnn_graph.router import PreferFamily, get_default_router, set_default_router
    previous = get_default_router()
    if families is not None:
        set_default_router(PreferFamily(*families))
    try:
        # A function of its own per row: its plans (built at trace time, under this router) are its own.
        fn = cgjax.function(_matmul_build, name=f"mm128_{what}")
        a = jnp.ones((1, 128, 128), jnp.bfloat16)
        b = jnp.ones((1, 128, 128), jnp.bfloat16)
        plan = fn.plan_for(a, b)
        ours = step_ms(jax, jax.jit(fn), (a, b), iters, repeats)
    finally:
        set_default_router(previous)
    return ours, plan.registration.kind, getattr(plan.graph.selected_plan, "label", "?")


def matmul_cases(jax, jnp, cgjax, iters, repeats):
    """128^3 bf16 matmul: our custom call with the cuDNN plan and with the default plan (CuTe where it is
    installed) vs a jitted jnp.matmul, each in the same process."""
    a = jnp.ones((128, 128), jnp.bfloat16)
    theirs = step_ms(jax, jax.jit(jnp.matmul), (a, a), iters, repeats)
    rows = []
    for what, families in (("cudnn", ("cudnn",)), ("default", None)):
        ours, kind, label = _matmul_row(jax, jnp, cgjax, iters, repeats, families, what)
        rows.append((f"matmul 128^3 bf16 ({what} plan: {label}, {kind} path)", ours, theirs, 1.1))
    return rows


def _run_case(name, run):
    """The case's rows, or one row saying why it could not run (an unattended run still writes its JSON)."""
    try:
        return run()
    except Exception as exc:            # a bench reports what failed and carries on
        logger.error("%s failed: %s: %s", name, type(exc).__name__, exc)
        return [(f"{name} (failed: {type(exc).__name__}: {str(exc)[:200]})", float("nan"), float("nan"), None)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # cudnn_graph allocates device memory (plans, workspaces of eager runs) next to XLA's pool.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp
    import cudnn_graph.jax as cgjax
    iters, repeats = (5, 3) if args.quick else (50, 7)
    small_iters = 200 if args.quick else 2000
    rows = (_run_case("sdpa", lambda: sdpa_cases(jax, jnp, cgjax, iters, repeats))
            + _run_case("matmul 128^3", lambda: matmul_cases(jax, jnp, cgjax, small_iters, repeats)))
    print(f"{'case':72s} {'ours ms':>10s} {'jax ms':>10s} {'ratio':>7s} {'limit':>6s}", flush=True)
    results = []
    for name, ours, theirs, limit in rows:
        ratio = ours / theirs if theirs == theirs and theirs > 0 else float("nan")
        ok = limit is not None and ratio <= limit
        print(f"{name:72s} {ours:10.4f} {theirs:10.4f} {ratio:7.3f} {limit or float('nan'):6.2f}"
              f"{'' if ok else '  OVER' if limit is not None else '  FAILED'}", flush=True)
        number = lambda x: x if x == x else None       # NaN (a failed case) as JSON null
        results.append({"case": name, "ours_ms": number(ours), "jax_ms": number(theirs), "ratio": number(ratio),
                        "limit": limit, "within_limit": ok})
    record = {"bench": "jax_jit", "host": platform.node(), "jax": jax.__version__,
              "devices": [str(d) for d in jax.devices()], "quick": args.quick, "iters": iters,
              "small_iters": small_iters, "repeats": repeats, "results": results}
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(here, exist_ok=True)
    paths = [os.path.join(here, f"jax_jit-{platform.node() or 'host'}.json")]
    if os.environ.get("OUT"):
        paths.append(os.path.join(os.environ["OUT"], "jax_jit.json"))
    for path in paths:
        with open(path, "w") as f:
            json.dump(record, f, indent=2)
        print(f"wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
