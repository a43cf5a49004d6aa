/* Plans: load (check the blob, rebuild cuDNN's execution plan from its serialized form, or load a DSL
 * plan's kernels (cg_dsl.c), prepare the operands the plan binds itself), query, execute (a variant pack
 * from the caller's uid / pointer arrays plus the plan's own operands, or the DSL kernels' launch), free;
 * and the per-thread state (a cuDNN handle per device, a small cache of finalized variant packs). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cg_internal.h"

#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
#define CG_PACK_CACHE 8          /* finalized variant packs kept per thread (round robin) */

/* An operand the plan binds itself at every execute (the blob's section 6, less withheld rows). */
typedef struct {
    int64_t uid;
    uint16_t kind;               /* CG_OPERAND_HOST_CONSTANT, _DEVICE_CONSTANT, _ALIAS or _SCRATCH */
    void *host;                  /* a host constant: its bytes (in blob.plan_operands) */
    unsigned long long device;   /* a device constant: its allocation (0: none yet) */
    int source;                  /* an alias: the operand index of the tensor it views */
    size_t offset;               /* an alias: bytes past its source; scratch: bytes past the workspace's start */
    size_t nbytes;               /* scratch */
    int zero;                    /* scratch: zero-filled on the stream before each execute */
} supplied_t;

struct cg_plan {
    uint64_t id;                 /* unique for the process: a freed plan's address may come back */
    int device;
    void *context;               /* the device's primary context (retained) */
    void *plan;                  /* cudnnBackendDescriptor_t, finalized (a cuDNN plan) */
    cg_dsl_t *dsl;               /* the loaded kernels (a DSL plan: the blob's section 7) */
    size_t workspace_size;       /* the engine's, then the scratch regions past it */
    size_t engine_workspace_size; /* the engine's own: cuDNN's, or a cuTile plan's kernels' scratch */
    cg_engine_family_t family;
    int64_t engine_id;
    int n_operands;
    cg_tensor_info_t *operands;  /* the non-virtual rows; names / dims point into blob.records */
    uint8_t *nonempty;           /* per operand: 1 when it has elements (a NULL pointer is then an error) */
    uint8_t *withheld;           /* per operand: 1 when no cuDNN operation reads it (kept out of the pack) */
    int n_withheld;
    int n_supplied;
    supplied_t *supplied;
    int zero_fills;              /* some scratch is zeroed per execute */
    cg_blob_t blob;
};

/* ---- per-thread state ---------------------------------------------------------------------- */

typedef struct {
    void *handle;                /* cudnnHandle_t for that device, made on first use */
    void *stream;                /* the stream last bound to it */
} thread_handle_t;

typedef struct {
    uint64_t plan_id;            /* 0: empty */
    void *workspace;
    int n;
    int64_t *uids;               /* n uids, then n pointers, one allocation */
    void **pointers;
    void *pack;                  /* finalized variant pack descriptor */
} pack_entry_t;

static __thread thread_handle_t thread_handles[CG_MAX_DEVICES];
static __thread pack_entry_t thread_packs[CG_PACK_CACHE];
static __thread int thread_pack_next;
static __thread int thread_registered;
static pthread_key_t thread_key;
static pthread_once_t thread_key_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t id_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t next_plan_id = 1;

static void drop_pack(const cg_libs_t *libs, pack_entry_t *entry) {
    if (entry->pack && libs) libs->cudnnBackendDestroyDescriptor(entry->pack);
    free(entry->uids);
    memset(entry, 0, sizeof *entry);
}

static void release_thread_state(void) {
    const cg_libs_t *libs = cg_libs();
    for (int i = 0; i < CG_PACK_CACHE; i++) drop_pack(libs, &thread_packs[i]);
    for (int d = 0; d < CG_MAX_DEVICES; d++) {
        if (thread_handles[d].handle && libs) libs->cudnnDestroy(thread_handles[d].handle);
        thread_handles[d].handle = NULL;
        thread_handles[d].stream = NULL;
    }
}

static void on_thread_exit(void *unused) {
    (void)unused;
    release_thread_state();      /* glibc runs key destructors while this thread's TLS still exists */
}

static void make_thread_key(void) { pthread_key_create(&thread_key, on_thread_exit); }

void cg_thread_release(void) {
    if (thread_registered) release_thread_state();
}

/* This thread's handle for `device` (the device's context is current). */
static cg_status_t thread_handle(const cg_libs_t *libs, int device, thread_handle_t **out) {
    thread_handle_t *h = &thread_handles[device];
    if (h->handle == NULL) {
        if (!thread_registered) {
            pthread_once(&thread_key_once, make_thread_key);
            pthread_setspecific(thread_key, (void *)1);     /* non-NULL: the destructor runs at exit */
            thread_registered = 1;
        }
        int status = libs->cudnnCreate(&h->handle);
        if (status != CUDNN_STATUS_SUCCESS) {
            h->handle = NULL;
            return cg_cudnn_failure(libs, status, "cudnnCreate");
        }
        h->stream = NULL;        /* a new handle runs on the legacy default stream */
    }
    *out = h;
    return CG_STATUS_SUCCESS;
}

/* Make the plan's device context current; *pushed says whether cg_leave must pop it. */
static cg_status_t enter_device(const cg_libs_t *libs, void *context, int *pushed) {
    void *current = NULL;
    *pushed = 0;
    if (libs->cuCtxGetCurrent(&current) == 0 && current == context) return CG_STATUS_SUCCESS;
    int status = libs->cuCtxPushCurrent(context);
    if (status != 0) return cg_fail(CG_STATUS_CUDA_ERROR, "cuCtxPushCurrent: CUDA error %d", status);
    *pushed = 1;
    return CG_STATUS_SUCCESS;
}

static void leave_device(const cg_libs_t *libs, int pushed) {
    void *popped;
    if (pushed) libs->cuCtxPopCurrent(&popped);
}

/* ---- load -------------------------------------------------------------------------------------- */

static cg_status_t refuse_engine(const cg_blob_t *blob) {
    char name[128];
    cg_blob_engine_name(blob, name, sizeof name);
    long long id = (long long)blob->engine_id;
    if (blob->engine_family == CG_ENGINE_PYTHON) {
        /* A DSL plan runs here when its blob says how to launch its kernels (section 7). */
        const char *what = id == CG_ENGINE_ID_REFERENCE
            ? "the reference engine's, which runs only in Python (NumPy on the host): execute it from Python, or "
              "build the graph where a cuDNN, CuTe or cuTile plan is selected"
            : (id >= CG_ENGINE_ID_CUTILE ? "a cuTile plan whose blob has no DSL launch section (section 7): serialize "
                                           "it with include_kernels=True where its kernels have a C launch path, or "
                                           "execute it from Python"
            : (id >= CG_ENGINE_ID_CUTE ? "a CuTe plan whose blob has no DSL launch section (section 7): serialize it "
                                         "with include_kernels=True where a C compiler links its kernel into a "
                                         "shared object, or execute it from Python"
                                       : "a Python engine's, which this runtime cannot run; execute it from Python"));
        return cg_fail(CG_STATUS_NOT_SUPPORTED, "the plan is engine '%s' (id %lld): %s", name, id, what);
    }
    return cg_fail(CG_STATUS_NOT_SUPPORTED, "the plan is engine '%s' (id %lld, engine family %u): this runtime "
                   "runs cuDNN plans (family 1) only", name, id, blob->engine_family);
}

static cg_status_t check_blob(const cg_blob_t *blob) {
    if (blob->library_version != CG_LIBRARY_VERSION)
        return cg_fail(CG_STATUS_VERSION_MISMATCH, "the plan blob was made by cudnn_graph %u.%u.%u, this runtime "
                       "is %u.%u.%u (field cudnn_graph version): serialize the plan again with this version",
                       blob->library_version / 10000, blob->library_version / 100 % 100, blob->library_version % 100,
                       CG_LIBRARY_VERSION / 10000, CG_LIBRARY_VERSION / 100 % 100, CG_LIBRARY_VERSION % 100);
    if (blob->engine_family == CG_ENGINE_PYTHON && blob->n_dsl_kernels > 0) return CG_STATUS_SUCCESS;
    if (blob->engine_family != CG_ENGINE_CUDNN) return refuse_engine(blob);
    if (!blob->cudnn_plan || blob->cudnn_plan_size == 0)
        return cg_fail(CG_STATUS_NOT_SUPPORTED, "the plan blob holds no cuDNN serialized execution plan (section "
                       "4): cuDNN could not serialize engine %lld, and rebuilding it from its engine id and knobs "
                       "needs the operation graph, which only the Python package lowers", (long long)blob->engine_id);
    return CG_STATUS_SUCCESS;
}

static cg_status_t check_device(const cg_libs_t *libs, const cg_blob_t *blob, int device) {
    int count = 0;
    int status = libs->cuDeviceGetCount(&count);
    if (status != 0) return cg_fail(CG_STATUS_CUDA_ERROR, "cuDeviceGetCount: CUDA error %d", status);
    if (device < 0 || device >= count || device >= CG_MAX_DEVICES)
        return cg_fail(CG_STATUS_INVALID_DEVICE, "device %d: this process sees %d CUDA device(s)", device, count);
    if (blob->cudnn_version && blob->cudnn_version / 100 != libs->cudnn_version / 100)
        return cg_fail(CG_STATUS_VERSION_MISMATCH, "the plan was built with cuDNN %u.%u, the loaded libcudnn is "
                       "%zu.%zu (field cuDNN version): cuDNN plans load only on the major.minor that built them",
                       blob->cudnn_version / 10000, blob->cudnn_version / 100 % 100, libs->cudnn_version / 10000,
                       libs->cudnn_version / 100 % 100);
    if (blob->arch) {
        int major = 0, minor = 0, ordinal = 0;
        status = libs->cuDeviceGet(&ordinal, device);
        if (status == 0) status = libs->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, ordinal);
        if (status == 0) status = libs->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, ordinal);
        if (status != 0) return cg_fail(CG_STATUS_CUDA_ERROR, "device %d: its compute capability: CUDA error %d",
                                        device, status);
        if ((uint32_t)(major * 10 + minor) != blob->arch)
            return cg_fail(CG_STATUS_VERSION_MISMATCH, "the plan was built for sm_%u, device %d is sm_%d%d (field "
                           "GPU architecture): build the graph again on this GPU", blob->arch, device, major, minor);
    }
    return CG_STATUS_SUCCESS;
}

static const cg_plan_operand_t *graph_scalar(const cg_blob_t *blob, int64_t uid) {
    for (uint32_t i = 0; i < blob->n_plan_operands; i++) {
        const cg_plan_operand_t *op = &blob->plan_operands[i];
        if (op->uid == uid && op->kind == CG_OPERAND_HOST_CONSTANT && (op->flags & CG_OPERAND_FLAG_GRAPH_SCALAR))
            return op;
    }
    return NULL;
}

static int operand_index(cg_plan_t plan, int64_t uid);

/* The caller's operands: the non-virtual rows but the scalars the graph fixed (the plan binds those). */
static cg_status_t make_operands(cg_plan_t plan) {
    const cg_blob_t *blob = &plan->blob;
    int n = 0;
    for (uint32_t i = 0; i < blob->n_records; i++)
        n += !blob->records[i].is_virtual && !graph_scalar(blob, blob->records[i].uid);
    plan->operands = calloc(n ? n : 1, sizeof *plan->operands);
    plan->nonempty = calloc(n ? n : 1, 1);
    plan->withheld = calloc(n ? n : 1, 1);
    if (!plan->operands || !plan->nonempty || !plan->withheld)
        return cg_fail(CG_STATUS_OUT_OF_MEMORY, "cg_plan_load: no memory");
    int k = 0;
    for (uint32_t i = 0; i < blob->n_records; i++) {
        const cg_record_t *r = &blob->records[i];
        if (r->is_virtual || graph_scalar(blob, r->uid)) continue;
        cg_tensor_info_t *t = &plan->operands[k];
        t->uid = r->uid;
        t->name = r->name;
        t->data_type = r->data_type;
        t->rank = (int32_t)r->rank;
        t->dims = r->dims;
        t->strides = r->strides;
        t->alignment = r->alignment;
        t->is_pass_by_value = r->is_pass_by_value;
        for (uint32_t j = 0; j < blob->n_dsl_kernels; j++) {     /* what a DSL kernel needs of it, too */
            const cg_dsl_kernel_t *kernel = &blob->dsl_kernels[j];
            for (uint16_t p = 0; p < kernel->n_pointers; p++) {
                const cg_dsl_pointer_t *slot = &kernel->pointers[p];
                if (slot->bound && slot->uid == r->uid && slot->alignment > t->alignment) t->alignment = slot->alignment;
            }
            for (uint16_t a = 0; a < kernel->tile.n_addresses; a++) {
                const cg_tile_address_t *address = &kernel->tile.addresses[a];
                if (address->source == CG_TILE_ADDRESS_OPERAND && address->uid == r->uid &&
                    address->alignment > t->alignment)
                    t->alignment = address->alignment;
            }
        }
        int has_elements = 1;
        for (uint32_t d = 0; d < r->rank; d++) has_elements &= r->dims[d] > 0;
        plan->nonempty[k] = (uint8_t)has_elements;
        k++;
    }
    plan->n_operands = n;
    return CG_STATUS_SUCCESS;
}

/* The operands the plan binds itself, from section 6 (checked against the tensor table at parse). */
static cg_status_t make_supplied(cg_plan_t plan) {
    const cg_blob_t *blob = &plan->blob;
    plan->supplied = calloc(blob->n_plan_operands ? blob->n_plan_operands : 1, sizeof *plan->supplied);
    if (!plan->supplied) return cg_fail(CG_STATUS_OUT_OF_MEMORY, "cg_plan_load: no memory");
    for (uint32_t i = 0; i < blob->n_plan_operands; i++) {
        const cg_plan_operand_t *op = &blob->plan_operands[i];
        if (op->kind == CG_OPERAND_WITHHELD) {
            int at = operand_index(plan, op->uid);
            if (at >= 0 && !plan->withheld[at]) {
                plan->withheld[at] = 1;
                plan->n_withheld++;
            }
            continue;
        }
        supplied_t *s = &plan->supplied[plan->n_supplied++];
        s->uid = op->uid;
        s->kind = op->kind;
        if (op->kind == CG_OPERAND_HOST_CONSTANT) s->host = op->data;
        if (op->kind == CG_OPERAND_ALIAS) {
            s->source = operand_index(plan, op->source_uid);
            s->offset = (size_t)op->byte_offset;
            if (s->source < 0)
                return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: uid %lld is a view of uid %lld, a scalar the plan "
                               "binds itself (corrupt; field plan operands)", (long long)op->uid,
                               (long long)op->source_uid);
        }
        if (op->kind == CG_OPERAND_SCRATCH) {
            s->nbytes = (size_t)op->nbytes;
            s->zero = (op->flags & CG_OPERAND_FLAG_ZERO_FILL) != 0;
            plan->zero_fills |= s->zero;
        }
    }
    return CG_STATUS_SUCCESS;
}

static size_t align_up(size_t n, size_t alignment) { return (n + alignment - 1) / alignment * alignment; }

/* Scratch regions past cuDNN's workspace (the rule PlanRunner follows: each at a multiple of 256), and
 * device constants copied once; the device's context is current. */
static cg_status_t place_supplied(const cg_libs_t *libs, cg_plan_t plan) {
    size_t offset = align_up(plan->engine_workspace_size, CG_SCRATCH_ALIGNMENT);
    int scratch = 0;
    for (int i = 0; i < plan->n_supplied; i++) {
        supplied_t *s = &plan->supplied[i];
        if (s->kind == CG_OPERAND_SCRATCH) {
            s->offset = offset;
            offset = align_up(offset + s->nbytes, CG_SCRATCH_ALIGNMENT);
            scratch = 1;
        }
        if (s->kind == CG_OPERAND_DEVICE_CONSTANT) {
            const cg_plan_operand_t *op = NULL;
            for (uint32_t j = 0; j < plan->blob.n_plan_operands && !op; j++)
                if (plan->blob.plan_operands[j].uid == s->uid) op = &plan->blob.plan_operands[j];
            if (!libs->cuMemAlloc || !libs->cuMemFree || !libs->cuMemcpyHtoD)
                return cg_fail(CG_STATUS_LIBRARY_NOT_FOUND, "libcuda lacks cuMemAlloc_v2, cuMemFree_v2 or "
                               "cuMemcpyHtoD_v2, which the plan's constant device tensor uid %lld needs",
                               (long long)s->uid);
            int status = libs->cuMemAlloc(&s->device, (size_t)op->nbytes);
            if (status != 0) {
                s->device = 0;
                return cg_fail(CG_STATUS_CUDA_ERROR, "cuMemAlloc_v2 (%lld bytes for the plan's constant device "
                               "tensor uid %lld): CUDA error %d", (long long)op->nbytes, (long long)s->uid, status);
            }
            status = libs->cuMemcpyHtoD(s->device, op->data, op->size);
            if (status != 0)
                return cg_fail(CG_STATUS_CUDA_ERROR, "cuMemcpyHtoD_v2 (the plan's constant device tensor uid %lld): "
                               "CUDA error %d", (long long)s->uid, status);
        }
    }
    if (plan->zero_fills && !libs->cuMemsetD8Async)
        return cg_fail(CG_STATUS_LIBRARY_NOT_FOUND, "libcuda lacks cuMemsetD8Async, which the plan's zeroed "
                       "scratch needs");
    plan->workspace_size = scratch ? offset : plan->engine_workspace_size;
    return CG_STATUS_SUCCESS;
}

static void free_supplied(const cg_libs_t *libs, cg_plan_t plan) {
    int pushed = 0, entered = 0;
    for (int i = 0; i < plan->n_supplied; i++) {
        if (!plan->supplied[i].device || !libs->cuMemFree) continue;
        if (!entered) entered = enter_device(libs, plan->context, &pushed) == CG_STATUS_SUCCESS;
        libs->cuMemFree(plan->supplied[i].device);
    }
    if (entered) leave_device(libs, pushed);
}

static cg_status_t finalize_plan(const cg_libs_t *libs, cg_plan_t plan) {
    int pushed;
    cg_status_t result = enter_device(libs, plan->context, &pushed);
    if (result != CG_STATUS_SUCCESS) return result;
    thread_handle_t *h;
    result = thread_handle(libs, plan->device, &h);
    if (result == CG_STATUS_SUCCESS) {
        int status = libs->cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan->plan);
        const char *what = "cudnnBackendCreateDescriptor(EXECUTION_PLAN)";
        if (status == CUDNN_STATUS_SUCCESS) {
            what = "set CUDNN_ATTR_EXECUTION_PLAN_HANDLE";
            status = libs->cudnnBackendSetAttribute(plan->plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE,
                                                    1, &h->handle);
        }
        if (status == CUDNN_STATUS_SUCCESS) {
            what = "set CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION (the blob's serialized plan)";
            status = libs->cudnnBackendSetAttribute(plan->plan, CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION,
                                                    CUDNN_TYPE_CHAR, (int64_t)plan->blob.cudnn_plan_size,
                                                    plan->blob.cudnn_plan);
        }
        if (status == CUDNN_STATUS_SUCCESS) {
            what = "finalize the execution plan";
            status = libs->cudnnBackendFinalize(plan->plan);
        }
        int64_t workspace = 0, got = 0;
        if (status == CUDNN_STATUS_SUCCESS) {
            what = "get CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE";
            status = libs->cudnnBackendGetAttribute(plan->plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                    CUDNN_TYPE_INT64, 1, &got, &workspace);
        }
        if (status != CUDNN_STATUS_SUCCESS) result = cg_cudnn_failure(libs, status, what);
        else plan->engine_workspace_size = workspace > 0 ? (size_t)workspace : 0;
    }
    if (result == CG_STATUS_SUCCESS) result = place_supplied(libs, plan);
    leave_device(libs, pushed);
    return result;
}

/* A DSL plan: its kernels loaded on the device, then its own operands placed past the kernels' workspace
 * (a cuTile plan's scratch; none for a CuTe plan), which takes the place of cuDNN's. */
static cg_status_t open_dsl(const cg_libs_t *libs, cg_plan_t plan) {
    int pushed;
    for (uint32_t i = 0; i < plan->blob.n_dsl_kernels; i++)
        if (plan->blob.dsl_kernels[i].tile.workspace_size > plan->engine_workspace_size)
            plan->engine_workspace_size = (size_t)plan->blob.dsl_kernels[i].tile.workspace_size;
    cg_status_t result = enter_device(libs, plan->context, &pushed);
    if (result != CG_STATUS_SUCCESS) return result;
    result = cg_dsl_open(&plan->blob, plan->operands, plan->n_operands, plan->device, &plan->dsl);
    if (result == CG_STATUS_SUCCESS) result = place_supplied(libs, plan);
    leave_device(libs, pushed);
    return result;
}

cg_status_t cg_plan_load(const void *blob, size_t size, int device, cg_plan_t *out) {
    if (out == NULL) return cg_fail(CG_STATUS_INVALID_ARGUMENT, "cg_plan_load: out is NULL");
    *out = NULL;
    if (blob == NULL && size != 0) return cg_fail(CG_STATUS_INVALID_ARGUMENT, "cg_plan_load: blob is NULL");
    cg_plan_t plan = calloc(1, sizeof *plan);
    uint8_t *copy = malloc(size ? size : 1);
    if (!plan || !copy) {
        free(plan);
        free(copy);
        return cg_fail(CG_STATUS_OUT_OF_MEMORY, "cg_plan_load: no memory for a %zu-byte blob", size);
    }
    if (size) memcpy(copy, blob, size);
    plan->device = device;
    cg_status_t result = cg_blob_parse(copy, size, &plan->blob);
    if (result == CG_STATUS_SUCCESS) result = check_blob(&plan->blob);
    const cg_libs_t *libs = NULL;
    int dsl = result == CG_STATUS_SUCCESS && plan->blob.n_dsl_kernels > 0;
    if (result == CG_STATUS_SUCCESS) {
        libs = dsl ? cg_cuda() : cg_libs();       /* a DSL plan needs the driver alone */
        if (libs == NULL) result = CG_STATUS_LIBRARY_NOT_FOUND;
    }
    if (result == CG_STATUS_SUCCESS) result = check_device(libs, &plan->blob, device);
    if (result == CG_STATUS_SUCCESS) {
        int ordinal = 0, status = libs->cuDeviceGet(&ordinal, device);
        if (status == 0) status = libs->cuDevicePrimaryCtxRetain(&plan->context, ordinal);
        if (status != 0) result = cg_fail(CG_STATUS_CUDA_ERROR, "device %d: its primary context: CUDA error %d",
                                          device, status);
    }
    if (result == CG_STATUS_SUCCESS) result = make_operands(plan);
    if (result == CG_STATUS_SUCCESS) result = make_supplied(plan);
    if (result == CG_STATUS_SUCCESS) result = dsl ? open_dsl(libs, plan) : finalize_plan(libs, plan);
    /* Only the records outlive the load; the section bytes were needed by finalize (or the kernels' load)
     * alone. */
    plan->blob.recipe = plan->blob.cudnn_plan = NULL;
    for (uint32_t i = 0; i < plan->blob.n_dsl_kernels; i++) plan->blob.dsl_kernels[i].code = NULL;
    free(copy);
    if (result != CG_STATUS_SUCCESS) {
        cg_plan_free(plan);
        return result;
    }
    plan->family = (cg_engine_family_t)plan->blob.engine_family;
    plan->engine_id = plan->blob.engine_id;
    pthread_mutex_lock(&id_lock);
    plan->id = next_plan_id++;
    pthread_mutex_unlock(&id_lock);
    *out = plan;
    return CG_STATUS_SUCCESS;
}

void cg_plan_free(cg_plan_t plan) {
    if (plan == NULL) return;
    const cg_libs_t *libs = plan->plan ? cg_libs() : (plan->context ? cg_cuda() : NULL);
    cg_dsl_close(plan->dsl);
    if (libs) {
        for (int i = 0; i < CG_PACK_CACHE; i++)
            if (plan->id && thread_packs[i].plan_id == plan->id) drop_pack(libs, &thread_packs[i]);
        if (plan->plan) libs->cudnnBackendDestroyDescriptor(plan->plan);
        if (plan->supplied && plan->context) free_supplied(libs, plan);
        if (plan->context && libs->cuDevicePrimaryCtxRelease) libs->cuDevicePrimaryCtxRelease(plan->device);
    }
    cg_blob_release(&plan->blob);
    free(plan->operands);
    free(plan->nonempty);
    free(plan->withheld);
    free(plan->supplied);
    free(plan);
}

/* ---- queries ----------------------------------------------------------------------------------- */

#define CHECK_QUERY(plan, out, what)                                                                     \
    do {                                                                                                 \
        if ((plan) == NULL) return cg_fail(CG_STATUS_INVALID_ARGUMENT, "%s: the plan is NULL", what);   \
        if ((out) == NULL) return cg_fail(CG_STATUS_INVALID_ARGUMENT, "%s: the result pointer is NULL", what); \
    } while (0)

cg_status_t cg_plan_tensor_count(cg_plan_t plan, int *count) {
    CHECK_QUERY(plan, count, "cg_plan_tensor_count");
    *count = plan->n_operands;
    return CG_STATUS_SUCCESS;
}

cg_status_t cg_plan_tensor(cg_plan_t plan, int index, cg_tensor_info_t *info) {
    CHECK_QUERY(plan, info, "cg_plan_tensor");
    if (index < 0 || index >= plan->n_operands)
        return cg_fail(CG_STATUS_INVALID_ARGUMENT, "cg_plan_tensor: index %d, the plan has %d operands", index,
                       plan->n_operands);
    *info = plan->operands[index];
    return CG_STATUS_SUCCESS;
}

static int operand_index(cg_plan_t plan, int64_t uid) {
    for (int i = 0; i < plan->n_operands; i++)
        if (plan->operands[i].uid == uid) return i;
    return -1;
}

cg_status_t cg_plan_tensor_index(cg_plan_t plan, int64_t uid, int *index) {
    CHECK_QUERY(plan, index, "cg_plan_tensor_index");
    *index = operand_index(plan, uid);
    if (*index < 0) return cg_fail(CG_STATUS_UNKNOWN_UID, "cg_plan_tensor_index: the plan has no operand uid %lld",
                                   (long long)uid);
    return CG_STATUS_SUCCESS;
}

/* The plain field queries: a checked plan and out pointer, then the field. */
#define PLAN_FIELD_GETTER(name, type, field)                                   \
    cg_status_t name(cg_plan_t plan, type *out) {                             \
        CHECK_QUERY(plan, out, #name);                                         \
        *out = plan->field;                                                    \
        return CG_STATUS_SUCCESS;                                              \
    }

PLAN_FIELD_GETTER(cg_plan_workspace_size, size_t, workspace_size)

PLAN_FIELD_GETTER(cg_plan_engine_family, cg_engine_family_t, family)

PLAN_FIELD_GETTER(cg_plan_engine_id, int64_t, engine_id)

PLAN_FIELD_GETTER(cg_plan_device, int, device)

/* ---- execute ----------------------------------------------------------------------------------- */

static const supplied_t *supplied_of(cg_plan_t plan, int64_t uid) {
    for (int i = 0; i < plan->n_supplied; i++)
        if (plan->supplied[i].uid == uid) return &plan->supplied[i];
    return NULL;
}

static const char *supplied_what(uint16_t kind) {
    switch (kind) {
    case CG_OPERAND_HOST_CONSTANT: return "a constant scalar";
    case CG_OPERAND_DEVICE_CONSTANT: return "a constant device tensor";
    case CG_OPERAND_ALIAS: return "a view of another operand";
    default: return "scratch in the workspace";
    }
}

/* Check the caller's operands; position[k] is where operand k is in the caller's arrays. */
static cg_status_t check_operands(cg_plan_t plan, int count, const int64_t *uids, void *const *pointers,
                                  void *workspace, int *position) {
    unsigned char seen[CG_MAX_OPERANDS];
    if (count < 0) return cg_fail(CG_STATUS_INVALID_ARGUMENT, "cg_execute: count is %d", count);
    if (count > 0 && (uids == NULL || pointers == NULL))
        return cg_fail(CG_STATUS_INVALID_ARGUMENT, "cg_execute: %d operands but uids or pointers is NULL", count);
    memset(seen, 0, (size_t)plan->n_operands);
    for (int i = 0; i < count; i++) {
        int at = operand_index(plan, uids[i]);
        if (at < 0) {
            const supplied_t *own = supplied_of(plan, uids[i]);
            if (own) {
                const cg_record_t *row = NULL;
                for (uint32_t r = 0; r < plan->blob.n_records && !row; r++)
                    if (plan->blob.records[r].uid == uids[i]) row = &plan->blob.records[r];
                return cg_fail(CG_STATUS_UNKNOWN_UID, "cg_execute: uids[%d] = %lld%s%s%s is %s that the plan binds "
                               "itself%s: leave it out", i, (long long)uids[i], row ? " ('" : "",
                               row ? row->name : "", row ? "')" : "", supplied_what(own->kind),
                               row && own->kind == CG_OPERAND_HOST_CONSTANT ? " (its value is fixed in the graph)"
                                                                            : "");
            }
            return cg_fail(CG_STATUS_UNKNOWN_UID, "cg_execute: uids[%d] = %lld is not an operand of the plan", i,
                           (long long)uids[i]);
        }
        const cg_tensor_info_t *t = &plan->operands[at];
        if (seen[at])
            return cg_fail(CG_STATUS_DUPLICATE_UID, "cg_execute: uid %lld ('%s') is passed twice", (long long)t->uid,
                           t->name);
        seen[at] = 1;
        position[at] = i;
        uintptr_t address = (uintptr_t)pointers[i];
        if (address == 0 && (plan->nonempty[at] || t->is_pass_by_value))
            return cg_fail(CG_STATUS_NULL_POINTER, "cg_execute: tensor '%s' (uid %lld) has a NULL pointer",
                           t->name, (long long)t->uid);
        if (t->alignment && !t->is_pass_by_value && (address & (t->alignment - 1)) != 0)
            return cg_fail(CG_STATUS_MISALIGNED, "cg_execute: tensor '%s' (uid %lld) at %p is not %u-byte aligned",
                           t->name, (long long)t->uid, pointers[i], t->alignment);
    }
    if (count != plan->n_operands)
        for (int k = 0; k < plan->n_operands; k++)
            if (!seen[k])
                return cg_fail(CG_STATUS_MISSING_TENSOR, "cg_execute: tensor '%s' (uid %lld) is not passed (%d of "
                               "the plan's %d operands were)", plan->operands[k].name,
                               (long long)plan->operands[k].uid, count, plan->n_operands);
    if (workspace == NULL && plan->workspace_size > 0)
        return cg_fail(CG_STATUS_NULL_POINTER, "cg_execute: the plan needs %zu bytes of workspace and workspace "
                       "is NULL", plan->workspace_size);
    return CG_STATUS_SUCCESS;
}

/* The uids and pointers cuDNN gets: the caller's but the withheld ones, then the plan's own. */
static int pack_operands(cg_plan_t plan, int count, const int64_t *uids, void *const *pointers, void *workspace,
                         const int *position, int64_t *out_uids, void **out_pointers) {
    int n = 0;
    for (int i = 0; i < count; i++) {
        if (plan->n_withheld && plan->withheld[operand_index(plan, uids[i])]) continue;
        out_uids[n] = uids[i];
        out_pointers[n++] = pointers[i];
    }
    for (int i = 0; i < plan->n_supplied; i++) {
        const supplied_t *s = &plan->supplied[i];
        out_uids[n] = s->uid;
        switch (s->kind) {
        case CG_OPERAND_HOST_CONSTANT: out_pointers[n] = s->host; break;
        case CG_OPERAND_DEVICE_CONSTANT: out_pointers[n] = (void *)(uintptr_t)s->device; break;
        case CG_OPERAND_ALIAS: out_pointers[n] = (char *)pointers[position[s->source]] + s->offset; break;
        default: out_pointers[n] = (char *)workspace + s->offset; break;
        }
        n++;
    }
    return n;
}

/* A finalized variant pack for these operands: this thread's cached one, or a new one (cached). The
 * cache is keyed by the caller's arrays: the plan's own operands follow from them and the workspace. */
static cg_status_t variant_pack(const cg_libs_t *libs, cg_plan_t plan, int count, const int64_t *uids,
                                void *const *pointers, void *workspace, const int *position, void **out) {
    for (int i = 0; i < CG_PACK_CACHE; i++) {
        pack_entry_t *e = &thread_packs[i];
        if (e->plan_id == plan->id && e->workspace == workspace && e->n == count &&
            memcmp(e->uids, uids, (size_t)count * sizeof *uids) == 0 &&
            memcmp(e->pointers, pointers, (size_t)count * sizeof *pointers) == 0) {
            *out = e->pack;
            return CG_STATUS_SUCCESS;
        }
    }
    pack_entry_t *e = &thread_packs[thread_pack_next];
    thread_pack_next = (thread_pack_next + 1) % CG_PACK_CACHE;
    drop_pack(libs, e);
    /* The key (count uids, count pointers), then what cuDNN gets (count + n_supplied of each). */
    size_t key = (size_t)(count ? count : 1), full = (size_t)count + (size_t)plan->n_supplied + 1;
    e->uids = malloc((key + full) * (sizeof(int64_t) + sizeof(void *)));
    if (!e->uids) return cg_fail(CG_STATUS_OUT_OF_MEMORY, "cg_execute: no memory for a variant pack");
    e->pointers = (void **)(e->uids + key);
    int64_t *pack_uids = (int64_t *)(e->pointers + key);
    void **pack_pointers = (void **)(pack_uids + full);
    memcpy(e->uids, uids, (size_t)count * sizeof *uids);
    memcpy(e->pointers, pointers, (size_t)count * sizeof *pointers);
    int n = pack_operands(plan, count, uids, pointers, workspace, position, pack_uids, pack_pointers);
    const char *what = "cudnnBackendCreateDescriptor(VARIANT_PACK)";
    int status = libs->cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &e->pack);
    if (status == CUDNN_STATUS_SUCCESS) {
        what = "set CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS";
        status = libs->cudnnBackendSetAttribute(e->pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n,
                                                pack_uids);
    }
    if (status == CUDNN_STATUS_SUCCESS) {
        what = "set CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS";
        status = libs->cudnnBackendSetAttribute(e->pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                                                n, pack_pointers);
    }
    if (status == CUDNN_STATUS_SUCCESS) {
        what = "set CUDNN_ATTR_VARIANT_PACK_WORKSPACE";
        status = libs->cudnnBackendSetAttribute(e->pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                                                &workspace);
    }
    if (status == CUDNN_STATUS_SUCCESS) {
        what = "finalize the variant pack";
        status = libs->cudnnBackendFinalize(e->pack);
    }
    if (status != CUDNN_STATUS_SUCCESS) {
        cg_status_t failed = cg_cudnn_failure(libs, status, what);
        drop_pack(libs, e);
        return failed;
    }
    e->plan_id = plan->id;
    e->workspace = workspace;
    e->n = count;
    *out = e->pack;
    return CG_STATUS_SUCCESS;
}

/* Scratch the plan zeroes before each execute, on the execute's stream. */
static cg_status_t zero_scratch(const cg_libs_t *libs, cg_plan_t plan, void *stream, void *workspace) {
    for (int i = 0; i < plan->n_supplied; i++) {
        const supplied_t *s = &plan->supplied[i];
        if (s->kind != CG_OPERAND_SCRATCH || !s->zero || s->nbytes == 0) continue;
        int status = libs->cuMemsetD8Async((unsigned long long)(uintptr_t)workspace + s->offset, 0, s->nbytes, stream);
        if (status != 0)
            return cg_fail(CG_STATUS_CUDA_ERROR, "cuMemsetD8Async (zeroing the plan's scratch uid %lld, %zu bytes at "
                           "workspace + %zu): CUDA error %d", (long long)s->uid, s->nbytes, s->offset, status);
    }
    return CG_STATUS_SUCCESS;
}

cg_status_t cg_execute(cg_plan_t plan, void *stream, int count, const int64_t *uids, void *const *pointers,
                       void *workspace) {
    if (plan == NULL) return cg_fail(CG_STATUS_INVALID_ARGUMENT, "cg_execute: the plan is NULL");
    int position[CG_MAX_OPERANDS];
    cg_status_t result = check_operands(plan, count, uids, pointers, workspace, position);
    if (result != CG_STATUS_SUCCESS) return result;
    const cg_libs_t *libs = plan->dsl ? cg_cuda() : cg_libs();      /* loaded: the plan's load needed them */
    int pushed;
    result = enter_device(libs, plan->context, &pushed);
    if (result != CG_STATUS_SUCCESS) return result;
    if (plan->dsl) {
        result = cg_dsl_execute(plan->dsl, stream, pointers, position, workspace);
        leave_device(libs, pushed);
        return result;
    }
    thread_handle_t *h;
    result = thread_handle(libs, plan->device, &h);
    if (result == CG_STATUS_SUCCESS && h->stream != stream) {
        int status = libs->cudnnSetStream(h->handle, stream);
        if (status != CUDNN_STATUS_SUCCESS) result = cg_cudnn_failure(libs, status, "cudnnSetStream");
        else h->stream = stream;
    }
    void *pack = NULL;
    if (result == CG_STATUS_SUCCESS)
        result = variant_pack(libs, plan, count, uids, pointers, workspace, position, &pack);
    /* Zero fills and the execute are ordered on the same stream. */
    if (result == CG_STATUS_SUCCESS && plan->zero_fills) result = zero_scratch(libs, plan, stream, workspace);
    if (result == CG_STATUS_SUCCESS) {
        int status = libs->cudnnBackendExecute(h->handle, plan->plan, pack);
        if (status != CUDNN_STATUS_SUCCESS) result = cg_cudnn_failure(libs, status, "cudnnBackendExecute");
    }
    leave_device(libs, pushed);
    return result;
}
