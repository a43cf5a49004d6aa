/* bench/c_api.py's timing loop: host nanoseconds per cg_execute of a plan folder made by
 * examples/c/make_plan.py, from raw device pointers holding its inputs (a cuTile kernel reads its sequence
 * boundaries from the device: garbage there would address memory it does not own). Prints one line per
 * burst: "<ns per call>".
 * usage: c_api_loop PLAN_DIR ITERATIONS BURSTS */
#define _POSIX_C_SOURCE 199309L   /* clock_gettime under -std=c99 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cudnn_graph/cudnn_graph.h>

typedef int (*mem_alloc_t)(unsigned long long *, size_t);
typedef int (*memcpy_htod_t)(unsigned long long, const void *, size_t);
typedef int (*synchronize_t)(void);
typedef int (*retain_t)(void **, int);
typedef int (*push_t)(void *);

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

#include "../examples/c/read_file.h"

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    int iterations = atoi(argv[2]), bursts = atoi(argv[3]);
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) return 1;
    mem_alloc_t mem_alloc = (mem_alloc_t)dlsym(cuda, "cuMemAlloc_v2");
    memcpy_htod_t memcpy_htod = (memcpy_htod_t)dlsym(cuda, "cuMemcpyHtoD_v2");
    synchronize_t synchronize = (synchronize_t)dlsym(cuda, "cuCtxSynchronize");
    char path[4096];
    size_t size;
    snprintf(path, sizeof path, "%s/plan.blob", argv[1]);
    void *blob = read_file(path, &size);
    cg_plan_t plan;
    if (!blob || cg_plan_load(blob, size, 0, &plan) != CG_STATUS_SUCCESS) {
        fprintf(stderr, "load: %s\n", cg_last_error());
        return 1;
    }
    void *context;
    ((retain_t)dlsym(cuda, "cuDevicePrimaryCtxRetain"))(&context, 0);
    ((push_t)dlsym(cuda, "cuCtxPushCurrent_v2"))(context);
    int count;
    size_t workspace_size;
    cg_plan_tensor_count(plan, &count);
    cg_plan_workspace_size(plan, &workspace_size);
    int64_t *uids = calloc((size_t)count, sizeof *uids);
    void **pointers = calloc((size_t)count, sizeof *pointers);
    for (int i = 0; i < count; i++) {
        cg_tensor_info_t t;
        cg_plan_tensor(plan, i, &t);
        uids[i] = t.uid;
        if (t.is_pass_by_value) {
            snprintf(path, sizeof path, "%s/%lld.in", argv[1], (long long)t.uid);
            pointers[i] = read_file(path, &size);
            continue;
        }
        size_t span = 1;
        for (int d = 0; d < t.rank; d++) span += (size_t)(t.dims[d] - 1) * (size_t)t.strides[d];
        unsigned long long address;
        mem_alloc(&address, span * 8);
        pointers[i] = (void *)(uintptr_t)address;
        snprintf(path, sizeof path, "%s/%lld.in", argv[1], (long long)t.uid);
        void *data = read_file(path, &size);        /* an input: its bytes (an output has no file) */
        if (data && size <= span * 8) memcpy_htod(address, data, size);
        free(data);
    }
    unsigned long long workspace = 0;
    if (workspace_size) mem_alloc(&workspace, workspace_size);
    for (int b = 0; b < bursts + 1; b++) {      /* the first burst warms up */
        synchronize();
        double start = now_ns();
        for (int i = 0; i < iterations; i++)
            if (cg_execute(plan, NULL, count, uids, pointers, (void *)(uintptr_t)workspace) != CG_STATUS_SUCCESS) {
                fprintf(stderr, "execute: %s\n", cg_last_error());
                return 1;
            }
        double stop = now_ns();
        if (b) printf("%.1f\n", (stop - start) / iterations);
    }
    synchronize();
    cg_plan_free(plan);
    return 0;
}
