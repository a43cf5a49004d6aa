"""Deviceless (ahead-of-time) builds on a stand-in libcudnn: device properties made, serialized and read back,
the descriptor calls a deviceless build issues (no handle anywhere, the device-property descriptor on the
heuristics query), Python engines declining, and every refusal (cuDNN < 9.8, malformed or foreign text,
another cuDNN version, a GPU whose properties differ, executing without the device)."""
from __future__ import annotations

import json
import struct

import pytest

import cudnn_graph as cudnn
from cudnn_graph.device_properties import DeviceProperties, IDENTITY_FIELDS, _differences
from cudnn_graph.errors import ArgumentTypeError, DevicePropertiesError, DevicePropertiesMismatchError

from test_cudnn_backend import RECORDING_LIBCUDNN, _read_log, run_python

# The recording stand-in, taught what a device-property descriptor does: a device id gives a canned H200-like
# JSON (FAKE_SMS SMs), the JSON attribute stores text that finalize checks is an object (cuDNN's
# "!json_object.IsObject()" refusal) and refuses where it holds REFUSE; cudnnCreate is logged; an operation
# graph has one engine (a plan loads from its recipe).
FAKE_JSON = ('{\\"maxGridSize\\":[2147483647,65535,65535],\\"multiProcessorCount\\":%d,\\"warpSize\\":32,'
             '\\"maxSharedMemoryPerBlockOptin\\":232448,\\"pciDeviceId\\":6,\\"l2CacheSize\\":62914560,'
             '\\"cudaDeviceId\\":%d,\\"deviceVer\\":900,\\"driverVer\\":13000,\\"deviceName\\":\\"NVIDIA H200\\"}')


def _deviceless_source() -> str:
    source = RECORDING_LIBCUDNN
    source = source.replace("typedef struct { int type; int64_t n; int64_t uids[64]; void *ptrs[64]; void *ws; } desc_t;",
                            "typedef struct { int type; int64_t n; int64_t uids[64]; void *ptrs[64]; void *ws; "
                            "char json[4096]; } desc_t;\n#ifndef FAKE_VERSION\n#define FAKE_VERSION 91900\n#endif\n"
                            "#ifndef FAKE_SMS\n#define FAKE_SMS 132\n#endif")
    source = source.replace("size_t cudnnGetVersion(void) { return 91900; }",
                            "size_t cudnnGetVersion(void) { return FAKE_VERSION; }")
    source = source.replace("int cudnnCreate(void **h) { *h = (void *)0x1000; return 0; }",
                            'int cudnnCreate(void **h) { *h = (void *)0x1000; emit("cudnn_create"); return 0; }')
    source = source.replace("int cudnnBackendFinalize(void *d) {",
                            "int cudnnBackendFinalize(void *d) { desc_t *y = d;\n"
                            "    if (y->type == 38 && (y->json[0] != '{' || strstr(y->json, \"REFUSE\"))) return 2000;\n")
    source = source.replace("    if (name == 1000) { x->n = n; memcpy(x->uids, e, n * 8); }",
                            "    if (name == 1000) { x->n = n; memcpy(x->uids, e, n * 8); }\n"
                            "    if (name == 2700) snprintf(x->json, sizeof x->json, \"" + FAKE_JSON + "\", FAKE_SMS, "
                            "*(const int *)e);\n"
                            "    if (name == 2701) snprintf(x->json, sizeof x->json, \"" + FAKE_JSON + "\", FAKE_SMS, 0);\n"
                            "    if (name == 2702 && n < 4096) { memcpy(x->json, e, n); x->json[n] = 0; }")
    source = source.replace("int cudnnBackendGetAttribute(void *d, int name, int type, long long r, long long *c, void *e) {",
                            "int cudnnBackendGetAttribute(void *d, int name, int type, long long r, long long *c, void *e) {\n"
                            "    if (name == 2702) { desc_t *x = d; long long n = strlen(x->json); if (c) *c = n;\n"
                            "        if (e) memcpy(e, x->json, r < n ? r : n); return 0; }\n"
                            "    if (name == 802 && e && r >= 1) { *(int64_t *)e = 1; if (c) *c = 1; return 0; }")
    assert source.count("FAKE_SMS") == 4 and "cudnn_create" in source and "return 2000" in source
    return source


@pytest.fixture(scope="module")
def deviceless_cudnn(tmp_path_factory):
    """make(version=91900, sms=132) -> env for a child process on the stand-in; each variant built once."""
    import subprocess
    from _helpers import c_compiler_or_skip
    cc = c_compiler_or_skip("a stand-in libcudnn")
    root = tmp_path_factory.mktemp("deviceless_cudnn")
    (root / "fake.c").write_text(_deviceless_source())
    built = {}

    def make(version=91900, sms=132, log="cudnn.log"):
        if (version, sms) not in built:
            lib = root / f"libcudnn_{version}_{sms}.so.9"
            subprocess.run([cc, "-shared", "-fPIC", "-O1", f"-DFAKE_VERSION={version}", f"-DFAKE_SMS={sms}",
                            str(root / "fake.c"), "-o", str(lib), "-lpthread"], check=True)
            built[(version, sms)] = lib
        return {"CUDNN_GRAPH_LIBCUDNN": str(built[(version, sms)]), "FAKE_CUDNN_LOG": str(root / log),
                "CUDA_VISIBLE_DEVICES": ""}, root / log

    return make


PROLOGUE = """
import json, struct
import cudnn_graph as cudnn
from cudnn_graph import _cudnn_names
F = cudnn.data_type

def relu_graph(props):
    g = cudnn.pygraph(io_data_type=F.HALF, compute_data_type=F.FLOAT, device_property=props)
    x = g.tensor(name="x", dim=[4, 8], stride=[8, 1], uid=1)
    g.relu(x).set_output(True).set_uid(2)
    g.build([cudnn.heur_mode.A])
    return g

def refused(call):
    try:
        call()
    except Exception as exc:
        return [type(exc).__name__, str(exc), getattr(exc, "field", None)]
    return None
"""


def test_deviceless_build_issues_no_handle_and_gives_heuristics_the_properties(deviceless_cudnn):
    env, log = deviceless_cudnn(log="build.log")
    out = run_python(PROLOGUE + """
text = cudnn.create_device_properties(0).serialize()
props = cudnn.create_device_properties(text)
g = relu_graph(props)
blob = g.serialize(as_bytes=True)
from cudnn_graph import plan_serialization, _plan_blob
unpacked = _plan_blob.unpack_blob(blob)
recipe = json.loads(unpacked.sections[_plan_blob.SECTION_PLAN])
print(json.dumps({"props_ptr": props.descriptor.ptr, "attrs": _cudnn_names.ATTRIBUTES,
                  "types": _cudnn_names.DESCRIPTOR_TYPES, "device": list(g.device),
                  "arch": unpacked.header.arch, "recipe_props": json.loads(recipe["device_properties"]),
                  "declines": [list(d) for d in g.declines], "selected": g.selected_plan.engine.name,
                  "text": json.loads(text)}))
""", env)
    attrs, types = out["attrs"], out["types"]
    records = _read_log(log)
    assert ["cudnn_create"] not in records                   # no handle made anywhere in the build
    sets = [(int(r[1]), int(r[2]), r[5] if len(r) > 5 else "") for r in records if r[0] == "set"]
    names = {v: k for k, v in attrs.items()}
    assert not [s for s in sets if names.get(s[1], "").endswith("_HANDLE")]
    # the properties are read from their JSON, then the heuristics query gets their descriptor
    prop_json = [s for s in sets if s[1] == attrs["CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION"]]
    assert prop_json and json.loads(bytes.fromhex(prop_json[0][2])) == json.loads(out["text"]["cudnn_json"])
    heur = [s for s in sets if s[1] == attrs["CUDNN_ATTR_ENGINEHEUR_DEVICEPROP"]]
    assert heur == [(types["CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR"], attrs["CUDNN_ATTR_ENGINEHEUR_DEVICEPROP"],
                     struct.pack("<Q", out["props_ptr"]).hex())]
    plan_sets = [names[s[1]] for s in sets if s[0] == types["CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR"]]
    assert plan_sets == ["CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG"]
    order = [names.get(s[1]) for s in sets]
    assert order.index("CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION") < order.index("CUDNN_ATTR_OPERATIONGRAPH_OPS") \
        < order.index("CUDNN_ATTR_ENGINEHEUR_DEVICEPROP") < order.index("CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG")
    # the graph is on the GPU it describes; the blob is for its architecture and records its properties
    assert out["device"] == ["cuda", 0] and out["arch"] == 90 and out["selected"] == "cudnn_backend"
    assert out["recipe_props"]["multiProcessorCount"] == 132
    assert out["text"]["cudnn_version"] == 91900
    # every Python engine present declined, saying why
    python_declines = [d for d in out["declines"] if d[0] != "cudnn_backend"]
    assert python_declines and all("device_property" in why for _, why in python_declines)


def test_properties_round_trip_and_argument_refusals(deviceless_cudnn):
    env, _ = deviceless_cudnn()
    out = run_python(PROLOGUE + """
props = cudnn.create_device_properties(0)
text = props.serialize()
again = cudnn.DeviceProperties.deserialize(props.serialize(as_bytes=True))
bare = cudnn.create_device_properties(props.cudnn_json)          # cuDNN's own JSON, as the frontend writes it
envelope = json.loads(text)
old = json.dumps(dict(envelope, cudnn_version=90900))
print(json.dumps({
    "same": again.cudnn_json == props.cudnn_json and bare.properties == props.properties,
    "arch": again.arch, "name": again.device_name, "repr": repr(again), "differences": again.differences(props),
    "handle": cudnn.create_device_properties(handle=0x1000).properties["multiProcessorCount"],
    "malformed": refused(lambda: cudnn.create_device_properties("{not json")),
    "array": refused(lambda: cudnn.create_device_properties("[1, 2]")),
    "not_utf8": refused(lambda: cudnn.create_device_properties(b"\\xff\\xfe")),
    "cudnn_refused": refused(lambda: cudnn.create_device_properties('{"REFUSE": 1}')),
    "old_cudnn": refused(lambda: cudnn.create_device_properties(old)),
    "corrupt": refused(lambda: cudnn.create_device_properties(json.dumps(dict(envelope, cudnn_json=3)))),
    "foreign": refused(lambda: cudnn.create_device_properties('{"format": "something/else"}')),
    "bad_id": refused(lambda: cudnn.create_device_properties(-1)),
    "bad_kind": refused(lambda: cudnn.create_device_properties(1.5)),
    "bad_handle": refused(lambda: cudnn.create_device_properties(handle="h")),
    "bad_keyword": refused(lambda: cudnn.pygraph(device_property=text)),
}))
""", env)
    assert out["same"] and out["arch"] == 90 and out["name"] == "NVIDIA H200" and out["differences"] == {}
    assert "sm_90" in out["repr"] and out["handle"] == 132
    for key in ("malformed", "array", "not_utf8", "cudnn_refused", "corrupt", "foreign"):
        assert out[key][0] == "DevicePropertiesError", (key, out[key])
    assert "malformed" in out["malformed"][1] and out["cudnn_refused"][2] == "json"
    assert out["old_cudnn"][0] == "DevicePropertiesError" and out["old_cudnn"][2] == "cudnn_version"
    assert "9.9.0" in out["old_cudnn"][1] and "9.19.0" in out["old_cudnn"][1]
    for key in ("bad_id", "bad_kind", "bad_handle", "bad_keyword"):
        assert out[key][0] == "InvalidArgumentTypeError", (key, out[key])
    assert "device_property" in out["bad_keyword"][1]


def test_cudnn_before_9_8_is_refused_naming_the_version(deviceless_cudnn):
    env, _ = deviceless_cudnn(version=90700)
    out = run_python(PROLOGUE + """
print(json.dumps({"make": refused(lambda: cudnn.create_device_properties(0)),
                  "read": refused(lambda: cudnn.create_device_properties('{"deviceVer": 900}'))}))
""", env)
    for key in ("make", "read"):
        assert out[key][0] == "CudnnVersionError" and "9.8.0" in out[key][1] and "9.7.0" in out[key][1]


def test_blob_loads_on_a_matching_gpu_and_is_refused_by_one_that_differs(deviceless_cudnn, tmp_path):
    env, _ = deviceless_cudnn()
    blob_path = tmp_path / "plan.bin"
    built = run_python(PROLOGUE + f"""
props = cudnn.create_device_properties(0)
fields = dict(props.properties)
other = dict(fields, cudaDeviceId=3, pciDeviceId=9, driverVer=13100)     # another card of the kind: runs
smaller = dict(fields, multiProcessorCount=114)                           # another kind of GPU: refused
for name, described in (("same", other), ("smaller", smaller)):
    g = relu_graph(cudnn.create_device_properties(json.dumps(described)))
    open({str(blob_path)!r} + "." + name, "wb").write(g.serialize(as_bytes=True))
no_device = refused(lambda: g.execute({{1: 0x10000, 2: 0x20000}}))
print(json.dumps({{"no_device": no_device}}))
""", env)
    assert built["no_device"][0] == "GraphStateError" and "deserialize()" in built["no_device"][1]
    # "the GPU machine": the stand-in's device 0 has 132 SMs
    gpu_env = dict(env, CUDA_VISIBLE_DEVICES="0")
    out = run_python(PROLOGUE + f"""
from cudnn_graph import plan_serialization
plan_serialization.device_arch = lambda device: 90        # the stand-in's GPU is an sm_90 (no driver here)
def load(name):
    h = cudnn.pygraph()
    h.deserialize(open({str(blob_path)!r} + "." + name, "rb").read())
    return h
h = load("same")
print(json.dumps({{"loaded": h.selected_plan.engine.name, "smaller": refused(lambda: load("smaller"))}}))
""", gpu_env)
    assert out["loaded"] == "cudnn_backend"
    assert out["smaller"][0] == "DevicePropertiesMismatchError" and "multiProcessorCount" in out["smaller"][1]
    assert "114" in out["smaller"][1] and "132" in out["smaller"][1]


def test_differences_leave_out_which_card_and_driver():
    built_for = {"deviceVer": 900, "multiProcessorCount": 132, "cudaDeviceId": 0, "pciDeviceId": 6, "driverVer": 1}
    here = dict(built_for, cudaDeviceId=2, pciDeviceId=7, driverVer=2)
    assert _differences(built_for, here) == {}
    assert _differences(built_for, dict(here, multiProcessorCount=114)) == {"multiProcessorCount": (132, 114)}
    assert _differences(built_for, {k: v for k, v in here.items() if k != "deviceVer"}) == {"deviceVer": (900, None)}
    assert IDENTITY_FIELDS == {"cudaDeviceId", "pciDeviceId", "driverVer"}
    err = DevicePropertiesMismatchError({"multiProcessorCount": (132, 114)}, "cuda:1")
    assert isinstance(err, cudnn.PlanVersionMismatchError) and err.field == "device properties"
    assert err.blob_value == {"multiProcessorCount": 132} and err.process_value == {"multiProcessorCount": 114}
    assert "cuda:1" in str(err) and "132" in str(err)


def test_device_property_keyword_takes_only_device_properties():
    with pytest.raises(ArgumentTypeError, match="device_property"):
        cudnn.pygraph(device_property=object())
    assert cudnn.pygraph(device="cpu").device_properties is None
    assert issubclass(DevicePropertiesError, ValueError) and DeviceProperties.serialize
