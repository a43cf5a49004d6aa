/* The C runtime on cuTile plans (the blob's section 7, calling convention 2), one line per case: "<case>
 * <status name> | <cg_last_error()>". Built and run by test_c_tile_launch.py against the stand-in libcuda
 * (its cuLibrary* and cuLaunchKernel log each load and launch), also under valgrind. argv[1]: the folder of
 * the blobs; argv[2]: "main" (every case), or "single" (load argv[3].blob and execute it once); in "main",
 * argv[3..] name malformed blobs, each loaded and reported as load_<name>. */
#define _POSIX_C_SOURCE 200809L       /* setenv */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "case_report.h"

static const char *folder;

static cg_plan_t load(const char *name, const char *blob_name) {
    char file[512];
    snprintf(file, sizeof file, "%s.blob", blob_name);
    return load_case(folder, file, name);
}

#define Q ((void *)0x100000)
#define K ((void *)0x110000)
#define CU ((void *)0x120000)
#define O ((void *)0x130000)
#define WORKSPACE ((void *)0x7000000)
#define STREAM ((void *)0x5000)

static float s_value = 0.5f;

static cg_status_t run(cg_plan_t plan, void *q, void *workspace) {
    int64_t uids[] = {4, 3, 1, 6, 2};              /* any order: the runtime binds by uid */
    void *pointers[] = {O, CU, q, &s_value, K};
    return cg_execute(plan, STREAM, 5, uids, pointers, workspace);
}

static void *worker(void *plan) {
    cg_status_t status = CG_STATUS_SUCCESS;
    for (int i = 0; i < 3 && status == CG_STATUS_SUCCESS; i++) status = run((cg_plan_t)plan, Q, WORKSPACE);
    return (void *)(intptr_t)status;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    folder = argv[1];
    if (strcmp(argv[2], "single") == 0) {
        cg_plan_t plan = argc > 3 ? load("load_single", argv[3]) : NULL;
        if (plan) report("execute_single", run(plan, Q, WORKSPACE));
        cg_plan_free(plan);
        cg_thread_release();
        return 0;
    }
    for (int i = 3; i < argc; i++) {
        char name[256];
        snprintf(name, sizeof name, "load_%s", argv[i]);
        cg_plan_free(load(name, argv[i]));
    }
    cg_plan_t plan = load("load_good", "good");
    if (!plan) return 1;
    int count = -1;
    size_t workspace = 99;
    cg_engine_family_t family = 0;
    int64_t engine = 0;
    cg_plan_tensor_count(plan, &count);
    cg_plan_workspace_size(plan, &workspace);
    cg_plan_engine_family(plan, &family);
    cg_plan_engine_id(plan, &engine);
    printf("query count=%d workspace=%zu family=%d engine=%lld |\n", count, workspace, (int)family, (long long)engine);
    for (int i = 0; i < count; i++) {
        cg_tensor_info_t t;
        cg_plan_tensor(plan, i, &t);
        printf("tensor %d uid=%lld name=%s align=%u by_value=%d |\n", i, (long long)t.uid, t.name, t.alignment,
               t.is_pass_by_value);
    }
    report("execute_good", run(plan, Q, WORKSPACE));
    report("execute_again", run(plan, Q, WORKSPACE));
    pthread_t threads[4];
    for (int i = 0; i < 4; i++) pthread_create(&threads[i], NULL, worker, plan);
    cg_status_t joined = CG_STATUS_SUCCESS;
    for (int i = 0; i < 4; i++) {
        void *status;
        pthread_join(threads[i], &status);
        if ((cg_status_t)(intptr_t)status != CG_STATUS_SUCCESS) joined = (cg_status_t)(intptr_t)status;
    }
    report("execute_threads", joined);
    report("execute_misaligned_q", run(plan, (void *)0x100008, WORKSPACE));
    report("execute_misaligned_workspace", run(plan, Q, (void *)0x7000008));
    report("execute_null_workspace", run(plan, Q, NULL));
    int64_t with_virtual[] = {4, 3, 1, 6, 2, 5};
    void *with_virtual_pointers[] = {O, CU, Q, &s_value, K, (void *)0x140000};
    report("execute_passing_t", cg_execute(plan, STREAM, 6, with_virtual, with_virtual_pointers, WORKSPACE));
    setenv("FAKE_TILE_LAUNCH_FAIL", "719", 1);
    report("execute_launch_failure", run(plan, Q, WORKSPACE));
    unsetenv("FAKE_TILE_LAUNCH_FAIL");
    cg_plan_free(plan);

    cg_plan_free(load("load_not_a_cubin", "not_a_cubin"));
    cg_plan_free(load("load_missing_kernel", "missing_kernel"));
    setenv("FAKE_LIBRARY_LOAD_FAIL", "209", 1);
    cg_plan_free(load("load_library_failure", "good"));
    unsetenv("FAKE_LIBRARY_LOAD_FAIL");
    cg_thread_release();
    return 0;
}
