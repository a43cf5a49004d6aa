/* The C runtime on DSL plans (the blob's section 7), one line per case: "<case> <status name> |
 * <cg_last_error()>". Built and run by test_c_dsl_launch.py against a stand-in kernel, DSL runtime library
 * and libcuda, also under valgrind. argv[1]: the folder of the blobs; argv[2]: "main" (every case), or
 * "single" (load argv[3].blob and execute it once); in "main", argv[3..] name malformed blobs, each loaded
 * and reported as load_<name>. */
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

#define A ((void *)0x100000)
#define B ((void *)0x110000)
#define C ((void *)0x120000)
#define BIAS ((void *)0x130002)
#define STREAM ((void *)0x5000)

static float alpha = 1.5f;

static cg_status_t run(cg_plan_t plan, void *a, void *bias) {
    int64_t uids[] = {3, 1, 2, 4, 5};
    void *pointers[] = {C, a, B, bias, &alpha};
    return cg_execute(plan, STREAM, 5, uids, pointers, NULL);
}

static void *worker(void *plan) {
    cg_status_t status = CG_STATUS_SUCCESS;
    for (int i = 0; i < 3 && status == CG_STATUS_SUCCESS; i++) status = run((cg_plan_t)plan, A, BIAS);
    return (void *)(intptr_t)status;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    folder = argv[1];
    if (strcmp(argv[2], "single") == 0) {
        cg_plan_t plan = argc > 3 ? load("load_single", argv[3]) : NULL;
        if (plan) report("execute_single", run(plan, A, BIAS));
        cg_plan_free(plan);
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
        printf("tensor %d uid=%lld name=%s type=%d rank=%d align=%u by_value=%d dims=", i, (long long)t.uid, t.name,
               t.data_type, t.rank, t.alignment, t.is_pass_by_value);
        for (int d = 0; d < t.rank; d++) printf("%s%lld", d ? "," : "", (long long)t.dims[d]);
        printf(" strides=");
        for (int d = 0; d < t.rank; d++) printf("%s%lld", d ? "," : "", (long long)t.strides[d]);
        printf(" |\n");
    }
    int index = -1;
    report("index_of_beta", cg_plan_tensor_index(plan, 6, &index));

    report("execute_good", run(plan, A, BIAS));
    report("execute_again", run(plan, A, BIAS));
    pthread_t threads[4];
    for (int i = 0; i < 4; i++) pthread_create(&threads[i], NULL, worker, plan);
    cg_status_t joined = CG_STATUS_SUCCESS;
    for (int i = 0; i < 4; i++) {
        void *status;
        pthread_join(threads[i], &status);
        if ((cg_status_t)(intptr_t)status != CG_STATUS_SUCCESS) joined = (cg_status_t)(intptr_t)status;
    }
    report("execute_threads", joined);
    report("execute_null_a", run(plan, NULL, BIAS));
    report("execute_misaligned_a", run(plan, (void *)0x100004, BIAS));
    report("execute_misaligned_bias", run(plan, A, (void *)0x130001));
    int64_t with_beta[] = {3, 1, 2, 4, 5, 6};
    static double beta = 2.0;
    void *with_beta_pointers[] = {C, A, B, BIAS, &alpha, &beta};
    report("execute_passing_beta", cg_execute(plan, STREAM, 6, with_beta, with_beta_pointers, NULL));
    int64_t without_alpha[] = {3, 1, 2, 4};
    report("execute_missing_alpha", cg_execute(plan, STREAM, 4, without_alpha, with_beta_pointers, NULL));
    setenv("FAKE_DSL_FAIL", "700", 1);
    report("execute_launch_failure", run(plan, A, BIAS));
    unsetenv("FAKE_DSL_FAIL");
    cg_plan_free(plan);

    plan = load("load_inline", "inline");
    if (plan) report("execute_inline", run(plan, A, BIAS));
    cg_plan_free(plan);
    cg_plan_free(load("load_not_elf", "not_elf"));
    cg_plan_free(load("load_broken_elf", "broken_elf"));
    cg_plan_free(load("load_no_entry", "no_entry"));
    setenv("FAKE_DSL_INIT_FAIL", "3", 1);
    cg_plan_free(load("load_init_failure", "good"));
    unsetenv("FAKE_DSL_INIT_FAIL");
    cg_thread_release();
    return 0;
}
