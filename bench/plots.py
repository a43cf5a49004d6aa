"""The figures of docs/performance.md, drawn from the measurements committed in bench/results/.

Needs matplotlib, which is no dependency of cudnn_graph nor of its test extras (install it yourself:
``python -m pip install matplotlib``). Runs on any machine; it reads JSON only:

    python bench/plots.py [--results bench/results] [--out docs/img]

Writes one PNG per figure (900 x 500 pixels) and prints nothing; ``--list`` prints which JSON file
each figure is drawn from. Every figure shows ours next to the peer measured in the same run; the
title names the machine and the run (the date where the JSON records one).
"""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
# The run each figure is drawn from. Host overhead: the newest run of the current tree (session 8,
# "after" the restructuring; its "before" runs measure an older commit). Linear attention: the
# session-6 final run, the code on main (session 7's files are experiments that were not kept).
SOURCES = {
    "host_overhead": "host_overhead-h200-session8-after-run2.json",
    "build_time": "build_time-h200.json",
    "gemm": "gemm-h200.json",
    "sdpa": "sdpa-h200.json",
    "linear_attention": "linear_attention-h200.json",
}
OURS, PEER, OTHER, FLOOR = "#1f77b4", "#ff7f0e", "#2ca02c", "#555555"
FIGSIZE, DPI = (9, 5), 100


def _load(results: Path, figure: str) -> dict:
    with open(results / SOURCES[figure]) as f:
        return json.load(f)


def _where(data: dict, figure: str) -> str:
    """'NVIDIA H200, <run>': the machine and which run, for a title."""
    gpu = data.get("gpu", "NVIDIA H200")
    return f"{gpu}, {data['date']}" if data.get("date") else f"{gpu}, {SOURCES[figure]}"


def _bars(ax, groups: list[str], series: list[tuple[str, str, list]], fmt: str = "{:.1f}") -> None:
    """Grouped bars: one group per label in ``groups``, one bar per (name, colour, values) series; a value
    of None leaves its slot empty (not measured). Each bar carries its value."""
    width = 0.8 / len(series)
    for i, (name, colour, values) in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        kept = [(x, v) for x, v in zip(xs, values) if v is not None]
        bars = ax.bar([x for x, _ in kept], [v for _, v in kept], width, label=name, color=colour)
        ax.bar_label(bars, labels=[fmt.format(v) for _, v in kept], fontsize=8, padding=2)
    ax.set_xticks(range(len(groups)), groups)
    ax.margins(y=0.15)
    ax.grid(axis="y", alpha=0.3)


def plot_host_overhead(results: Path, out: Path) -> Path:
    """execute() host time per producer: ours (every call, and CUDA graph replay) vs the frontend, with
    the C floors (cudnnBackendExecute / cuGraphLaunch from a nogil loop)."""
    d = _load(results, "host_overhead")
    producers = [("raw int", "raw int"), ("torch", "torch"), ("CuPy", "cupy"),
                 ("JAX (A, B) + torch (C)", "jax (A, B) + torch (C)")]
    frontend = {"raw int": d["frontend"].get("frontend raw int"), "torch": d["frontend"].get("frontend torch")}
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    _bars(ax, [label for label, _ in producers], [
        ("ours, execute every call", OURS, [d["ours"].get(key) for _, key in producers]),
        ("ours, CUDA graph replay (default)", OTHER, [d["ours"].get(f"{key} (graph replay)") for _, key in producers]),
        (f"cudnn-frontend {d.get('frontend_version', '')}", PEER, [frontend.get(key) for _, key in producers]),
    ])
    # The floors go into the legend (a label on the line would sit on a bar).
    ax.axhline(d["c_floor_us"], color=FLOOR, linestyle="--", linewidth=1,
               label=f"C floor, cudnnBackendExecute from a nogil loop ({d['c_floor_us']:.1f})")
    if d.get("c_floor_graph_launch_us"):
        ax.axhline(d["c_floor_graph_launch_us"], color=FLOOR, linestyle=":", linewidth=1,
                   label=f"C floor, cuGraphLaunch from a nogil loop ({d['c_floor_graph_launch_us']:.1f})")
    return _finish(fig, ax, out / "host_overhead.png", ylabel="host time per execute() (us, lower is better)",
                   xlabel="producer of the buffers (the frontend takes torch tensors or raw int pointers only)",
                   title=f"execute() host time, bf16 128x128x128 matmul ({_where(d, 'host_overhead')})",
                   legend="upper right")


def plot_build_time(results: Path, out: Path) -> Path:
    """Build latency in fresh processes, ours vs the frontend: seconds (left) and milliseconds (right)."""
    d = _load(results, "build_time")
    ours, fe = d["ours"], d["frontend"]
    fig, (left, right) = plt.subplots(1, 2, figsize=FIGSIZE, dpi=DPI, gridspec_kw={"width_ratios": [2, 1]})
    rows_s = [("import", "import_s"), ("first graph", "first_graph_s"),
              ("first graph,\nnext process", "first_graph_next_process_s"), ("first SDPA\ngraph", "first_sdpa_s")]
    _bars(left, [label for label, _ in rows_s], [
        ("ours", OURS, [ours[key] for _, key in rows_s]),
        ("cudnn-frontend", PEER, [fe[key] for _, key in rows_s]),
    ], fmt="{:.2f}")
    left.set_ylabel("seconds (lower is better)")
    left.legend(fontsize=8, loc="upper right")
    rows_ms = [("same graph\nagain", "same_graph_ms"), ("new shape\n(median)", "new_shape_ms_median")]
    _bars(right, [label for label, _ in rows_ms], [
        ("ours", OURS, [ours[key] for _, key in rows_ms]),
        ("cudnn-frontend", PEER, [fe[key] for _, key in rows_ms]),
    ])
    right.set_ylabel("milliseconds (lower is better)")
    fig.suptitle(f"Graph build latency, bf16 matmul / SDPA, build + first execute ({_where(d, 'build_time')})",
                 fontsize=10)
    return _save(fig, out / "build_time.png")


def plot_gemm(results: Path, out: Path) -> Path:
    """bf16 GEMM TFLOP/s: our CuTe plan (the one the router selects) and our cuDNN plan vs cuBLAS."""
    d = _load(results, "gemm")
    sizes = d["sizes"]
    groups = [f"{s['M']}x{s['N']}x{s['K']}" for s in sizes]

    def tflops(s, key):
        return s.get(key, {}).get("tflops")
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    _bars(ax, groups, [
        ("ours, CuTe engine (first-ranked plan)", OURS, [tflops(s, "cute0") for s in sizes]),
        ("ours, cuDNN engine", OTHER, [tflops(s, "cudnn") for s in sizes]),
        (f"cuBLAS (torch.matmul, torch {d.get('torch_version', '')})", PEER, [tflops(s, "cublas") for s in sizes]),
    ], fmt="{:.0f}")
    return _finish(fig, ax, out / "gemm.png", ylabel="TFLOP/s (higher is better)",
                   xlabel="M x N x K, bf16 in, fp32 accumulate",
                   title=f"GEMM throughput ({_where(d, 'gemm')})", legend="upper right")


def plot_sdpa(results: Path, out: Path) -> Path:
    """SDPA forward / backward TFLOP/s: ours vs the frontend and torch, one shape."""
    d = _load(results, "sdpa")
    k = d["kernels"]
    s = k["shape"]
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    _bars(ax, ["forward", "backward"], [
        ("ours (cuDNN engine)", OURS, [k["ours_fwd"]["tflops"], k["ours_bwd"]["tflops"]]),
        (f"cudnn-frontend {d.get('frontend_version', '')}", PEER,
         [k["frontend_fwd"]["tflops"], k["frontend_bwd"]["tflops"]]),
        ("torch scaled_dot_product_attention", OTHER, [k["torch_fwd"]["tflops"], k["torch_bwd"]["tflops"]]),
    ], fmt="{:.0f}")
    return _finish(fig, ax, out / "sdpa.png", ylabel="TFLOP/s (higher is better)",
                   xlabel=f"b={s['b']} h={s['h']} s={s['s']} d={s['d']} {s['dtype']}"
                          f"{', causal' if s.get('causal') else ''}",
                   title=f"SDPA throughput ({_where(d, 'sdpa')})", legend="upper right")


def plot_linear_attention(results: Path, out: Path) -> Path:
    """Chunked linear attention (gated delta rule, KDA) milliseconds per call: ours (cuTile engine) vs fla,
    wall time per call and GPU time (profiler); backward: ours only (the run measured no fla backward)."""
    d = _load(results, "linear_attention")
    rows = d["rows"]
    r0 = rows[0]
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    groups = [f"{r['op']} forward,\nwall per call" for r in rows] + [f"{r['op']} forward,\nGPU time" for r in rows] \
        + [f"{r['op']} backward,\nwall per call" for r in rows]
    ours = ([r["ours_fwd_ms"] for r in rows] + [r.get("ours_gpu_ms") for r in rows]
            + [r.get("ours_bwd_ms") for r in rows])
    fla = [r["fla_fwd_ms"] for r in rows] + [r.get("fla_gpu_ms") for r in rows] + [None for _ in rows]
    _bars(ax, groups, [("ours (cuTile engine)", OURS, ours), ("fla", PEER, fla)], fmt="{:.2f}")
    ax.tick_params(axis="x", labelsize=8)
    return _finish(fig, ax, out / "linear_attention.png", ylabel="milliseconds per call (lower is better)",
                   xlabel=f"T={r0['T']} ({r0['sequences']} sequences) H={r0['H']} K={r0['K']} V={r0['V']} "
                          f"{r0['dtype']}; backward: fla not measured",
                   title=f"Chunked linear attention ({_where(d, 'linear_attention')})", legend="upper left")


def _finish(fig, ax, path: Path, *, ylabel: str, xlabel: str, title: str, legend: str) -> Path:
    """Label a one-panel figure (units on the y axis, the problem on the x axis) and save it."""
    ax.set_ylabel(ylabel)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc=legend)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    log.info("wrote %s", path)
    return path


FIGURES = {"host_overhead": plot_host_overhead, "build_time": plot_build_time, "gemm": plot_gemm,
           "sdpa": plot_sdpa, "linear_attention": plot_linear_attention}


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    parser.add_argument("--list", action="store_true", help="print each figure's PNG and its source JSON")
    args = parser.parse_args(argv)
    if args.list:
        for name in FIGURES:
            print(f"{name}.png <- bench/results/{SOURCES[name]}")
        return []
    global plt
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("bench/plots.py needs matplotlib: python -m pip install matplotlib") from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    args.out.mkdir(parents=True, exist_ok=True)
    return [draw(args.results, args.out) for draw in FIGURES.values()]


plt = None  # matplotlib.pyplot, imported by main() so that --list and --help run without it

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
