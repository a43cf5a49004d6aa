"""A host (CPU) graph's first build, each sample in a fresh process: import time, first build time, and
which GPU DSL modules the build imported (it should import none: the DSL engines import theirs only for a
graph on a device they serve).

    python bench/first_build.py [--repeats 5] [--json PATH]

Prints the median and minimum of each time and the DSL modules seen in any sample; ``--json`` writes the
samples too.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap

DSL_PREFIXES = ("cutlass", "cuda.tile", "cudnn_graph.engines.cute._kernel", "cudnn_graph.engines.cute._launch",
                "cudnn_graph.engines.cutile._kernels")

_SAMPLE = textwrap.dedent("""
    import json, sys, time
    t0 = time.perf_counter()
    import numpy as np
    import cudnn_graph as cudnn
    t1 = time.perf_counter()
    shapes = {"x": (1, 64, 32), "w": (1, 32, 16)}                 # relu(x @ w): a matmul and a pointwise op
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT,
                      device="cpu")
    x, w = (g.tensor(name=n, dim=list(s), stride=[s[1] * s[2], s[2], 1]) for n, s in shapes.items())
    y = g.relu(g.matmul(x, w)).set_output(True)
    g.build([cudnn.heur_mode.A])
    t2 = time.perf_counter()
    buffers = {t: np.ones(shapes[n], np.float32) for t, n in ((x, "x"), (w, "w"))}
    g.execute({**buffers, y: np.zeros((1, 64, 16), np.float32)})
    dsl = sorted(m for m in sys.modules if m.startswith(PREFIXES))
    print(json.dumps({"import_s": t1 - t0, "first_build_s": t2 - t1, "dsl_modules": dsl}))
""")


def sample() -> dict:
    """One fresh process's figures."""
    code = f"PREFIXES = {DSL_PREFIXES!r}\n" + _SAMPLE
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="write the samples and the summary here")
    args = parser.parse_args()
    samples = [sample() for _ in range(args.repeats)]
    summary = {key: {"median": statistics.median(s[key] for s in samples), "min": min(s[key] for s in samples)}
               for key in ("import_s", "first_build_s")}
    summary["dsl_modules"] = sorted({m for s in samples for m in s["dsl_modules"]})
    for key in ("import_s", "first_build_s"):
        print(f"{key:14s} median {summary[key]['median']:.3f} s   min {summary[key]['min']:.3f} s")
    print(f"DSL modules imported by a host build: {summary['dsl_modules'] or 'none'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"samples": samples, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
