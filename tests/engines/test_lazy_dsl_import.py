"""The GPU DSLs (CuTe DSL's ``cutlass``, cuTile's ``cuda.tile``) are imported only when their engine first
considers a graph on a device it can serve: a host graph's build and execute never import them.

Each case runs in a fresh interpreter (a clean ``sys.modules``). Where the DSLs are not installed, stub
packages named like them stand in: each writes a marker file when it is imported, so the test sees
whether planning imported it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("cudnn_graph")

# The DSL modules and the engines' DSL-dependent submodules a host graph must not import.
DSL_MODULES = ("cutlass", "cutlass.cute", "cuda.tile", "cudnn_graph.engines.cute._kernel",
               "cudnn_graph.engines.cute._launch", "cudnn_graph.engines.cutile._kernels")

_HOST_GRAPH = """
import numpy as np
import cudnn_graph as cudnn
F = cudnn.data_type
g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cpu")
a = g.tensor(name="A", dim=[1, 4, 8], stride=[32, 8, 1])
b = g.tensor(name="B", dim=[1, 8, 2], stride=[16, 2, 1])
c = g.relu(g.matmul(a, b)).set_output(True)
g.build([cudnn.heur_mode.A])
z = np.zeros((1, 4, 2), np.float32)
g.execute({a: np.ones((1, 4, 8), np.float32), b: np.ones((1, 8, 2), np.float32), c: z})
assert float(z.sum()) == 64.0
"""

_GDN_GRAPH = """
def gdn_graph(device):
    g = cudnn.pygraph(io_data_type=F.BFLOAT16, compute_data_type=F.FLOAT, device=device)
    T, H, K = 100, 2, 64
    q, k, v = (g.tensor(name=n, dim=[T, H, K], stride=[H * K, K, 1]) for n in "qkv")
    gate = g.tensor(name="g", dim=[T, H], stride=[H, 1], data_type=F.FLOAT)
    beta = g.tensor(name="beta", dim=[T, H], stride=[H, 1])
    cu = g.tensor(name="cu", dim=[3], stride=[1], data_type=F.INT32)
    o, _, _ = g.gdn(q, k, v, gate, beta, cu_seqlens=cu)
    o.set_output(True)
    return g
"""

_REPORT = """
import json, sys
from cudnn_graph.engines import manifest
print(json.dumps({"loaded": [m for m in DSL_MODULES if m in sys.modules],
                  "engines": [e.name for e in manifest.engines()], **report}))
"""


def _run(code: str, tmp_path, stubs: bool) -> dict:
    """Run ``code`` in a fresh interpreter (with the DSL stubs first on its path when ``stubs``); the
    JSON line it prints last."""
    prelude = f"import sys\nDSL_MODULES = {DSL_MODULES!r}\nreport = {{}}\n"
    if stubs:
        prelude += f"sys.path.insert(0, {str(tmp_path / 'stubs')!r})\n"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
               DSL_MARKERS=str(tmp_path / "markers"))
    env.pop("CUDNN_GRAPH_LOG", None)
    result = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code) + _REPORT],
                            capture_output=True, text=True, env=env, timeout=300, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture
def stub_dsls(tmp_path):
    """Stub ``cutlass`` (with ``cutlass.cute``) and ``cuda.tile`` packages that write
    ``markers/<name>`` when imported; returns the set of names imported so far (a function)."""
    markers = tmp_path / "markers"
    markers.mkdir()
    record = ("import os, pathlib\n"
              "pathlib.Path(os.environ['DSL_MARKERS'], __name__).write_text('imported')\n")
    for package in ("cutlass", "cutlass/cute", "cuda/tile"):
        folder = tmp_path / "stubs" / package
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text(record)     # no stubs/cuda/__init__.py: cuda is a namespace
    return lambda: {p.name for p in markers.iterdir()}


def test_a_host_graph_build_and_execute_import_no_gpu_dsl(tmp_path):
    out = _run(_HOST_GRAPH, tmp_path, stubs=False)
    assert out["loaded"] == [], out
    assert "reference" in out["engines"]


def test_a_host_graph_imports_no_installed_dsl_though_both_engines_are_listed(tmp_path, stub_dsls):
    code = _HOST_GRAPH + _GDN_GRAPH + """
h = gdn_graph("cpu")            # an op the cuTile engine runs, on a device it does not serve
h.build([cudnn.heur_mode.A])
report["declines"] = [who for who, _ in g.declines + h.declines]
"""
    out = _run(code, tmp_path, stubs=True)
    assert {"cute_gemm", "cutile_linear_attention"} <= set(out["engines"]), out
    assert {"cute_gemm", "cutile_linear_attention"} <= set(out["declines"]), out
    assert out["loaded"] == [], out
    assert stub_dsls() == set()


def test_planning_a_cuda_graph_the_engines_serve_imports_their_dsl(tmp_path, stub_dsls):
    code = _GDN_GRAPH + """
import cudnn_graph as cudnn
from cudnn_graph.engines.cute import engine as cute_engine
from cudnn_graph.engines.cutile import engine as cutile_engine
F = cudnn.data_type
cute_engine._compute_capability = cutile_engine._compute_capability = lambda ordinal: (9, 0)   # no GPU here
g = cudnn.pygraph(io_data_type=F.BFLOAT16, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                  device="cuda")
a = g.tensor(name="A", dim=[1, 64, 64], stride=[4096, 64, 1])
b = g.tensor(name="B", dim=[1, 64, 64], stride=[4096, 64, 1])
g.matmul(a, b).set_output(True)
g.create_execution_plans()
after_matmul = sorted(m for m in ("cutlass", "cuda.tile") if m in sys.modules)
h = gdn_graph("cuda")
h.create_execution_plans()
report.update(after_matmul=after_matmul, cute_plans=[p.label for p in g.plans if p.engine.name == "cute_gemm"],
              cutile_decline=[why for who, why in h.declines if who == "cutile_linear_attention"])
"""
    out = _run(code, tmp_path, stubs=True)
    assert out["after_matmul"] == ["cutlass"], out          # the matmul graph asked the CuTe engine only
    assert out["cute_plans"], out                            # the stub DSL "imports": the engine plans
    assert "cuda.tile" in out["loaded"]
    assert "tileiras" in out["cutile_decline"][0], out      # the stub has no compiler: declined, with why
    assert stub_dsls() == {"cutlass", "cuda.tile"}      # cutlass.cute is looked up; the kernel imports it


def test_making_the_engine_list_loads_no_libcudnn():
    """A process whose plan is a Python engine's (a CuTe plan from the plan cache) makes the engine list
    without loading libcudnn or importing cuda-pathfinder (~40 ms on the H200): the cuDNN backend probes
    the library when it is first asked whether it is available."""
    code = textwrap.dedent("""
        import json, sys
        from cudnn_graph import _loader
        from cudnn_graph.engines import manifest
        names = [e.name for e in manifest.engines()]
        before = {"loaded": _loader.is_loaded(), "pathfinder": "cuda.pathfinder" in sys.modules}
        backend = next(e for e in manifest.engines() if e.name == "cudnn_backend")
        print(json.dumps({"names": names, "before": before, "available": backend.available == _loader.is_available()}))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "cudnn_backend" in out["names"]
    assert out["before"] == {"loaded": False, "pathfinder": False}
    assert out["available"] is True


def test_a_plan_loaded_from_a_blob_makes_only_its_own_engine():
    """Deserializing a reference plan (what a plan-cache hit does) makes the reference engine alone: the
    CuTe and cuTile engine modules are not imported; the engine list made afterwards holds that same
    engine object."""
    code = textwrap.dedent("""
        import json, sys
        import numpy as np
        import cudnn_graph as cudnn
        F = cudnn.data_type
        g = cudnn.pygraph(io_data_type=F.FLOAT, compute_data_type=F.FLOAT, device="cpu")
        a = g.tensor(name="A", dim=[1, 4, 8], stride=[32, 8, 1])
        b = g.tensor(name="B", dim=[1, 8, 2], stride=[16, 2, 1])
        g.matmul(a, b).set_output(True)
        g.build([cudnn.heur_mode.A])
        blob = g.serialize(as_bytes=True)
        for name in [m for m in sys.modules if m.startswith(("cudnn_graph.engines.cute", "cudnn_graph.engines.cutile"))]:
            del sys.modules[name]
        from cudnn_graph.engines import manifest
        manifest._loaded, manifest._made = None, {}      # a fresh process's engine state
        h = cudnn.pygraph()
        h.deserialize(blob)
        imported = sorted(m for m in ("cudnn_graph.engines.cute", "cudnn_graph.engines.cutile") if m in sys.modules)
        same = h.selected_plan.engine is next(e for e in manifest.engines() if e.name == "reference")
        print(json.dumps({"imported": imported, "same": same, "engine": h.selected_plan.engine.name}))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"imported": [], "same": True, "engine": "reference"}
