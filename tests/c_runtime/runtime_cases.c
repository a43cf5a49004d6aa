/* The C runtime's behaviour, one line per case: "<case> <status name> | <cg_last_error()>".
 * Built and run by test_c_runtime.py (against the stand-in libcudnn / libcuda), also under valgrind.
 * argv[1]: the folder holding the blobs test_c_runtime.py wrote. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cudnn_graph/cudnn_graph.h>

static const char *folder;

static void *read_blob(const char *name, size_t *size) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", folder, name);
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot open %s\n", path); exit(2); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *data = malloc(n ? (size_t)n : 1);
    if (fread(data, 1, (size_t)n, f) != (size_t)n) { fprintf(stderr, "short read %s\n", path); exit(2); }
    fclose(f);
    *size = (size_t)n;
    return data;
}

static void report(const char *name, cg_status_t status) {
    printf("%s %s | %s\n", name, cg_status_name(status), status == CG_STATUS_SUCCESS ? "" : cg_last_error());
}

/* Load `file` on `device`: the plan (freed by the caller) or NULL, the outcome reported as `name`. */
static cg_plan_t load(const char *name, const char *file, int device) {
    size_t size;
    void *blob = read_blob(file, &size);
    cg_plan_t plan = (cg_plan_t)0x1;       /* must come back NULL on failure */
    cg_status_t status = cg_plan_load(blob, size, device, &plan);
    free(blob);                            /* the runtime keeps a copy of what it needs */
    report(name, status);
    if (status != CG_STATUS_SUCCESS && plan != NULL) printf("%s_out_not_null FAIL |\n", name);
    return status == CG_STATUS_SUCCESS ? plan : NULL;
}

/* The operands of the good blob: x (1, 16-byte aligned), w (2), y (4), s (5, a host scalar). */
static float scalar = 2.0f;
#define X ((void *)0x200000)
#define W ((void *)0x210000)
#define Y ((void *)0x220000)

static void *run_thread(void *plan) {
    int64_t uids[] = {1, 2, 4, 5};
    void *pointers[] = {X, W, Y, &scalar};
    cg_status_t status = CG_STATUS_SUCCESS;
    for (int i = 0; i < 3 && status == CG_STATUS_SUCCESS; i++)
        status = cg_execute((cg_plan_t)plan, NULL, 4, uids, pointers, NULL);
    return (void *)(intptr_t)status;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    folder = argv[1];
    printf("api_version %d |\n", cg_api_version());

    /* Blobs refused at load. */
    static const char *refused[] = {"bad_magic", "truncated", "flipped_crc", "format_v5", "library_version",
                                    "cudnn_version", "arch", "cute", "cutile", "reference", "no_cudnn_plan",
                                    "section_past_end", "tensor_table_short", "empty"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        char file[64], name[80];
        snprintf(file, sizeof file, "%s.blob", refused[i]);
        snprintf(name, sizeof name, "load_%s", refused[i]);
        cg_plan_free(load(name, file, 0));
    }
    cg_plan_free(load("load_device_1", "good.blob", 1));
    cg_plan_free(load("load_device_negative", "good.blob", -1));
    report("load_out_null", cg_plan_load("x", 1, 0, NULL));
    cg_plan_free(NULL);

    cg_plan_t plan = load("load_good", "good.blob", 0);
    if (!plan) return 1;

    /* Queries. */
    int count = -1, device = -1, index = -1;
    size_t workspace = 99;
    int64_t engine = -1;
    cg_engine_family_t family = 0;
    cg_plan_tensor_count(plan, &count);
    cg_plan_workspace_size(plan, &workspace);
    cg_plan_engine_family(plan, &family);
    cg_plan_engine_id(plan, &engine);
    cg_plan_device(plan, &device);
    printf("query count=%d workspace=%zu family=%d engine=%lld device=%d |\n", count, workspace, (int)family,
           (long long)engine, device);
    for (int i = 0; i < count; i++) {
        cg_tensor_info_t t;
        cg_plan_tensor(plan, i, &t);
        printf("tensor %d uid=%lld name=%s type=%d rank=%d align=%u by_value=%d dims=", i, (long long)t.uid, t.name,
               t.data_type, t.rank, t.alignment, t.is_pass_by_value);
        for (int d = 0; d < t.rank; d++) printf("%s%lld", d ? "," : "", (long long)t.dims[d]);
        printf(" strides=");
        for (int d = 0; d < t.rank; d++) printf("%s%lld", d ? "," : "", (long long)t.strides[d]);
        printf(" |\n");
    }
    cg_tensor_info_t unused;
    report("query_index_out_of_range", cg_plan_tensor(plan, count, &unused));
    report("query_index_of_uid_4", cg_plan_tensor_index(plan, 4, &index));
    printf("index_of_uid_4 %d |\n", index);
    report("query_index_of_uid_3_virtual", cg_plan_tensor_index(plan, 3, &index));
    report("query_null_plan", cg_plan_tensor_count(NULL, &count));
    report("query_null_out", cg_plan_workspace_size(plan, NULL));

    /* Execute: the good call twice (one variant pack), then every pointer error. */
    void *stream = (void *)0x5000;
    int64_t uids[] = {1, 2, 4, 5};
    void *pointers[] = {X, W, Y, &scalar};
    report("execute_good", cg_execute(plan, stream, 4, uids, pointers, NULL));
    report("execute_again", cg_execute(plan, stream, 4, uids, pointers, NULL));
    int64_t reordered_uids[] = {5, 4, 2, 1};
    void *reordered[] = {&scalar, Y, W, X};
    report("execute_reordered", cg_execute(plan, NULL, 4, reordered_uids, reordered, NULL));

    void *null_x[] = {NULL, W, Y, &scalar};
    report("execute_null_pointer", cg_execute(plan, stream, 4, uids, null_x, NULL));
    void *null_scalar[] = {X, W, Y, NULL};
    report("execute_null_scalar", cg_execute(plan, stream, 4, uids, null_scalar, NULL));
    void *misaligned[] = {(char *)X + 4, W, Y, &scalar};
    report("execute_misaligned", cg_execute(plan, stream, 4, uids, misaligned, NULL));
    int64_t unknown[] = {1, 2, 4, 99};
    report("execute_unknown_uid", cg_execute(plan, stream, 4, unknown, pointers, NULL));
    int64_t virtual_uid[] = {1, 2, 4, 3};
    report("execute_virtual_uid", cg_execute(plan, stream, 4, virtual_uid, pointers, NULL));
    report("execute_missing_tensor", cg_execute(plan, stream, 3, uids, pointers, NULL));
    int64_t duplicate[] = {1, 2, 2, 5};
    report("execute_duplicate_uid", cg_execute(plan, stream, 4, duplicate, pointers, NULL));
    report("execute_negative_count", cg_execute(plan, stream, -1, uids, pointers, NULL));
    report("execute_null_arrays", cg_execute(plan, stream, 4, NULL, pointers, NULL));
    report("execute_null_plan", cg_execute(NULL, stream, 4, uids, pointers, NULL));

    /* Many threads on one plan: each its own handle and variant pack. */
    pthread_t threads[4];
    for (int i = 0; i < 4; i++) pthread_create(&threads[i], NULL, run_thread, plan);
    cg_status_t worst = CG_STATUS_SUCCESS;
    for (int i = 0; i < 4; i++) {
        void *result;
        pthread_join(threads[i], &result);
        if ((cg_status_t)(intptr_t)result != CG_STATUS_SUCCESS) worst = (cg_status_t)(intptr_t)result;
    }
    report("execute_threads", worst);

    /* An empty tensor may be NULL. */
    cg_plan_t empty = load("load_empty_tensor", "empty_tensor.blob", 0);
    if (empty) {
        int64_t empty_uids[] = {1, 2};
        void *empty_pointers[] = {NULL, Y};
        report("execute_empty_tensor_null", cg_execute(empty, NULL, 2, empty_uids, empty_pointers, NULL));
        cg_plan_free(empty);
    }
    cg_plan_free(plan);
    cg_thread_release();
    return 0;
}
