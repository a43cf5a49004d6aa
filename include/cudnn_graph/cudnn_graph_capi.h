/*
 * cudnn_graph's in-process C API for CPython extension modules: execute a graph built in Python from C
 * (raw device pointers, no Python call per execute). The package publishes a versioned function table
 * in the capsule "cudnn_graph._C_API"; docs/c_api.md is the guide. It includes <Python.h> first, as
 * CPython asks of every extension source.
 *
 *     const cg_capi_t *api = cg_capi_import();          // NULL with an ImportError set on failure
 *     cg_graph_plan_t plan;
 *     if (api->plan_from_graph(graph, &plan) != CG_STATUS_SUCCESS)   // a built cudnn_graph.pygraph
 *         return PyErr_Format(PyExc_RuntimeError, "%s", api->last_error());
 *     int64_t uids[] = {1, 2, 3};
 *     void *pointers[] = {a_device, b_device, c_device};
 *     cg_status_t status = api->execute(plan, stream, 3, uids, pointers, workspace);
 *     api->plan_free(plan);
 *
 * Rules
 *   - The statuses, cg_tensor_info_t and cg_engine_family_t are those of cudnn_graph.h (the C runtime's);
 *     this table needs no library to link: it lives in the cudnn_graph package.
 *   - plan_from_graph is called with the GIL held; every other function may be called with or without
 *     it, from any thread (execute takes the GIL for the moments it needs Python objects, and for the
 *     whole call of a Python engine's plan, such as the reference engine's).
 *   - A plan handle is the graph's plan selected and built when plan_from_graph ran; it keeps the graph
 *     alive until plan_free. Executing one handle from many threads at once is safe.
 *   - On anything but CG_STATUS_SUCCESS, last_error() holds a message for the calling thread that names
 *     the tensor (name and uid), what was expected and what arrived.
 *
 * C99; no C++ in this header.
 */
#ifndef CUDNN_GRAPH_CAPI_H
#define CUDNN_GRAPH_CAPI_H

#include <Python.h>
#include <stddef.h>
#include <stdint.h>

#include "cudnn_graph/cudnn_graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The table this header describes. A minor bump appends members (an older header reads a prefix of a
 * newer table); a major bump changes one. cg_capi_import refuses another major or a shorter table. */
#define CG_CAPI_VERSION_MAJOR 1
#define CG_CAPI_VERSION_MINOR 0
#define CG_CAPI_VERSION (CG_CAPI_VERSION_MAJOR * 100 + CG_CAPI_VERSION_MINOR)
#define CG_CAPI_CAPSULE_NAME "cudnn_graph._C_API"

/* A built graph's plan, seen from C. Opaque. */
typedef struct cg_graph_plan *cg_graph_plan_t;

typedef struct cg_capi {
    uint32_t version;             /* CG_CAPI_VERSION of the package that made the table */
    uint32_t size;                /* sizeof(cg_capi_t) in that package */

    /* The selected, built plan of `graph` (a cudnn_graph.pygraph); CG_STATUS_NOT_BUILT when it has none,
     * CG_STATUS_INVALID_ARGUMENT when it is not a graph. The GIL must be held. */
    cg_status_t (*plan_from_graph)(PyObject *graph, cg_graph_plan_t *out);
    /* Release a handle (NULL is ignored). */
    void (*plan_free)(cg_graph_plan_t plan);

    /* The operands the caller passes: the graph's non-virtual tensors, less the scalars whose value the
     * graph fixed and the inputs no node reads. As cudnn_graph.h's cg_plan_tensor_*; the strings and
     * arrays stay valid until plan_free. */
    cg_status_t (*plan_tensor_count)(cg_graph_plan_t plan, int *count);
    cg_status_t (*plan_tensor)(cg_graph_plan_t plan, int index, cg_tensor_info_t *info);
    cg_status_t (*plan_tensor_index)(cg_graph_plan_t plan, int64_t uid, int *index);
    /* Bytes of device workspace execute needs (0 for a host plan). */
    cg_status_t (*plan_workspace_size)(cg_graph_plan_t plan, size_t *bytes);
    cg_status_t (*plan_engine_family)(cg_graph_plan_t plan, cg_engine_family_t *family);
    cg_status_t (*plan_engine_id)(cg_graph_plan_t plan, int64_t *engine_id);
    /* The CUDA ordinal of the graph's device; -1 for a host (CPU) graph. */
    cg_status_t (*plan_device)(cg_graph_plan_t plan, int *device);

    /* Execute on `stream` (a CUstream; NULL: the legacy default stream) with uids[i] at pointers[i] for
     * every operand, in any order, and `workspace` (at least plan_workspace_size bytes; NULL when 0).
     * A host graph's pointers are host memory. As cg_execute: the pointers are checked before anything
     * launches; the call is asynchronous for a GPU plan. */
    cg_status_t (*execute)(cg_graph_plan_t plan, void *stream, int count, const int64_t *uids,
                           void *const *pointers, void *workspace);

    /* The calling thread's last failure message ("" when none), and a status's name. */
    const char *(*last_error)(void);
    const char *(*status_name)(cg_status_t status);
} cg_capi_t;

/* The table of the imported cudnn_graph package, checked to be major version `major` and at least `size`
 * bytes; NULL with a Python exception set (ImportError) when it is not. The GIL must be held. */
static inline const cg_capi_t *cg_capi_import_version(int major, size_t size) {
    const cg_capi_t *api = (const cg_capi_t *)PyCapsule_Import(CG_CAPI_CAPSULE_NAME, 0);
    if (api == NULL) return NULL;
    if ((int)(api->version / 100) != major) {
        PyErr_Format(PyExc_ImportError, "%s is version %u.%u; this extension was built for version %d.x of "
                     "cudnn_graph_capi.h: rebuild it against the installed cudnn_graph", CG_CAPI_CAPSULE_NAME,
                     (unsigned)(api->version / 100), (unsigned)(api->version % 100), major);
        return NULL;
    }
    if ((size_t)api->size < size) {
        PyErr_Format(PyExc_ImportError, "%s holds %u bytes of functions; this extension needs %zu (its "
                     "cudnn_graph_capi.h is newer than the installed cudnn_graph)", CG_CAPI_CAPSULE_NAME,
                     (unsigned)api->size, size);
        return NULL;
    }
    return api;
}

/* The table, checked against this header's version. */
static inline const cg_capi_t *cg_capi_import(void) {
    return cg_capi_import_version(CG_CAPI_VERSION_MAJOR, sizeof(cg_capi_t));
}

#ifdef __cplusplus
}
#endif

#endif /* CUDNN_GRAPH_CAPI_H */
