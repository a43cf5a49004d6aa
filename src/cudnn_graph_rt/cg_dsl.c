/* DSL kernels (the blob's section 7): a CuTe plan's compiled kernel, launched with no Python (a cuTile plan's
 * kernels, calling convention 2, are cg_tile.c's; this file walks the section and hands them over).
 *
 * A CuTe kernel is a shared object linked from the DSL's ahead-of-time export; its only outside references
 * are the CUDA shims of the DSL runtime library (libcute_dsl_runtime.so, shipped in the nvidia-cutlass-dsl
 * wheels, needing no Python). Loading: that library RTLD_GLOBAL once per process, the kernel's bytes
 * written to an anonymous file (memfd) and dlopen'ed from /proc/self/fd, its module initialised and loaded
 * on the plan's device (under a mutex: the DSL's module calls are not documented as thread-safe). A launch
 * is one call of the exported entry with its argument cells on the C stack (the convention of
 * engines/cute/_shared_launch.py).
 *
 * The runtime library is found as: one this process has loaded already, $CUDNN_GRAPH_CUTE_RUNTIME (its path
 * or its folder), the path recorded in the blob when the plan was serialized. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cg_internal.h"

#define CG_ENV_CUTE_RUNTIME "CUDNN_GRAPH_CUTE_RUNTIME"
#define CG_CUTE_RUNTIME_NAME "libcute_dsl_runtime.so"
#define CG_DSL_MAX_SLOTS 8             /* the most slots of one kind a known convention has */
#define CG_DSL_MAX_ARGS (3 * CG_DSL_MAX_SLOTS + 2)

typedef int32_t (*packed_entry_t)(void **args, int32_t num_args);
typedef void (*module_call_t)(void **args);
typedef const char *(*error_name_t)(int32_t);

static pthread_mutex_t dsl_lock = PTHREAD_MUTEX_INITIALIZER;    /* the runtime library and module loads */
static void *runtime_handle;
static error_name_t runtime_error_name;                          /* optional: a CUDA error's name */

typedef struct {
    const cg_dsl_kernel_t *kernel;     /* in the plan's blob (its records live as long as the plan) */
    cg_tile_kernel_t *tile;            /* a cuTile kernel (convention 2): the rest is unused */
    void *library;                     /* the kernel's shared object (dlopen handle) */
    packed_entry_t entry;
    void *module;                      /* the kernel's module, as its init wrote it */
    void **module_cell;                /* what init and load_to_device are given: &module */
    int pointer_operand[CG_DSL_MAX_SLOTS];   /* a caller operand's index; -1: the placeholder */
    int scalar_operand[CG_DSL_MAX_SLOTS];    /* a caller operand's index; -1: scalar_host or the fixed value */
    const void *scalar_host[CG_DSL_MAX_SLOTS];
    int32_t ints[CG_DSL_MAX_SLOTS];
} loaded_kernel_t;

struct cg_dsl {
    int n_kernels;
    loaded_kernel_t *kernels;
};

/* ---- the runtime library ---------------------------------------------------------------------- */

/* Append to the list of places tried (cut at its capacity: it is a message). */
static void append(char *out, size_t capacity, const char *format, ...) __attribute__((format(printf, 3, 4)));
static void append(char *out, size_t capacity, const char *format, ...) {
    size_t used = strlen(out);
    if (used + 2 >= capacity) return;
    va_list args;
    va_start(args, format);
    vsnprintf(out + used, capacity - used, format, args);
    va_end(args);
}

static void *open_runtime(const char *path, const char *place, char *tried, size_t capacity) {
    void *handle = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!handle) {
        const char *why = dlerror();
        append(tried, capacity, "%s: %s; ", place, why ? why : "dlopen failed");
    }
    return handle;
}

/* The DSL runtime library, loaded once per process (RTLD_GLOBAL: each kernel resolves its shims there). A
 * failure is not remembered: a caller may set the variable and load again. dsl_lock is held. */
static cg_status_t load_runtime(const char *hint) {
    if (runtime_handle) return CG_STATUS_SUCCESS;
    char tried[1800] = "";
    void *handle = dlopen(CG_CUTE_RUNTIME_NAME, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);   /* one mapped already */
    const char *env = getenv(CG_ENV_CUTE_RUNTIME);
    if (!handle && env && env[0]) {
        char path[4096], place[4200];
        struct stat info;
        if (stat(env, &info) == 0 && S_ISDIR(info.st_mode)) snprintf(path, sizeof path, "%s/%s", env, CG_CUTE_RUNTIME_NAME);
        else snprintf(path, sizeof path, "%s", env);
        snprintf(place, sizeof place, "$%s=%s", CG_ENV_CUTE_RUNTIME, env);
        handle = open_runtime(path, place, tried, sizeof tried);
    } else if (!handle) {
        append(tried, sizeof tried, "$%s: %s; ", CG_ENV_CUTE_RUNTIME, "not set");
    }
    if (!handle && hint && hint[0]) {
        char place[4200];
        snprintf(place, sizeof place, "the path recorded at serialize time (%s)", hint);
        handle = open_runtime(hint, place, tried, sizeof tried);
    } else if (!handle) {
        append(tried, sizeof tried, "the blob records no path");
    }
    if (!handle)
        return cg_fail(CG_STATUS_LIBRARY_NOT_FOUND, "the CuTe DSL runtime library (%s, in the nvidia-cutlass-dsl "
                       "wheels under <site-packages>/nvidia_cutlass_dsl/cu*/lib/; it needs no Python) did not load: "
                       "set $%s to its path or its folder. Tried: %s", CG_CUTE_RUNTIME_NAME, CG_ENV_CUTE_RUNTIME,
                       tried);
    runtime_error_name = (error_name_t)dlsym(handle, "cuda_dialect_get_error_name");
    runtime_handle = handle;     /* kept for the life of the process, as the kernels need it */
    return CG_STATUS_SUCCESS;
}

static const char *error_name(int32_t code) {
    const char *name = runtime_error_name ? runtime_error_name(code) : NULL;
    return name ? name : "?";
}

/* ---- a kernel's shared object ----------------------------------------------------------------- */

static int write_all(int fd, const uint8_t *data, size_t size) {
    while (size) {
        ssize_t n = write(fd, data, size);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return 0;
        data += n;
        size -= (size_t)n;
    }
    return 1;
}

/* dlopen the kernel's bytes: an anonymous file read through /proc/self/fd/N, else a temporary file unlinked
 * at once. The loader knows a library by its path: where an earlier kernel's library was loaded from the same
 * /proc/self/fd/N (its descriptor closed since, N reused), dlopen would hand that one back, so the temporary
 * file is used instead. */
static cg_status_t open_kernel(loaded_kernel_t *lk, uint32_t index) {
    const cg_dsl_kernel_t *k = lk->kernel;
    if (k->code_size < 4 || memcmp(k->code, "\177ELF", 4) != 0)
        return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: DSL launch kernel %u: its code is not a shared object (no "
                       "ELF header; corrupt; field DSL launch)", index);
    char path[4096];
    int temporary = 0;
    int fd = memfd_create("cudnn_graph_dsl_kernel", MFD_CLOEXEC);
    if (fd >= 0) {
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        void *stale = dlopen(path, RTLD_NOW | RTLD_NOLOAD);    /* a library the loader still knows by this name */
        if (stale) {
            dlclose(stale);
            close(fd);
            fd = -1;
        }
    }
    if (fd < 0) {
        const char *folder = getenv("TMPDIR");
        snprintf(path, sizeof path, "%s/cudnn_graph_dsl_kernel_XXXXXX", folder && folder[0] ? folder : "/tmp");
        fd = mkstemp(path);
        temporary = 1;
        if (fd < 0)
            return cg_fail(CG_STATUS_LIBRARY_NOT_FOUND, "DSL launch kernel %u: no anonymous file (memfd_create) and "
                           "no temporary file (%s: %s) to load its shared object from", index, path, strerror(errno));
    }
    int written = write_all(fd, k->code, k->code_size), error = errno;
    const char *why = NULL;
    if (written) {
        lk->library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!lk->library) why = dlerror();
    }
    if (temporary) unlink(path);
    close(fd);                         /* the library is mapped: the file is not needed */
    if (!written)
        return cg_fail(CG_STATUS_LIBRARY_NOT_FOUND, "DSL launch kernel %u: writing its %zu-byte shared object "
                       "failed: %s", index, k->code_size, strerror(error));
    if (!lk->library) {
        return cg_fail(CG_STATUS_LIBRARY_NOT_FOUND, "DSL launch kernel %u: its shared object did not load (%s); a "
                       "CuTe DSL runtime library of another version than the one it was built with lacks what it "
                       "needs", index, why ? why : "dlopen failed");
    }
    return CG_STATUS_SUCCESS;
}

/* Resolve the entry and the module functions; initialise the module and load it on `device` (its
 * primary context is current). dsl_lock is held. */
static cg_status_t load_module(loaded_kernel_t *lk, uint32_t index, int device) {
    const cg_dsl_kernel_t *k = lk->kernel;
    char name[CG_DSL_MAX_SYMBOL + 64];
    lk->entry = (packed_entry_t)dlsym(lk->library, k->entry_symbol);
    snprintf(name, sizeof name, "_mlir_%s_cuda_init", k->function_prefix);
    module_call_t init = (module_call_t)dlsym(lk->library, name);
    snprintf(name, sizeof name, "_mlir_%s_cuda_load_to_device", k->function_prefix);
    module_call_t load_to_device = (module_call_t)dlsym(lk->library, name);
    if (!lk->entry || !init || !load_to_device)
        return cg_fail(CG_STATUS_LIBRARY_NOT_FOUND, "DSL launch kernel %u: its shared object lacks %s (entry %s, "
                       "function prefix %s)", index, !lk->entry ? "its entry" : (!init ? "_mlir_<prefix>_cuda_init"
                       : "_mlir_<prefix>_cuda_load_to_device"), k->entry_symbol, k->function_prefix);
    lk->module_cell = &lk->module;
    int32_t result = 0, ordinal = device;
    void *init_args[] = {&lk->module_cell, &result};
    init(init_args);
    if (result != 0)
        return cg_fail(CG_STATUS_CUDA_ERROR, "DSL launch kernel %u: its module did not initialise: CUDA error %d "
                       "(%s)", index, result, error_name(result));
    void *load_args[] = {&lk->module_cell, &ordinal, &result};
    load_to_device(load_args);
    if (result != 0)
        return cg_fail(CG_STATUS_CUDA_ERROR, "DSL launch kernel %u: it did not load on device %d: CUDA error %d (%s)",
                       index, device, result, error_name(result));
    return CG_STATUS_SUCCESS;
}

/* ---- binding the slots ------------------------------------------------------------------------ */

static int operand_of(const cg_tensor_info_t *operands, int n, int64_t uid) {
    for (int i = 0; i < n; i++)
        if (operands[i].uid == uid) return i;
    return -1;
}

static cg_status_t bind_slots(loaded_kernel_t *lk, uint32_t index, const cg_blob_t *blob,
                              const cg_tensor_info_t *operands, int n_operands) {
    const cg_dsl_kernel_t *k = lk->kernel;
    if (k->n_pointers > CG_DSL_MAX_SLOTS || k->n_scalars > CG_DSL_MAX_SLOTS || k->n_ints > CG_DSL_MAX_SLOTS)
        return cg_fail(CG_STATUS_NOT_SUPPORTED, "DSL launch kernel %u: more slots than this runtime holds", index);
    for (uint16_t i = 0; i < k->n_pointers; i++) {
        const cg_dsl_pointer_t *p = &k->pointers[i];
        lk->pointer_operand[i] = p->bound ? operand_of(operands, n_operands, p->uid) : -1;
        if (p->bound && lk->pointer_operand[i] < 0)
            return cg_fail(CG_STATUS_NOT_SUPPORTED, "DSL launch kernel %u: pointer slot %u ('%s') is uid %lld, which "
                           "the plan binds itself; this runtime gives a DSL kernel the caller's operands only", index,
                           i, p->name, (long long)p->uid);
    }
    for (uint16_t i = 0; i < k->n_scalars; i++) {
        const cg_dsl_scalar_t *s = &k->scalars[i];
        lk->scalar_operand[i] = -1;
        lk->scalar_host[i] = NULL;
        if (s->kind != CG_DSL_SCALAR_OPERAND) continue;
        lk->scalar_operand[i] = operand_of(operands, n_operands, s->uid);
        if (lk->scalar_operand[i] >= 0) continue;
        /* not a caller operand: a scalar whose value the graph fixed (section 6 holds it) */
        size_t need = s->read_type == 1 ? sizeof(double) : sizeof(float);
        for (uint32_t j = 0; j < blob->n_plan_operands && !lk->scalar_host[i]; j++) {
            const cg_plan_operand_t *op = &blob->plan_operands[j];
            if (op->uid == s->uid && op->kind == CG_OPERAND_HOST_CONSTANT && op->size >= need)
                lk->scalar_host[i] = op->data;
        }
        if (!lk->scalar_host[i])
            return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: DSL launch kernel %u: scalar slot %u reads uid %lld, which "
                           "is neither a caller operand nor a constant of at least %zu bytes the plan binds (corrupt; "
                           "field DSL launch)", index, i, (long long)s->uid, need);
    }
    for (uint16_t i = 0; i < k->n_ints; i++) lk->ints[i] = (int32_t)k->ints[i];    /* range checked at parse */
    return CG_STATUS_SUCCESS;
}

/* ---- open, execute, close --------------------------------------------------------------------- */

cg_status_t cg_dsl_open(const cg_blob_t *blob, const cg_tensor_info_t *operands, int n_operands, int device,
                        cg_dsl_t **out) {
    *out = NULL;
    cg_dsl_t *dsl = calloc(1, sizeof *dsl);
    if (dsl) dsl->kernels = calloc(blob->n_dsl_kernels ? blob->n_dsl_kernels : 1, sizeof *dsl->kernels);
    if (!dsl || !dsl->kernels) {
        free(dsl);
        return cg_fail(CG_STATUS_OUT_OF_MEMORY, "cg_plan_load: no memory for the plan's kernels");
    }
    cg_status_t result = CG_STATUS_SUCCESS;
    for (uint32_t i = 0; i < blob->n_dsl_kernels && result == CG_STATUS_SUCCESS; i++) {
        loaded_kernel_t *lk = &dsl->kernels[i];
        lk->kernel = &blob->dsl_kernels[i];
        dsl->n_kernels = (int)i + 1;
        if (lk->kernel->convention == CG_CONVENTION_CUTILE_PARAMS) {
            result = cg_tile_open(lk->kernel, i, operands, n_operands, device, &lk->tile);
            continue;
        }
        result = bind_slots(lk, i, blob, operands, n_operands);
        if (result != CG_STATUS_SUCCESS) break;
        pthread_mutex_lock(&dsl_lock);
        result = load_runtime(lk->kernel->runtime_hint);
        if (result == CG_STATUS_SUCCESS) result = open_kernel(lk, i);
        if (result == CG_STATUS_SUCCESS) result = load_module(lk, i, device);
        pthread_mutex_unlock(&dsl_lock);
    }
    if (result != CG_STATUS_SUCCESS) {
        cg_dsl_close(dsl);
        return result;
    }
    *out = dsl;
    return CG_STATUS_SUCCESS;
}

static float scalar_value(const loaded_kernel_t *lk, int i, void *const *pointers, const int *position) {
    const cg_dsl_scalar_t *s = &lk->kernel->scalars[i];
    if (s->kind == CG_DSL_SCALAR_FIXED) return (float)s->value;
    const void *at = lk->scalar_operand[i] >= 0 ? pointers[position[lk->scalar_operand[i]]] : lk->scalar_host[i];
    if (s->read_type == 1) {
        double v;
        memcpy(&v, at, sizeof v);
        return (float)v;
    }
    float v;
    memcpy(&v, at, sizeof v);
    return v;
}

/* CG_CONVENTION_CUTE_PACKED: entry(args, n), args the addresses of the pointer, f32, int32, stream and
 * result cells, all on this stack. */
static cg_status_t launch_packed(const loaded_kernel_t *lk, int index, void *stream, void *const *pointers,
                                 const int *position) {
    const cg_dsl_kernel_t *k = lk->kernel;
    void *cells[CG_DSL_MAX_SLOTS];
    float floats[CG_DSL_MAX_SLOTS];
    void *args[CG_DSL_MAX_ARGS];
    void *stream_cell = stream;
    int32_t result = 0;
    int n = 0;
    for (int i = 0; i < k->n_pointers; i++) {
        int op = lk->pointer_operand[i];
        cells[i] = op >= 0 ? pointers[position[op]] : (void *)(uintptr_t)k->placeholder;
        args[n++] = &cells[i];
    }
    for (int i = 0; i < k->n_scalars; i++) {
        floats[i] = scalar_value(lk, i, pointers, position);
        args[n++] = &floats[i];
    }
    for (int i = 0; i < k->n_ints; i++) args[n++] = (void *)&lk->ints[i];
    args[n++] = &stream_cell;
    args[n++] = &result;
    int32_t status = lk->entry(args, n);
    if (status != 0 || result != 0) {
        int32_t code = status ? status : result;
        return cg_fail(CG_STATUS_CUDA_ERROR, "cg_execute: the CuTe kernel launch failed (kernel %d, entry %s): CUDA "
                       "error %d (%s)", index, k->entry_symbol, code, error_name(code));
    }
    return CG_STATUS_SUCCESS;
}

cg_status_t cg_dsl_execute(const cg_dsl_t *dsl, void *stream, void *const *pointers, const int *position,
                           void *workspace) {
    /* Every check before the first launch, so a refused call launches nothing. */
    for (int i = 0; i < dsl->n_kernels; i++) {
        cg_status_t status = dsl->kernels[i].tile ? cg_tile_check(dsl->kernels[i].tile, i, workspace)
                                                  : CG_STATUS_SUCCESS;
        if (status != CG_STATUS_SUCCESS) return status;
    }
    for (int i = 0; i < dsl->n_kernels; i++) {
        const loaded_kernel_t *lk = &dsl->kernels[i];
        cg_status_t status;
        switch (lk->kernel->convention) {
        case CG_CONVENTION_CUTE_PACKED: status = launch_packed(lk, i, stream, pointers, position); break;
        case CG_CONVENTION_CUTILE_PARAMS:
            status = cg_tile_launch(lk->tile, i, stream, pointers, position, workspace);
            break;
        default:
            status = cg_fail(CG_STATUS_NOT_SUPPORTED, "cg_execute: kernel %d has calling convention %u", i,
                             lk->kernel->convention);
        }
        if (status != CG_STATUS_SUCCESS) return status;
    }
    return CG_STATUS_SUCCESS;
}

void cg_dsl_close(cg_dsl_t *dsl) {
    if (!dsl) return;
    for (int i = 0; i < dsl->n_kernels; i++) {
        loaded_kernel_t *lk = &dsl->kernels[i];
        cg_tile_close(lk->tile);
        /* The DSL exports no module unload: the module stays on the device and the library mapped (its code
         * may still be referenced by the runtime), only a library that never initialised is closed. */
        if (lk->library && !lk->module_cell) dlclose(lk->library);
    }
    free(dsl->kernels);
    free(dsl);
}
