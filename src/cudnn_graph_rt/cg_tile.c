/* cuTile kernels (the blob's section 7, calling convention 2): a cuTile plan's cubins launched with no Python.
 *
 * Loading (cg_plan_load, the plan's device context current): each kernel's cubin with cuLibraryLoadData and
 * its entry with cuLibraryGetKernel, as the Python package's C path does (engines/cutile/_c_launch.py): a
 * CUlibrary is not bound to one context, and the CUkernel launches on the current context's copy, which the
 * driver makes at the first launch there. Each operand address is bound to the caller operand it names. A kernel
 * taking more than 48 KB of dynamic shared memory is opted in to it on the plan's device at load.
 *
 * A launch hands cuLaunchKernel one pointer per parameter (kernelParams), never one `extra` buffer: the cubin's
 * parameter bank is larger than the parameters and its tail is filled by the tile kernel's host-side hooks, which
 * read the parameters passed. Every parameter but the addresses points into the kernel's parameter image (extents
 * and strides written at serialize time, read-only in the loaded blob): that pointer array is made once at load,
 * and a launch copies it onto this thread's stack and points each address parameter at a stack cell holding the
 * call's operand or workspace address (the blob's check put every address on an 8-byte parameter of its own).
 * The floor's prebuilt buffers cost no per-call copy either: copying the whole image and patching it per call
 * put a three-kernel plan's execute above that floor (bench/c_api.py). Nothing is allocated and nothing
 * writable is shared, so threads executing one plan at once need no lock; cuLaunchKernel reads the parameters
 * before it returns, so the cells need not outlive the call. The loaded state is read-only after load, and the
 * driver's calls are thread-safe (the CuTe path's mutex guards the DSL runtime's module calls, which are not
 * documented as thread-safe; none of those are made here). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg_internal.h"

/* CUDA driver API enum values (CUdevice_attribute, CUfunction_attribute). */
#define CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN 97
#define CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8

struct cg_tile_kernel {
    const cg_dsl_kernel_t *kernel;     /* in the plan's blob (its records live as long as the plan) */
    void *library;                     /* CUlibrary */
    void *function;                    /* CUkernel (cuLaunchKernel takes it where a CUfunction goes) */
    int operand[CG_TILE_MAX_ADDRESSES];    /* per address: the caller operand's index; -1: the workspace */
    uint16_t address_parameter[CG_TILE_MAX_ADDRESSES];  /* per address: the parameter it is */
    const void *params[CG_TILE_MAX_PARAMETERS];        /* per parameter: its bytes in the image */
};

static const cg_libs_t *tile_driver(uint32_t index) {
    const cg_libs_t *libs = cg_cuda();        /* loaded: the plan's load needed it */
    if (libs && (!libs->cuLibraryLoadData || !libs->cuLibraryGetKernel || !libs->cuLibraryUnload ||
                 !libs->cuLaunchKernel)) {
        cg_fail(CG_STATUS_LIBRARY_NOT_FOUND, "DSL launch kernel %u: libcuda lacks cuLibraryLoadData, "
                "cuLibraryGetKernel, cuLibraryUnload or cuLaunchKernel (CUDA 12.0 and newer drivers have them), "
                "which a cuTile plan's kernels need", index);
        return NULL;
    }
    return libs;
}

/* A kernel asking for more dynamic shared memory than a launch gets by default opts in to it on `device`. */
static cg_status_t allow_shared(const cg_libs_t *libs, const cg_tile_kernel_t *tk, uint32_t index, int device) {
    uint32_t bytes = tk->kernel->tile.shared_bytes;
    if (bytes <= CG_SHARED_BYTES_WITHOUT_OPT_IN) return CG_STATUS_SUCCESS;
    if (!libs->cuKernelSetAttribute)
        return cg_fail(CG_STATUS_LIBRARY_NOT_FOUND, "DSL launch kernel %u takes %u bytes of dynamic shared memory and "
                       "libcuda lacks cuKernelSetAttribute (CUDA 12.0), which a kernel past 48 KB needs", index, bytes);
    int ordinal = 0, limit = 0;
    int status = libs->cuDeviceGet(&ordinal, device);
    if (status == 0)
        status = libs->cuDeviceGetAttribute(&limit, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, ordinal);
    if (status != 0)
        return cg_fail(CG_STATUS_CUDA_ERROR, "device %d: its shared memory limit: CUDA error %d", device, status);
    if (bytes > (uint32_t)limit)
        return cg_fail(CG_STATUS_NOT_SUPPORTED, "DSL launch kernel %u takes %u bytes of dynamic shared memory; device "
                       "%d allows at most %d a block", index, bytes, device, limit);
    status = libs->cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)bytes, tk->function,
                                        ordinal);
    if (status != 0)
        return cg_fail(CG_STATUS_CUDA_ERROR, "DSL launch kernel %u: its %u bytes of dynamic shared memory were refused "
                       "(cuKernelSetAttribute: CUDA error %d)", index, bytes, status);
    return CG_STATUS_SUCCESS;
}

cg_status_t cg_tile_open(const cg_dsl_kernel_t *k, uint32_t index, const cg_tensor_info_t *operands, int n_operands,
                         int device, cg_tile_kernel_t **out) {
    *out = NULL;
    const cg_tile_params_t *t = &k->tile;
    if (k->code_size < 4 || memcmp(k->code, "\177ELF", 4) != 0)
        return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: DSL launch kernel %u: its code is not a cubin (no ELF header; "
                       "corrupt; field DSL launch)", index);
    cg_tile_kernel_t *tk = calloc(1, sizeof *tk);
    if (!tk) return cg_fail(CG_STATUS_OUT_OF_MEMORY, "cg_plan_load: no memory for a cuTile kernel");
    tk->kernel = k;
    for (uint16_t i = 0; i < t->n_parameters; i++) tk->params[i] = t->image + t->parameters[i];
    for (uint16_t i = 0; i < t->n_addresses; i++) {
        const cg_tile_address_t *a = &t->addresses[i];
        for (uint16_t j = 0; j < t->n_parameters; j++)       /* one there is: the blob's check_tile saw to it */
            if (t->parameters[j] == a->offset) tk->address_parameter[i] = j;
        tk->operand[i] = -1;
        if (a->source != CG_TILE_ADDRESS_OPERAND) continue;
        for (int j = 0; j < n_operands && tk->operand[i] < 0; j++)
            if (operands[j].uid == a->uid) tk->operand[i] = j;
        if (tk->operand[i] < 0) {
            free(tk);
            return cg_fail(CG_STATUS_NOT_SUPPORTED, "DSL launch kernel %u: address %u ('%s') is uid %lld, which the "
                           "plan binds itself; this runtime gives a cuTile kernel the caller's operands only", index, i,
                           a->name, (long long)a->uid);
        }
    }
    const cg_libs_t *libs = tile_driver(index);
    if (!libs) {
        free(tk);
        return CG_STATUS_LIBRARY_NOT_FOUND;
    }
    int status = libs->cuLibraryLoadData(&tk->library, k->code, NULL, NULL, 0, NULL, NULL, 0);
    if (status != 0) {
        free(tk);
        return cg_fail(CG_STATUS_CUDA_ERROR, "DSL launch kernel %u: its %zu-byte cubin did not load "
                       "(cuLibraryLoadData: CUDA error %d; a cubin for another architecture, or a driver older than "
                       "the toolchain that compiled it)", index, k->code_size, status);
    }
    status = libs->cuLibraryGetKernel(&tk->function, tk->library, k->entry_symbol);
    if (status != 0) {
        libs->cuLibraryUnload(tk->library);
        free(tk);
        return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: DSL launch kernel %u: its cubin has no kernel %s "
                       "(cuLibraryGetKernel: CUDA error %d; corrupt; field DSL launch)", index, k->entry_symbol,
                       status);
    }
    cg_status_t allowed = allow_shared(libs, tk, index, device);
    if (allowed != CG_STATUS_SUCCESS) {
        libs->cuLibraryUnload(tk->library);
        free(tk);
        return allowed;
    }
    *out = tk;
    return CG_STATUS_SUCCESS;
}

cg_status_t cg_tile_check(const cg_tile_kernel_t *tk, int index, void *workspace) {
    const cg_tile_params_t *t = &tk->kernel->tile;
    for (uint16_t i = 0; i < t->n_addresses; i++) {
        const cg_tile_address_t *a = &t->addresses[i];
        uintptr_t address = (uintptr_t)workspace + (uintptr_t)a->add;
        if (tk->operand[i] < 0 && a->alignment && (address & (a->alignment - 1)) != 0)
            return cg_fail(CG_STATUS_MISALIGNED, "cg_execute: the workspace at %p: kernel %d's address %u (workspace + "
                           "%lld) is not %u-byte aligned, which the cuTile kernel was compiled to assume", workspace,
                           index, i, (long long)a->add, a->alignment);
    }
    return CG_STATUS_SUCCESS;
}

cg_status_t cg_tile_launch(const cg_tile_kernel_t *tk, int index, void *stream, void *const *pointers,
                           const int *position, void *workspace) {
    const cg_dsl_kernel_t *k = tk->kernel;
    const cg_tile_params_t *t = &k->tile;
    const cg_libs_t *libs = cg_cuda();         /* loaded, with the launch entry: cg_tile_open checked */
    void *params[CG_TILE_MAX_PARAMETERS];
    uint64_t cells[CG_TILE_MAX_ADDRESSES];
    memcpy(params, tk->params, (size_t)t->n_parameters * sizeof *params);
    for (uint16_t i = 0; i < t->n_addresses; i++) {
        int op = tk->operand[i];
        cells[i] = op >= 0 ? (uint64_t)(uintptr_t)pointers[position[op]]
                           : (uint64_t)((uintptr_t)workspace + (uintptr_t)t->addresses[i].add);
        params[tk->address_parameter[i]] = &cells[i];
    }
    int status = libs->cuLaunchKernel(tk->function, t->grid[0], t->grid[1], t->grid[2], t->block[0], t->block[1],
                                      t->block[2], t->shared_bytes, stream, params, NULL);
    if (status != 0)
        return cg_fail(CG_STATUS_CUDA_ERROR, "cg_execute: the cuTile kernel launch failed (kernel %d, %s): CUDA error "
                       "%d", index, k->entry_symbol, status);
    return CG_STATUS_SUCCESS;
}

void cg_tile_close(cg_tile_kernel_t *tk) {
    if (!tk) return;
    const cg_libs_t *libs = cg_cuda();
    if (tk->library && libs && libs->cuLibraryUnload) libs->cuLibraryUnload(tk->library);
    free(tk);
}
