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
- a 128^3 bf16 matmul, where host cost dominates: a one-node cuDNN graph through the custom call vs
  ``jnp.matmul``. Acceptance: ours <= 1.1x.

Prints a table; writes bench/results/jax_jit-<host>.json (and $OUT/jax_jit.json when OUT is set).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

BIG = dict(b=4, h=16, s=4096, d=128)


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


def matmul_case(jax, jnp, cgjax, iters, repeats):
    from cudnn_graph.router import PreferFamily, set_default_router
    previous = set_default_router(PreferFamily("cudnn"))     # the C path: a cuDNN plan
    try:
        fn = cgjax.function(_matmul_build, name="mm128")
        a = jnp.ones((1, 128, 128), jnp.bfloat16)
        b = jnp.ones((1, 128, 128), jnp.bfloat16)
        plan = fn.plan_for(a, b)
        ours = step_ms(jax, jax.jit(fn), (a, b), iters, repeats)
    finally:
        set_default_router(previous)
    theirs = step_ms(jax, jax.jit(jnp.matmul), (a[0], b[0]), iters, repeats)
    return [(f"matmul 128^3 bf16 ({plan.registration.kind} plan)", ours, theirs, 1.1)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    args = parser.parse_args(argv)
    import jax
    import jax.numpy as jnp
    import cudnn_graph.jax as cgjax
    iters, repeats = (5, 3) if args.quick else (50, 7)
    small_iters = 200 if args.quick else 2000
    rows = sdpa_cases(jax, jnp, cgjax, iters, repeats) + matmul_case(jax, jnp, cgjax, small_iters, repeats)
    print(f"{'case':48s} {'ours ms':>10s} {'jax ms':>10s} {'ratio':>7s} {'limit':>6s}")
    results = []
    for name, ours, theirs, limit in rows:
        ratio = ours / theirs
        print(f"{name:48s} {ours:10.4f} {theirs:10.4f} {ratio:7.3f} {limit:6.2f}{'' if ratio <= limit else '  OVER'}")
        results.append({"case": name, "ours_ms": ours, "jax_ms": theirs, "ratio": ratio, "limit": limit,
                        "within_limit": ratio <= limit})
    record = {"bench": "jax_jit", "host": platform.node(), "jax": jax.__version__,
              "devices": [str(d) for d in jax.devices()], "quick": args.quick, "results": results}
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(here, exist_ok=True)
    paths = [os.path.join(here, f"jax_jit-{platform.node() or 'host'}.json")]
    if os.environ.get("OUT"):
        paths.append(os.path.join(os.environ["OUT"], "jax_jit.json"))
    for path in paths:
        with open(path, "w") as f:
            json.dump(record, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
