/* A CPython extension module written against include/cudnn_graph/cudnn_graph_capi.h, as a user's would be:
 * it imports the capsule cudnn_graph._C_API and drives the table. Built and imported by test_capi.py. */
#include <cudnn_graph/cudnn_graph_capi.h>

#include <pthread.h>

static const cg_capi_t *api;

static PyObject *outcome(cg_status_t status) {
    return Py_BuildValue("(ss)", api->status_name(status), status == CG_STATUS_SUCCESS ? "" : api->last_error());
}

/* import_table(major=-1): the table through cg_capi_import (or cg_capi_import_version(major)); its version. */
static PyObject *import_table(PyObject *self, PyObject *args) {
    (void)self;
    int major = -1;
    if (!PyArg_ParseTuple(args, "|i", &major)) return NULL;
    const cg_capi_t *table = major < 0 ? cg_capi_import() : cg_capi_import_version(major, sizeof(cg_capi_t));
    if (table == NULL) return NULL;
    api = table;
    return Py_BuildValue("(II)", table->version, table->size);
}

static int need_table(void) {
    if (api) return 1;
    api = cg_capi_import();
    return api != NULL;
}

/* plan_status(graph): what plan_from_graph says of `graph`. */
static PyObject *plan_status(PyObject *self, PyObject *graph) {
    (void)self;
    if (!need_table()) return NULL;
    cg_graph_plan_t plan = (cg_graph_plan_t)0x1;
    cg_status_t status = api->plan_from_graph(graph, &plan);
    PyObject *result = outcome(status);
    if (status != CG_STATUS_SUCCESS && plan != NULL) {
        Py_DECREF(result);
        PyErr_SetString(PyExc_AssertionError, "plan_from_graph left *out set after a failure");
        return NULL;
    }
    api->plan_free(plan);
    return result;
}

/* describe(graph): (operands, workspace, family, engine id, device); operands as (uid, name, data type,
 * dims, strides, alignment, is_pass_by_value). */
static PyObject *describe(PyObject *self, PyObject *graph) {
    (void)self;
    if (!need_table()) return NULL;
    cg_graph_plan_t plan;
    cg_status_t status = api->plan_from_graph(graph, &plan);
    if (status != CG_STATUS_SUCCESS)
        return PyErr_Format(PyExc_RuntimeError, "%s: %s", api->status_name(status), api->last_error());
    int count = 0, device = 0;
    size_t workspace = 0;
    cg_engine_family_t family;
    int64_t engine_id = 0;
    api->plan_tensor_count(plan, &count);
    api->plan_workspace_size(plan, &workspace);
    api->plan_engine_family(plan, &family);
    api->plan_engine_id(plan, &engine_id);
    api->plan_device(plan, &device);
    PyObject *operands = PyList_New(0);
    for (int i = 0; i < count; i++) {
        cg_tensor_info_t t;
        api->plan_tensor(plan, i, &t);
        PyObject *dims = PyTuple_New(t.rank), *strides = PyTuple_New(t.rank);
        for (int d = 0; d < t.rank; d++) {
            PyTuple_SET_ITEM(dims, d, PyLong_FromLongLong(t.dims[d]));
            PyTuple_SET_ITEM(strides, d, PyLong_FromLongLong(t.strides[d]));
        }
        int index = -1;
        api->plan_tensor_index(plan, t.uid, &index);
        PyObject *row = Py_BuildValue("(LsiNNIii)", (long long)t.uid, t.name, t.data_type, dims, strides,
                                      t.alignment, t.is_pass_by_value, index);
        PyList_Append(operands, row);
        Py_DECREF(row);
    }
    PyObject *result = Py_BuildValue("(NniLi)", operands, (Py_ssize_t)workspace, (int)family,
                                     (long long)engine_id, device);
    api->plan_free(plan);
    return result;
}

typedef struct {
    cg_graph_plan_t plan;
    void *stream;
    int count;
    const int64_t *uids;
    void *const *pointers;
    void *workspace;
    int repeats;
    cg_status_t status;
} run_t;

static void *run_thread(void *arg) {
    run_t *run = arg;
    run->status = CG_STATUS_SUCCESS;
    for (int i = 0; i < run->repeats && run->status == CG_STATUS_SUCCESS; i++)
        run->status = api->execute(run->plan, run->stream, run->count, run->uids, run->pointers, run->workspace);
    return NULL;
}

/* execute(graph, uids, pointers, workspace, stream, threads=0, repeats=1): (status name, message) of the
 * table's execute. With threads > 0 each of that many C threads executes, the GIL released meanwhile. */
static PyObject *execute(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *graph, *uid_list, *pointer_list;
    unsigned long long workspace, stream;
    int threads = 0, repeats = 1;
    if (!PyArg_ParseTuple(args, "OOOKK|ii", &graph, &uid_list, &pointer_list, &workspace, &stream, &threads,
                          &repeats))
        return NULL;
    if (!need_table()) return NULL;
    Py_ssize_t n = PyList_Size(uid_list);
    if (n < 0 || n > 64 || PyList_Size(pointer_list) != n)
        return PyErr_Format(PyExc_ValueError, "uids and pointers: two lists of at most 64");
    int64_t uids[64];
    void *pointers[64];
    for (Py_ssize_t i = 0; i < n; i++) {
        uids[i] = PyLong_AsLongLong(PyList_GET_ITEM(uid_list, i));
        pointers[i] = (void *)(uintptr_t)PyLong_AsUnsignedLongLong(PyList_GET_ITEM(pointer_list, i));
    }
    if (PyErr_Occurred()) return NULL;
    cg_graph_plan_t plan;
    cg_status_t status = api->plan_from_graph(graph, &plan);
    if (status != CG_STATUS_SUCCESS) return outcome(status);
    run_t runs[8];
    if (threads > 8) threads = 8;
    for (int t = 0; t < (threads ? threads : 1); t++)
        runs[t] = (run_t){plan, (void *)(uintptr_t)stream, (int)n, uids, pointers, (void *)(uintptr_t)workspace,
                          repeats, CG_STATUS_SUCCESS};
    if (threads == 0) {
        run_thread(&runs[0]);
        status = runs[0].status;
    } else {
        pthread_t ids[8];
        char message[1024] = "";
        Py_BEGIN_ALLOW_THREADS
        for (int t = 0; t < threads; t++) pthread_create(&ids[t], NULL, run_thread, &runs[t]);
        for (int t = 0; t < threads; t++) pthread_join(ids[t], NULL);
        Py_END_ALLOW_THREADS
        status = CG_STATUS_SUCCESS;
        for (int t = 0; t < threads; t++)
            if (runs[t].status != CG_STATUS_SUCCESS) status = runs[t].status;
        if (status != CG_STATUS_SUCCESS) snprintf(message, sizeof message, "a thread failed");
        api->plan_free(plan);
        return Py_BuildValue("(ss)", api->status_name(status), message);
    }
    PyObject *result = outcome(status);
    api->plan_free(plan);
    return result;
}

/* null_arguments(graph): (case, status name, message) for each NULL or out-of-range argument. */
static PyObject *null_arguments(PyObject *self, PyObject *graph) {
    (void)self;
    if (!need_table()) return NULL;
    PyObject *out = PyList_New(0);
    cg_graph_plan_t plan;
    cg_tensor_info_t info;
    int index;
    int64_t uid = 1;
    void *pointer = NULL;
#define CASE(name, call)                                                                              \
    do {                                                                                              \
        cg_status_t s_ = (call);                                                                      \
        PyObject *row_ = Py_BuildValue("(sss)", name, api->status_name(s_), s_ ? api->last_error() : ""); \
        PyList_Append(out, row_);                                                                     \
        Py_DECREF(row_);                                                                              \
    } while (0)
    CASE("plan_from_graph_null_out", api->plan_from_graph(graph, NULL));
    CASE("plan_from_graph_null_graph", api->plan_from_graph(NULL, &plan));
    CASE("execute_null_plan", api->execute(NULL, NULL, 1, &uid, &pointer, NULL));
    CASE("count_null_plan", api->plan_tensor_count(NULL, &index));
    api->plan_free(NULL);
    if (api->plan_from_graph(graph, &plan) == CG_STATUS_SUCCESS) {
        CASE("count_null_out", api->plan_tensor_count(plan, NULL));
        CASE("tensor_out_of_range", api->plan_tensor(plan, 99, &info));
        CASE("index_of_unknown_uid", api->plan_tensor_index(plan, 99, &index));
        CASE("execute_negative_count", api->execute(plan, NULL, -1, &uid, &pointer, NULL));
        CASE("execute_null_arrays", api->execute(plan, NULL, 1, NULL, NULL, NULL));
        api->plan_free(plan);
    }
#undef CASE
    return out;
}

static PyMethodDef methods[] = {
    {"import_table", import_table, METH_VARARGS, NULL},
    {"plan_status", plan_status, METH_O, NULL},
    {"describe", describe, METH_O, NULL},
    {"execute", execute, METH_VARARGS, NULL},
    {"null_arguments", null_arguments, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "capi_probe", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_capi_probe(void) { return PyModule_Create(&module); }
