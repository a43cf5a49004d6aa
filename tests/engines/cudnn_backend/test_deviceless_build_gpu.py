"""Deviceless (ahead-of-time) builds on the GPU machine, in three processes: this one reads device 0's
properties; a child with ``CUDA_VISIBLE_DEVICES=""`` (no device) reads them back and builds a matmul and an
SDPA graph with ``device_property=``, serializing the plans; a second child with the GPU deserializes and
executes them and compares each with a normally built plan of the same engine config (bitwise equal:
the same cuDNN engine and knobs on the same inputs).

Run on the H200: ``pytest -q tests/engines/cudnn_backend/test_deviceless_build_gpu.py -m gpu -s``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import cudnn_graph as cudnn

pytestmark = pytest.mark.gpu

GRAPHS = """
import math
import numpy as np
import cudnn_graph as cudnn
F = cudnn.data_type

def matmul(**kw):
    g = cudnn.pygraph(io_data_type=F.BFLOAT16, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      name="mm", **kw)
    a = g.tensor(name="a", dim=[1, 256, 128], stride=[256 * 128, 128, 1], uid=1)
    b = g.tensor(name="b", dim=[1, 128, 192], stride=[128 * 192, 192, 1], uid=2)
    g.matmul(a, b).set_output(True).set_name("c").set_uid(3).set_data_type(F.BFLOAT16)
    return g

def sdpa(**kw):
    b, h, s, d = 2, 4, 128, 64
    dense = [h * s * d, s * d, d, 1]
    g = cudnn.pygraph(io_data_type=F.BFLOAT16, intermediate_data_type=F.FLOAT, compute_data_type=F.FLOAT,
                      name="attn", **kw)
    q, k, v = (g.tensor(name=n, dim=[b, h, s, d], stride=dense, uid=i + 1) for i, n in enumerate("qkv"))
    o, _ = g.sdpa(q, k, v, generate_stats=False, attn_scale=1.0 / math.sqrt(d), use_causal_mask=True)
    o.set_output(True).set_name("o").set_uid(4)
    return g
"""

BUILD_WITHOUT_DEVICE = GRAPHS + """
import json, sys
from cudnn_graph import _driver
folder = sys.argv[1]
assert _driver.device_count() == 0, "this child must see no device"
props = cudnn.create_device_properties(open(folder + "/props.txt").read())
out = {"props": repr(props)}
for name, make in (("matmul", matmul), ("sdpa", sdpa)):
    g = make(device_property=props)
    g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    entry = g.selected_plan
    open(f"{folder}/{name}.plan", "wb").write(g.serialize(as_bytes=True))
    out[name] = {"engine": entry.engine.name, "engine_id": entry.engine_id,
                 "knobs": {int(k): int(v) for k, v in entry.knobs.items()}, "label": entry.label,
                 "declines": [list(d) for d in g.declines]}
print(json.dumps(out))
"""

RUN_WITH_DEVICE = GRAPHS + """
import json, sys
import cupy as cp
import ml_dtypes
folder, built = sys.argv[1], json.loads(sys.argv[2])
rng = np.random.default_rng(7)

def inputs(g):
    return {t.uid: rng.standard_normal(t.dim).astype(ml_dtypes.bfloat16) for t in g.tensors
            if t.producer is None and not t.is_pass_by_value}      # (the plan supplies attn_scale itself)

def slot(a):        # a CuPy array of bf16 bits, described with its real dtype
    return cudnn.Slot.from_address(a.data.ptr, a.shape, tuple(s // a.itemsize for s in a.strides), "bfloat16",
                                   ("cuda", 0))

def run(g, host_in):
    arrays = {uid: cp.asarray(x.view(np.uint16)) for uid, x in host_in.items()}
    arrays.update({t.uid: cp.zeros(t.dim, dtype=cp.uint16) for t in g.tensors
                   if t.producer is not None and not t.is_virtual})
    ws = cp.zeros(max(g.get_workspace_size(), 1), dtype=cp.uint8)
    g.execute({uid: slot(a) for uid, a in arrays.items()}, ws)
    cp.cuda.runtime.deviceSynchronize()
    return {uid: cp.asnumpy(arrays[uid]) for uid in arrays if uid not in host_in}

result = {}
for name, make in (("matmul", matmul), ("sdpa", sdpa)):
    loaded = cudnn.pygraph()
    loaded.deserialize(open(f"{folder}/{name}.plan", "rb").read())
    normal = make(device="cuda:0")
    normal.build_operation_graph()
    normal.create_execution_plan(built[name]["engine_id"], built[name]["knobs"])
    normal.build_plans()
    host_in = inputs(loaded)
    got, want = run(loaded, host_in), run(normal, host_in)
    result[name] = {"label": loaded.selected_plan.label, "normal_label": normal.selected_plan.label,
                    "bitwise": all(np.array_equal(got[u], want[u]) for u in want),
                    "max_abs": max(float(np.max(np.abs(got[u].view(ml_dtypes.bfloat16).astype(np.float32)
                                                      - want[u].view(ml_dtypes.bfloat16).astype(np.float32))))
                                   for u in want)}
print(json.dumps(result))
"""


def _child(code: str, args, env_update: dict) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.update(env_update)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, f"child failed:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_plans_built_without_the_device_execute_bitwise_as_normal_plans(tmp_path):
    from cudnn_graph import _loader
    from cudnn_graph._cudnn_errors import CudnnVersionError
    pytest.importorskip("cupy")
    try:
        props = cudnn.create_device_properties(0)
    except CudnnVersionError as exc:
        pytest.skip(str(exc))
    (tmp_path / "props.txt").write_text(props.serialize())
    print(f"\ncuDNN {_loader.backend_version()}; {props!r}")
    built = _child(BUILD_WITHOUT_DEVICE, [str(tmp_path)], {"CUDA_VISIBLE_DEVICES": ""})
    for name in ("matmul", "sdpa"):
        info = built[name]
        print(f"{name}: built without a device: {info['label']}; declined: {info['declines']}")
        assert info["engine"] == "cudnn_backend"
        assert all("device_property" in why for who, why in info["declines"] if who != "cudnn_backend")
    ran = _child(RUN_WITH_DEVICE, [str(tmp_path), json.dumps(built)], {})
    for name in ("matmul", "sdpa"):
        r = ran[name]
        print(f"{name}: loaded {r['label']}, normal {r['normal_label']}: bitwise {r['bitwise']}, "
              f"max |diff| {r['max_abs']}")
        assert r["label"] == r["normal_label"] == built[name]["label"]
        assert r["bitwise"], f"{name}: the deviceless plan's output differs from the normal plan's ({r})"


def test_properties_of_device_zero_survive_a_round_trip():
    from cudnn_graph._cudnn_errors import CudnnVersionError
    try:
        props = cudnn.create_device_properties(0)
    except CudnnVersionError as exc:
        pytest.skip(str(exc))
    again = cudnn.create_device_properties(props.serialize())
    assert again.cudnn_json == props.cudnn_json and again.differences(props) == {}
    from cudnn_graph.engines._device import compute_capability
    major, minor = compute_capability(0)
    assert props.arch == major * 10 + minor
    from cudnn_graph._cudnn_handle import thread_handle
    assert cudnn.create_device_properties(handle=thread_handle(0)).differences(props) == {}
