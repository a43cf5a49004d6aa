"""Blobs with a DSL launch section (docs/plan_format.md, section 7), one good CuTe-like plan, one good
cuTile-like plan (calling convention 2) and many malformed sections, shared by the Python reader's tests
(tests/plans/test_plan_launch.py) and the C runtime's (tests/c_runtime/test_c_dsl_launch.py,
test_c_tile_launch.py): both readers refuse the same sections, saying why.

The CuTe kernel is a stand-in (STANDIN_KERNEL): a shared object with the CuTe DSL export's init /
load-to-device / entry convention that logs what it is given to $FAKE_DSL_LOG, and whose only outside
reference is a symbol of the stand-in runtime library (STANDIN_RUNTIME), as a real kernel's are the DSL
runtime's CUDA shims. The cuTile kernels' cubin is a stand-in too (``standin_cubin``): an ELF magic and a
text table of each kernel's parameter sizes, which the stand-in libcuda's cuLibrary* / cuLaunchKernel
(STANDIN_TILE_DRIVER) read to log every launch's grid and the value of every parameter it was passed."""
from __future__ import annotations

import dataclasses
import json
import struct

from cudnn_graph import _plan_launch
from cudnn_graph._plan_blob import (OPERAND_HOST_CONSTANT, SECTION_DSL_LAUNCH, SECTION_GRAPH, SECTION_KERNELS,
                                    SECTION_PLAN, PlanHeader, PlanOperand, TensorRecord, pack_blob)
from cudnn_graph._plan_launch import (CONVENTION_CUTE_PACKED, CONVENTION_CUTILE_PARAMS, LaunchKernel, PointerSlot,
                                      ScalarSlot, TileAddress, TileParams)
from cudnn_graph.plan_serialization import library_version

FLOAT, DOUBLE, BF16 = 0, 1, 9
CUTE_ID = 20100
PREFIX = "cgtest"
ENTRY = "_mlir_cgtest__mlir_ciface_gemm"
PLACEHOLDER = 256
EXTENTS = (64, 32, 16, 1)
BETA = 0.25          # the graph's fixed value of 'beta' (uid 6)

STANDIN_KERNEL = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
int _cudaLaunchKernelEx(void);          /* the stand-in runtime's: resolves only if it is loaded RTLD_GLOBAL */
static void emit(const char *line) {
    const char *path = getenv("FAKE_DSL_LOG");
    FILE *f = path ? fopen(path, "a") : NULL;
    if (f) { fputs(line, f); fputc('\n', f); fclose(f); }
}
void _mlir_cgtest_cuda_init(void **args) {
    const char *fail = getenv("FAKE_DSL_INIT_FAIL");
    **(void ***)args[0] = (void *)0x1234;
    *(int32_t *)args[1] = fail ? atoi(fail) : 0;
    emit("init");
}
void _mlir_cgtest_cuda_load_to_device(void **args) {
    char b[96];
    snprintf(b, sizeof b, "load_to_device %d module=%p", *(int32_t *)args[1], **(void ***)args[0]);
    *(int32_t *)args[2] = 0;
    emit(b);
}
int32_t _mlir_cgtest__mlir_ciface_gemm(void **args, int32_t n) {
    char b[600];
    int k = snprintf(b, sizeof b, "entry n=%d ptrs", n);
    for (int i = 0; i < 6; i++) k += snprintf(b + k, sizeof b - k, " %p", *(void **)args[i]);
    k += snprintf(b + k, sizeof b - k, " floats");
    for (int i = 0; i < 3; i++) k += snprintf(b + k, sizeof b - k, " %.9g", *(float *)args[6 + i]);
    k += snprintf(b + k, sizeof b - k, " ints");
    for (int i = 0; i < 4; i++) k += snprintf(b + k, sizeof b - k, " %d", *(int32_t *)args[9 + i]);
    snprintf(b + k, sizeof b - k, " stream %p", *(void **)args[13]);
    const char *fail = getenv("FAKE_DSL_FAIL");
    *(int32_t *)args[14] = fail ? atoi(fail) : _cudaLaunchKernelEx();
    emit(b);
    return 0;
}
"""
# A kernel without the entry the blob names.
STANDIN_KERNEL_NO_ENTRY = STANDIN_KERNEL.replace("int32_t _mlir_cgtest__mlir_ciface_gemm(", "int32_t other_entry(")
STANDIN_RUNTIME = r"""
#include <stdint.h>
int _cudaLaunchKernelEx(void) { return 0; }
const char *cuda_dialect_get_error_name(int32_t code) { return code == 700 ? "cudaErrorIllegalAddress" : 0; }
"""

# a, b, c: the GEMM's operands; bias an epilogue tensor (the table asks no alignment: the slot's 2 bytes
# must reach the caller's queries and checks); alpha a scalar the caller passes; beta one the graph fixed.
TENSORS = [
    TensorRecord(1, "a", BF16, (1, 64, 16), (1024, 16, 1), False, False, 16),
    TensorRecord(2, "b", BF16, (1, 16, 32), (512, 32, 1), False, False, 16),
    TensorRecord(3, "c", BF16, (1, 64, 32), (2048, 32, 1), False, False, 16),
    TensorRecord(4, "bias", BF16, (1, 1, 32), (32, 32, 1), False, False, 0),
    TensorRecord(5, "alpha", FLOAT, (1, 1, 1), (1, 1, 1), False, True, 0),
    TensorRecord(6, "beta", DOUBLE, (1, 1, 1), (1, 1, 1), False, True, 0),
    TensorRecord(7, "t", BF16, (1, 64, 32), (2048, 32, 1), True, False, 0),
]
OPERANDS = [PlanOperand(OPERAND_HOST_CONSTANT, 6, DOUBLE, struct.pack("<d", BETA), graph_scalar=True)]
POINTERS = (PointerSlot(1, 16, "A"), PointerSlot(2, 16, "B"), PointerSlot(3, 16, "output"),
            PointerSlot(4, 2, "epilogue operand 0"), PointerSlot(), PointerSlot())
SCALARS = (ScalarSlot(5, FLOAT), ScalarSlot(6, DOUBLE), ScalarSlot())


def kernels_payload(shared_object: bytes) -> tuple:
    """(section 5's bytes, the shared object's offset in them): a record line, then the shared object, as
    engines/cute/_disk.plan_kernels lays it out (with no exported object)."""
    line = json.dumps({"format": 2, "object_size": 0, "shared_object_size": len(shared_object)}).encode()
    return line + b"\n" + shared_object, len(line) + 1


def kernel(shared_object: bytes, *, inline=False, hint="", **changes) -> LaunchKernel:
    payload, offset = kernels_payload(shared_object)
    fields = dict(convention=CONVENTION_CUTE_PACKED, pointers=POINTERS, scalars=SCALARS, ints=EXTENTS,
                  entry_symbol=ENTRY, function_prefix=PREFIX, runtime_hint=hint, placeholder=PLACEHOLDER)
    fields.update(code=shared_object) if inline else fields.update(code_offset=offset, code_size=len(shared_object))
    fields.update(changes)
    return LaunchKernel(**fields)


def recipe(engine="cute_gemm", engine_id=CUTE_ID) -> bytes:
    return json.dumps({"engine": engine, "engine_id": engine_id, "knobs": [], "name": "p", "source": "test"},
                      sort_keys=True, separators=(",", ":")).encode()


def launch_blob(shared_object: bytes, kernels=None, *, raw_section: bytes | None = None, format_version=None,
                tensors=TENSORS, operands=OPERANDS, with_kernels_section=True, engine="cute_gemm",
                engine_id=CUTE_ID, workspace_size=0) -> bytes:
    """A CuTe plan's blob whose section 7 is ``kernels`` (default: one kernel over the stand-in), or
    ``raw_section`` as its bytes (another engine's with ``engine`` / ``engine_id``)."""
    payload, _ = kernels_payload(shared_object)
    header = PlanHeader(library_version=library_version(), cudnn_version=0, arch=90, engine_family=3,
                        engine_id=engine_id, workspace_size=workspace_size, flags=1 if with_kernels_section else 0,
                        format_version=format_version)
    sections = {SECTION_GRAPH: b"{}", SECTION_PLAN: recipe(engine, engine_id)}
    if with_kernels_section:
        sections[SECTION_KERNELS] = payload
    if raw_section is not None:
        sections[SECTION_DSL_LAUNCH] = raw_section
        header = dataclasses.replace(header, format_version=format_version or 3)
        return pack_blob(header, tensors, sections, operands)
    return pack_blob(header, tensors, sections, operands, kernels if kernels is not None else [kernel(shared_object)])


def _section(*kernels) -> bytes:
    """Section 7's bytes for ``kernels``, packed without the writer's own check (the malformed cases)."""
    check, _plan_launch.unpack_launch = _plan_launch.unpack_launch, lambda *a: ()
    try:
        return _plan_launch.pack_launch(list(kernels))
    finally:
        _plan_launch.unpack_launch = check


def malformed_blobs(shared_object: bytes) -> dict:
    """{case: (blob, words its refusal names)}: the ways a DSL launch section can be wrong."""
    good = kernel(shared_object)
    section = _section(good)
    head = 8
    symbol_at = head + 48 + 6 * 16 + sum(-(-len(p.name) // 8) * 8 for p in POINTERS) + 3 * 24 + 4 * 8

    def edited(at: int, data: bytes) -> bytes:
        return section[:at] + data + section[at + len(data):]

    def raw(data: bytes, **kw) -> bytes:
        return launch_blob(shared_object, raw_section=data, **kw)

    def one(**changes) -> bytes:
        return raw(_section(dataclasses.replace(good, **changes)))
    return {
        "no_kernels": (raw(struct.pack("<II", 0, 0)), ["0 kernels"]),
        "too_many_kernels": (raw(struct.pack("<II", 9, 0) + section[8:]), ["9 kernels", "format-3 blob"]),
        "too_many_kernels_v4": (raw(struct.pack("<II", 33, 0) + section[8:], format_version=4), ["33 kernels"]),
        "head_short": (raw(section[:4]), ["cut short"]),
        "kernel_cut_short": (raw(section[:head + 40]), ["cut short"]),
        "slots_cut_short": (raw(section[:symbol_at - 8]), ["cut short"]),
        "unknown_convention": (raw(edited(head, struct.pack("<H", 9))), ["convention 9"]),
        "bad_flags": (raw(edited(head + 2, struct.pack("<H", 6))), ["flags 0x6"]),
        "wrong_slot_count": (one(ints=EXTENTS[:3]), ["3 int slots", "takes 6, 3 and 4"]),
        "symbol_not_an_identifier": (one(entry_symbol="gemm(void)"), ["entry symbol", "C identifier"]),
        "empty_prefix": (one(function_prefix=""), ["0-byte function prefix"]),
        "pointer_of_a_virtual": (one(pointers=(PointerSlot(7, 16, "A"),) + POINTERS[1:]),
                                 ["pointer slot 0", "uid 7", "no device operand"]),
        "pointer_of_a_scalar": (one(pointers=(PointerSlot(5, 16, "A"),) + POINTERS[1:]), ["uid 5"]),
        "pointer_alignment": (one(pointers=(PointerSlot(1, 12, "A"),) + POINTERS[1:]), ["12-byte", "power of two"]),
        "pointer_flags": (raw(edited(head + 48 + 12, struct.pack("<H", 2))), ["pointer slot 0", "flags 0x2"]),
        "scalar_of_a_tensor": (one(scalars=(ScalarSlot(1, FLOAT),) + SCALARS[1:]),
                               ["scalar slot 0", "uid 1", "no pass-by-value operand"]),
        "scalar_read_type": (one(scalars=(ScalarSlot(5, 2),) + SCALARS[1:]), ["data type 2"]),
        "scalar_not_finite": (one(scalars=SCALARS[:2] + (ScalarSlot(value=float("inf")),)), ["scalar slot 2"]),
        "int_past_int32": (one(ints=(2 ** 31,) + EXTENTS[1:]), ["int slot 0", "int32"]),
        "no_code": (one(code_size=0), ["no code"]),
        "code_past_the_kernels": (one(code_offset=len(shared_object)), ["kernels section"]),
        "code_without_a_kernels_section": (raw(section, with_kernels_section=False), ["kernels section", "0 bytes"]),
        "trailing_bytes": (raw(section + b"\0" * 8), ["8 bytes past"]),
        "in_a_format_2_blob": (raw(section, format_version=2), ["format-2 blob", "section 7"]),
    }


# ---- cuTile plans (calling convention 2) -------------------------------------------------------------

CUTILE_ID = 20200
TILE_WORKSPACE = 4096
# q, k: inputs; cu_seqlens; o: the output; t virtual and s a pass-by-value scalar (no kernel may address them)
TILE_TENSORS = [
    TensorRecord(1, "q", BF16, (64, 2, 64), (128, 64, 1), False, False, 16),
    TensorRecord(2, "k", BF16, (64, 2, 64), (128, 64, 1), False, False, 16),
    TensorRecord(3, "cu_seqlens", 3, (2,), (1,), False, False, 0),
    TensorRecord(4, "o", BF16, (64, 2, 64), (128, 64, 1), False, False, 0),
    TensorRecord(5, "t", FLOAT, (64, 2), (2, 1), True, False, 0),
    TensorRecord(6, "s", FLOAT, (1,), (1,), False, True, 0),
]


def _tile_arrays(arrays) -> tuple:
    """(image, parameters, addresses) of a kernel over ``arrays`` ``(source, shape, strides)`` (source: an
    operand uid, or ``("workspace", add)``), laid out as the cuTile ABI lays them out
    (engines/cutile/_abi.py: per array its 8-byte address, then its int32 extents and strides)."""
    image, parameters, addresses = bytearray(), [], []
    names = {t.uid: t.name for t in TILE_TENSORS}
    for source, shape, strides in arrays:
        image += b"\0" * (-len(image) % 8)
        parameters.append((len(image), 8))
        if isinstance(source, tuple):
            addresses.append(TileAddress(len(image), None, source[1], 16, "workspace"))
        else:
            addresses.append(TileAddress(len(image), source, 0, 16, names[source]))
        image += bytes(8)
        for value in (*shape, *strides):
            parameters.append((len(image), 4))
            image += struct.pack("<i", value)
    return bytes(image), tuple(parameters), tuple(addresses)


# Two launches, as a cuTile plan's: "prepare" reads q, cu_seqlens and writes a workspace region at +256;
# "output" reads k and the region and writes o.
TILE_KERNELS = (
    ("chunk_prepare_k", (4, 2, 1), [(1, (64, 2, 64), (128, 64, 1)), (("workspace", 256), (8, 16), (16, 1)),
                                    (3, (2,), (1,))]),
    ("chunk_output_k", (4, 2, 2), [(2, (64, 2, 64), (128, 64, 1)), (("workspace", 256), (8, 16), (16, 1)),
                                   (4, (64, 2, 64), (128, 64, 1))]),
)


def standin_cubin(kernels=TILE_KERNELS) -> bytes:
    """The stand-in cubin: an ELF magic, then per kernel a line ``<symbol> <size>,<size>,...`` (its
    parameters), then ``END``: what the stand-in driver's cuLibraryGetKernel and cuLaunchKernel read."""
    lines = [b"\x7fELF cudnn_graph test cubin"]
    for symbol, _, arrays in kernels:
        _, parameters, _ = _tile_arrays(arrays)
        lines.append(symbol.encode() + b" " + b",".join(str(size).encode() for _, size in parameters))
    return b"\n".join(lines + [b"END", b""])


def tile_kernel(index: int, cubin: bytes | None = None, **changes) -> LaunchKernel:
    """Launch ``index`` of TILE_KERNELS as a convention-2 record with ``cubin`` inline; ``changes`` replace
    TileParams fields (``grid``, ``parameters``, ...) or LaunchKernel fields."""
    symbol, grid, arrays = TILE_KERNELS[index]
    image, parameters, addresses = _tile_arrays(arrays)
    tile = TileParams(grid, image, parameters, addresses, TILE_WORKSPACE)
    tile_fields = {k: changes.pop(k) for k in list(changes) if k in TileParams.__dataclass_fields__}
    fields = dict(convention=CONVENTION_CUTILE_PARAMS, pointers=(), scalars=(), ints=(), entry_symbol=symbol,
                  function_prefix="", code=standin_cubin() if cubin is None else cubin,
                  tile=dataclasses.replace(tile, **tile_fields))
    fields.update(changes)
    return LaunchKernel(**fields)


def tile_blob(kernels=None, *, raw_section: bytes | None = None, format_version=None) -> bytes:
    """A cuTile plan's blob whose section 7 is ``kernels`` (default: both TILE_KERNELS over the stand-in
    cubin), or ``raw_section``; its cubins inline, no kernels section (as serialize() writes one)."""
    if raw_section is not None and format_version is None:
        format_version = 4
    return launch_blob(b"", [tile_kernel(0), tile_kernel(1)] if kernels is None else kernels,
                       raw_section=raw_section, format_version=format_version, tensors=TILE_TENSORS, operands=(),
                       with_kernels_section=False, engine="cutile_linear_attention", engine_id=CUTILE_ID,
                       workspace_size=TILE_WORKSPACE)


def malformed_tile_blobs(cubin: bytes | None = None) -> dict:
    """{case: (blob, words its refusal names)}: the ways a cuTile launch record can be wrong."""
    good = tile_kernel(0, cubin)
    tile = good.tile
    section = _section(good)
    tile_at = 8 + 48                       # the launch follows the head (no slots)
    addresses_at = tile_at + 48 + 8 * len(tile.parameters)
    image_at = addresses_at + sum(32 + -(-len(a.name) // 8) * 8 for a in tile.addresses)

    def edited(at: int, data: bytes) -> bytes:
        return section[:at] + data + section[at + len(data):]

    def raw(data: bytes, **kw) -> bytes:
        return tile_blob(raw_section=data, **kw)

    def one(**changes) -> bytes:
        return raw(_section(tile_kernel(0, cubin, **changes)))

    params = list(tile.parameters)
    addr = list(tile.addresses)
    return {
        "tile_in_a_format_3_blob": (raw(section, format_version=3), ["calling convention 2", "format-3 blob",
                                                                     "format version 4"]),
        "tile_cut_short": (raw(section[:tile_at + 40]), ["cut short", "launch"]),
        "tile_image_cut_short": (raw(section[:image_at + 8]), ["cut short", "parameter image"]),
        "tile_with_a_prefix": (one(function_prefix="p"), ["1-byte function prefix", "convention 2 has none"]),
        "tile_with_slots": (one(ints=(1,)), ["1 int slots", "takes 0, 0 and 0"]),
        "tile_grid_zero": (one(grid=(0, 2, 1)), ["grid (0, 2, 1)"]),
        "tile_grid_y_past_65535": (one(grid=(1, 65536, 1)), ["grid (1, 65536, 1)"]),
        "tile_block_too_large": (one(block=(2048, 1, 1)), ["block (2048, 1, 1)"]),
        "tile_image_too_large": (one(image=tile.image + bytes(5000)), ["-byte parameter image", "1 to 4096"]),
        "tile_no_parameters": (one(parameters=(), addresses=()), ["0 parameters"]),
        "tile_parameter_outside_the_image": (one(parameters=tuple(params[:-1] + [(len(tile.image) - 2, 4)])),
                                             ["parameter 14", "of the 72-byte image"]),
        "tile_parameters_overlap": (one(parameters=tuple(params[:1] + [(4, 4)] + params[2:])),
                                    ["parameter 1 is bytes 4..8"]),
        "tile_address_off_a_pointer": (one(addresses=(dataclasses.replace(addr[0], offset=8),) + tuple(addr[1:])),
                                       ["address 0 ('q')", "image offset 8", "no 8-byte parameter"]),
        "tile_address_past_the_image": (one(addresses=(dataclasses.replace(addr[0], offset=4096),) +
                                            tuple(addr[1:])), ["image offset 4096", "no 8-byte parameter"]),
        "tile_address_twice": (one(addresses=tuple(addr) + (dataclasses.replace(addr[0], name="again"),)),
                               ["address 3 ('again')", "again"]),
        "tile_address_alignment": (one(addresses=(dataclasses.replace(addr[0], alignment=12),) + tuple(addr[1:])),
                                   ["12-byte", "power of two"]),
        "tile_address_of_an_unknown_uid": (one(addresses=(dataclasses.replace(addr[0], uid=99),) + tuple(addr[1:])),
                                           ["address 0 ('q')", "uid 99", "no device operand"]),
        "tile_address_of_a_virtual": (one(addresses=(dataclasses.replace(addr[0], uid=5),) + tuple(addr[1:])),
                                      ["uid 5", "no device operand"]),
        "tile_address_of_a_scalar": (one(addresses=(dataclasses.replace(addr[0], uid=6),) + tuple(addr[1:])),
                                     ["uid 6", "no device operand"]),
        "tile_operand_plus_bytes": (one(addresses=(dataclasses.replace(addr[0], add=16),) + tuple(addr[1:])),
                                    ["adds 16 bytes", "uid 1"]),
        "tile_workspace_past_its_end": (one(addresses=addr[:1] + [dataclasses.replace(addr[1], add=TILE_WORKSPACE)]
                                            + addr[2:]), ["address 1 ('workspace')", "workspace + 4096",
                                                          "4096-byte workspace"]),
        "tile_address_source": (raw(edited(addresses_at + 24, struct.pack("<H", 3))), ["address 0 has source 3"]),
        "tile_reserved": (raw(edited(tile_at + 36, struct.pack("<I", 1))), ["-byte parameter image"]),
        "tile_no_cubin": (one(code=b""), ["no code"]),
    }


# The stand-in libcuda's cuTile calls (appended to tests/c_runtime's stand-in driver; its emit() logs to
# $FAKE_CUDNN_LOG). A library copies the stand-in cubin's table; a kernel is one of its lines; a launch logs
# its grid, block, shared bytes, stream, extra and each parameter's value read at the size the table gives.
# -DNO_TILE leaves them out (a driver older than CUDA 12.0).
STANDIN_TILE_DRIVER = r"""
#ifndef NO_TILE
typedef struct { char name[128]; int n; int sizes[256]; } fake_tile_kernel_t;
typedef struct { int n; fake_tile_kernel_t kernels[8]; } fake_tile_library_t;
int cuLibraryLoadData(void **library, const void *code, void *jit_options, void **jit_values, unsigned n_jit,
                      void *lib_options, void **lib_values, unsigned n_lib) {
    const char *fail = getenv("FAKE_LIBRARY_LOAD_FAIL"), *text = code;
    if (fail) return atoi(fail);
    if (memcmp(text, "\177ELF", 4) != 0 || n_jit || n_lib) return 200;      /* CUDA_ERROR_INVALID_IMAGE */
    fake_tile_library_t *lib = calloc(1, sizeof *lib);
    const char *line = strchr(text, '\n');
    while (line && strncmp(line + 1, "END\n", 4) != 0 && lib->n < 8) {
        fake_tile_kernel_t *k = &lib->kernels[lib->n++];
        const char *at = line + 1;
        sscanf(at, "%127s", k->name);
        at = strchr(at, ' ') + 1;
        while (k->n < 256 && *at >= '0' && *at <= '9') {
            k->sizes[k->n++] = (int)strtol(at, (char **)&at, 10);
            if (*at == ',') at++;
        }
        line = strchr(at, '\n');
    }
    *library = lib;
    char b[96]; snprintf(b, sizeof b, "library_load kernels=%d", lib->n); emit(b);
    return 0;
}
int cuLibraryGetKernel(void **kernel, void *library, const char *name) {
    fake_tile_library_t *lib = library;
    for (int i = 0; i < lib->n; i++)
        if (strcmp(lib->kernels[i].name, name) == 0) { *kernel = &lib->kernels[i]; return 0; }
    return 500;                                                             /* CUDA_ERROR_NOT_FOUND */
}
int cuLibraryUnload(void *library) { free(library); emit("library_unload"); return 0; }
int cuKernelSetAttribute(int attribute, int value, void *kernel, int device) {
    char b[200];
    snprintf(b, sizeof b, "kernel_attribute %s %d=%d", ((fake_tile_kernel_t *)kernel)->name, attribute, value);
    emit(b);
    return 0;
}
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void *stream, void **params, void **extra) {
    const char *fail = getenv("FAKE_TILE_LAUNCH_FAIL");
    if (fail) return atoi(fail);
    fake_tile_kernel_t *k = f;
    char b[4096];
    int n = snprintf(b, sizeof b, "tile_launch %s grid %u %u %u block %u %u %u shared %u stream %p extra %p params",
                     k->name, gx, gy, gz, bx, by, bz, shared, stream, (void *)extra);
    for (int i = 0; i < k->n && n < (int)sizeof b - 32; i++) {
        unsigned long long wide = 0; int narrow = 0;
        if (k->sizes[i] == 8) { memcpy(&wide, params[i], 8); n += snprintf(b + n, sizeof b - n, " 0x%llx", wide); }
        else { memcpy(&narrow, params[i], 4); n += snprintf(b + n, sizeof b - n, " %d", narrow); }
    }
    emit(b);
    return 0;
}
#endif
"""
