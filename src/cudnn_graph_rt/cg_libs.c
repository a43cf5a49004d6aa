/* libcudnn and libcuda, dlopen'ed once per process and resolved into function pointers.
 *
 * libcudnn's search is the Python package's (src/cudnn_graph/_loader.pyx) without its middle step:
 *   1. $CUDNN_GRAPH_LIBCUDNN: a path to libcudnn.so.9, or to the folder holding it;
 *   2. the system loader: dlopen("libcudnn.so.9") (LD_LIBRARY_PATH, ld.so.cache, RPATH).
 * The Python package also asks cuda-pathfinder (the nvidia-cudnn wheels, conda, $CUDNN_PATH), which C
 * cannot: a C program that relies on a wheel's libcudnn sets $CUDNN_GRAPH_LIBCUDNN or LD_LIBRARY_PATH.
 * A candidate counts only if it exports every entry point below and reports cuDNN major 9.
 * libcuda is dlopen("libcuda.so.1"), as src/cudnn_graph/_driver.pyx does. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cg_internal.h"

#define CG_ENV_LIBCUDNN "CUDNN_GRAPH_LIBCUDNN"
#define CG_LIBCUDNN_NAME "libcudnn.so.9"
#define CG_LIBCUDA_NAME "libcuda.so.1"

/* libcuda and libcudnn load separately: a DSL plan (CuTe) needs only the driver. */
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT, cudnn_once = PTHREAD_ONCE_INIT;
static cg_libs_t libs;
static int cuda_ready, cudnn_ready;
static cg_status_t cuda_status, cudnn_status;
static char cuda_failure[900], cudnn_failure[900];    /* why a library did not load: every place tried */
static __thread char *libs_failure;                   /* the one this thread is loading */

static void note(const char *format, const char *a, const char *b) {
    size_t used = strlen(libs_failure);
    if (used + 2 >= sizeof cuda_failure) return;
    snprintf(libs_failure + used, sizeof cuda_failure - used, format, a, b);
}

/* Resolve `name` into *slot; 0 (and a note) when the library lacks it. */
static int bind(void *handle, const char *name, void **slot, const char *place) {
    *slot = dlsym(handle, name);
    if (*slot == NULL) {
        note("%s: lacks %s; ", place, name);
        return 0;
    }
    return 1;
}

#define BIND(handle, field, place) bind(handle, #field, (void **)&libs.field, place)

/* dlopen(path), or NULL with the loader's reason noted for the error message. */
static void *open_noted(const char *path, const char *place) {
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        const char *why = dlerror();
        note("%s: %s; ", place, why ? why : "dlopen failed");
    }
    return handle;
}

static int try_cudnn(const char *path, const char *place) {
    void *handle = open_noted(path, place);
    if (handle == NULL) return 0;
    int ok = BIND(handle, cudnnGetVersion, place) & BIND(handle, cudnnGetErrorString, place) &
             BIND(handle, cudnnCreate, place) & BIND(handle, cudnnDestroy, place) &
             BIND(handle, cudnnSetStream, place) & BIND(handle, cudnnBackendCreateDescriptor, place) &
             BIND(handle, cudnnBackendDestroyDescriptor, place) & BIND(handle, cudnnBackendSetAttribute, place) &
             BIND(handle, cudnnBackendGetAttribute, place) & BIND(handle, cudnnBackendFinalize, place) &
             BIND(handle, cudnnBackendExecute, place);
    if (ok) {
        libs.cudnn_version = libs.cudnnGetVersion();
        if (libs.cudnn_version / 10000 != CG_CUDNN_ABI_MAJOR) {
            char version[32];
            snprintf(version, sizeof version, "%zu", libs.cudnn_version);
            note("%s: cuDNN %s is not major 9; ", place, version);
            ok = 0;
        }
    }
    if (!ok) {
        dlclose(handle);
        return 0;
    }
    libs.cudnnGetLastErrorString = (cg_cudnnGetLastErrorString_t)dlsym(handle, "cudnnGetLastErrorString");
    return 1;      /* the library stays loaded for the life of the process */
}

static int load_cudnn(void) {
    const char *env = getenv(CG_ENV_LIBCUDNN);
    char place[600];
    if (env && env[0]) {
        char path[4096];
        struct stat info;
        if (stat(env, &info) == 0 && S_ISDIR(info.st_mode))
            snprintf(path, sizeof path, "%s/%s", env, CG_LIBCUDNN_NAME);
        else
            snprintf(path, sizeof path, "%s", env);
        snprintf(place, sizeof place, "$%s=%s", CG_ENV_LIBCUDNN, env);
        if (try_cudnn(path, place)) return 1;
    } else {
        note("$%s: %s; ", CG_ENV_LIBCUDNN, "not set");
    }
    snprintf(place, sizeof place, "system loader dlopen(%s)", CG_LIBCUDNN_NAME);
    return try_cudnn(CG_LIBCUDNN_NAME, place);
}

static int load_cuda(void) {
    const char *place = "dlopen(" CG_LIBCUDA_NAME ")";
    void *handle = open_noted(CG_LIBCUDA_NAME, place);
    if (handle == NULL) return 0;
    int ok = BIND(handle, cuInit, place) & BIND(handle, cuDeviceGetCount, place) &
             BIND(handle, cuDeviceGet, place) & BIND(handle, cuDeviceGetAttribute, place) &
             BIND(handle, cuDevicePrimaryCtxRetain, place) & BIND(handle, cuCtxGetCurrent, place);
    ok &= bind(handle, "cuCtxPushCurrent_v2", (void **)&libs.cuCtxPushCurrent, place);
    ok &= bind(handle, "cuCtxPopCurrent_v2", (void **)&libs.cuCtxPopCurrent, place);
    if (!ok) return 0;
    libs.cuDevicePrimaryCtxRelease = (cg_cuDevicePrimaryCtxRelease_t)dlsym(handle, "cuDevicePrimaryCtxRelease_v2");
    /* Memory calls only plans with operands of their own need (cg_plan_load checks for them then). */
    libs.cuMemAlloc = (cg_cuMemAlloc_t)dlsym(handle, "cuMemAlloc_v2");
    libs.cuMemFree = (cg_cuMemFree_t)dlsym(handle, "cuMemFree_v2");
    libs.cuMemcpyHtoD = (cg_cuMemcpyHtoD_t)dlsym(handle, "cuMemcpyHtoD_v2");
    libs.cuMemsetD8Async = (cg_cuMemsetD8Async_t)dlsym(handle, "cuMemsetD8Async");
    /* A cuTile plan's cubins and launches (cg_tile.c checks for them when it loads one). */
    libs.cuLibraryLoadData = (cg_cuLibraryLoadData_t)dlsym(handle, "cuLibraryLoadData");
    libs.cuLibraryGetKernel = (cg_cuLibraryGetKernel_t)dlsym(handle, "cuLibraryGetKernel");
    libs.cuLibraryUnload = (cg_cuLibraryUnload_t)dlsym(handle, "cuLibraryUnload");
    libs.cuKernelSetAttribute = (cg_cuKernelSetAttribute_t)dlsym(handle, "cuKernelSetAttribute");
    libs.cuLaunchKernel = (cg_cuLaunchKernel_t)dlsym(handle, "cuLaunchKernel");
    int status = libs.cuInit(0);
    if (status != 0) {
        char code[32];
        snprintf(code, sizeof code, "%d", status);
        note("%s: cuInit failed with CUDA error %s; ", place, code);
        cuda_status = CG_STATUS_CUDA_ERROR;
        return 0;
    }
    return 1;
}

static void load_cuda_once(void) {
    cuda_status = CG_STATUS_LIBRARY_NOT_FOUND;
    libs_failure = cuda_failure;
    cuda_ready = load_cuda();
}

static void load_cudnn_once(void) {
    cudnn_status = CG_STATUS_LIBRARY_NOT_FOUND;
    libs_failure = cudnn_failure;
    cudnn_ready = load_cudnn();
    if (cudnn_ready) cudnn_failure[0] = 0;    /* the places tried before the one that worked are no failure */
}

const cg_libs_t *cg_cuda(void) {
    pthread_once(&cuda_once, load_cuda_once);
    if (!cuda_ready) {
        cg_fail(cuda_status, "the CUDA driver library did not load: %s", cuda_failure);
        return NULL;
    }
    return &libs;
}

const cg_libs_t *cg_libs(void) {
    pthread_once(&cudnn_once, load_cudnn_once);
    if (!cudnn_ready) {
        cg_fail(cudnn_status, "the cuDNN and CUDA driver libraries did not load (set $%s to libcudnn.so.9, or "
                "put it on LD_LIBRARY_PATH): %s", CG_ENV_LIBCUDNN, cudnn_failure);
        return NULL;
    }
    return cg_cuda();
}

cg_status_t cg_cudnn_failure(const cg_libs_t *l, int status, const char *what) {
    char detail[512];
    detail[0] = 0;
    if (l->cudnnGetLastErrorString) l->cudnnGetLastErrorString(detail, sizeof detail);
    detail[sizeof detail - 1] = 0;
    const char *name = l->cudnnGetErrorString ? l->cudnnGetErrorString(status) : NULL;
    return cg_fail(CG_STATUS_CUDNN_ERROR, "%s: cuDNN status %d (%s)%s%s", what, status, name ? name : "?",
                   detail[0] ? ": " : "", detail);
}
