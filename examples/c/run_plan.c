/* Load a plan blob written by make_plan.py and execute it from C with raw device pointers.
 *
 *     python make_plan.py matmul plan_dir      # build + serialize in Python (once, at deploy time)
 *     make && ./run_plan plan_dir              # serve: no Python
 *
 * plan_dir/plan.blob is the plan; plan_dir/<uid>.in holds an input operand's bytes (its whole strided
 * span); every operand without one is an output, written back to plan_dir/<uid>.out. Device memory
 * comes from the CUDA driver, dlopen'ed here so that the example needs no CUDA headers. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cudnn_graph/cudnn_graph.h>

typedef int (*mem_alloc_t)(unsigned long long *, size_t);
typedef int (*mem_free_t)(unsigned long long);
typedef int (*copy_htod_t)(unsigned long long, const void *, size_t);
typedef int (*copy_dtoh_t)(void *, unsigned long long, size_t);
typedef int (*synchronize_t)(void);
static mem_alloc_t mem_alloc;
static mem_free_t mem_free;
static copy_htod_t copy_htod;
static copy_dtoh_t copy_dtoh;
static synchronize_t synchronize;

static size_t element_bytes(int data_type) {
    switch (data_type) {
    case 1: case 10: return 8;                   /* DOUBLE, INT64 */
    case 2: case 9: return 2;                    /* HALF, BFLOAT16 */
    case 3: case 6: case 11: case 12: case 13: return 1;   /* INT8, UINT8, BOOLEAN, FP8 */
    default: return 4;                           /* FLOAT, INT32, ... */
    }
}

static size_t span_bytes(const cg_tensor_info_t *t) {
    size_t span = 1;
    for (int d = 0; d < t->rank; d++) {
        if (t->dims[d] == 0) return 0;
        span += (size_t)(t->dims[d] - 1) * (size_t)t->strides[d];
    }
    return span * element_bytes(t->data_type);
}

#include "read_file.h"

#define CHECK(call)                                                                              \
    do {                                                                                         \
        cg_status_t status_ = (call);                                                            \
        if (status_ != CG_STATUS_SUCCESS) {                                                      \
            fprintf(stderr, "%s: %s: %s\n", #call, cg_status_name(status_), cg_last_error());   \
            return 1;                                                                            \
        }                                                                                        \
    } while (0)

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s PLAN_DIR (made by make_plan.py)\n", argv[0]);
        return 2;
    }
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) { fprintf(stderr, "no CUDA driver: %s\n", dlerror()); return 1; }
    mem_alloc = (mem_alloc_t)dlsym(cuda, "cuMemAlloc_v2");
    mem_free = (mem_free_t)dlsym(cuda, "cuMemFree_v2");
    copy_htod = (copy_htod_t)dlsym(cuda, "cuMemcpyHtoD_v2");
    copy_dtoh = (copy_dtoh_t)dlsym(cuda, "cuMemcpyDtoH_v2");
    synchronize = (synchronize_t)dlsym(cuda, "cuCtxSynchronize");

    char path[4096];
    size_t size;
    snprintf(path, sizeof path, "%s/plan.blob", argv[1]);
    void *blob = read_file(path, &size);
    if (!blob) { fprintf(stderr, "cannot read %s\n", path); return 1; }
    cg_plan_t plan;
    CHECK(cg_plan_load(blob, size, 0, &plan));   /* makes device 0's primary context current when needed */
    free(blob);

    int count;
    size_t workspace_size;
    CHECK(cg_plan_tensor_count(plan, &count));
    CHECK(cg_plan_workspace_size(plan, &workspace_size));
    int64_t *uids = calloc((size_t)count, sizeof *uids);
    void **pointers = calloc((size_t)count, sizeof *pointers);
    void **host = calloc((size_t)count, sizeof *host);
    int *is_output = calloc((size_t)count, sizeof *is_output);
    /* The plan's device context: cg_plan_load made it current on this thread only for its own work, so
     * the driver calls below retain and push it themselves (cuDevicePrimaryCtxRetain + cuCtxPushCurrent). */
    typedef int (*retain_t)(void **, int);
    typedef int (*push_t)(void *);
    void *context;
    ((retain_t)dlsym(cuda, "cuDevicePrimaryCtxRetain"))(&context, 0);
    ((push_t)dlsym(cuda, "cuCtxPushCurrent_v2"))(context);
    for (int i = 0; i < count; i++) {
        cg_tensor_info_t t;
        CHECK(cg_plan_tensor(plan, i, &t));
        uids[i] = t.uid;
        size_t bytes = span_bytes(&t), got = 0;
        snprintf(path, sizeof path, "%s/%lld.in", argv[1], (long long)t.uid);
        void *data = read_file(path, &got);
        is_output[i] = data == NULL;
        if (t.is_pass_by_value) {          /* a host scalar */
            if (!data) { fprintf(stderr, "scalar '%s' needs %s\n", t.name, path); return 1; }
            host[i] = data;
            pointers[i] = data;
            continue;
        }
        unsigned long long address = 0;
        if (bytes && mem_alloc(&address, bytes) != 0) { fprintf(stderr, "cuMemAlloc failed\n"); return 1; }
        if (data) copy_htod(address, data, got < bytes ? got : bytes);
        free(data);
        pointers[i] = (void *)(uintptr_t)address;
        printf("%-8s uid %-4lld %s %zu bytes\n", t.name, (long long)t.uid, is_output[i] ? "out" : "in ", bytes);
    }
    unsigned long long workspace = 0;
    if (workspace_size && mem_alloc(&workspace, workspace_size) != 0) { fprintf(stderr, "no workspace\n"); return 1; }

    CHECK(cg_execute(plan, NULL, count, uids, pointers, (void *)(uintptr_t)workspace));
    if (synchronize() != 0) { fprintf(stderr, "the execute failed on the GPU\n"); return 1; }

    for (int i = 0; i < count; i++) {
        cg_tensor_info_t t;
        cg_plan_tensor(plan, i, &t);
        size_t bytes = span_bytes(&t);
        if (is_output[i] && !t.is_pass_by_value && bytes) {
            void *out = malloc(bytes);
            copy_dtoh(out, (unsigned long long)(uintptr_t)pointers[i], bytes);
            snprintf(path, sizeof path, "%s/%lld.out", argv[1], (long long)t.uid);
            FILE *f = fopen(path, "wb");
            fwrite(out, 1, bytes, f);
            fclose(f);
            free(out);
        }
        if (!t.is_pass_by_value && pointers[i]) mem_free((unsigned long long)(uintptr_t)pointers[i]);
        free(host[i]);
    }
    if (workspace) mem_free(workspace);
    printf("executed; outputs written to %s/<uid>.out\n", argv[1]);
    cg_plan_free(plan);
    cg_thread_release();
    free(uids);
    free(pointers);
    free(host);
    free(is_output);
    return 0;
}
