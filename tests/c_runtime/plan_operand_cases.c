/* The C runtime on plans that bind operands of their own (the blob's section 6), one line per case:
 * "<case> <status name> | <cg_last_error()>". Built and run by test_c_plan_operands.py against the
 * stand-in libcudnn / libcuda, also under valgrind. argv[1]: the folder of the blobs; argv[2..]: the
 * names of malformed blobs in it (<name>.blob), each loaded and reported as load_<name>. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "case_report.h"

static cg_plan_t load(const char *folder, const char *name, const char *file) {
    return load_case(folder, file, name);
}

#define X ((void *)0x200000)
#define W ((void *)0x210000)
#define Y ((void *)0x220000)
#define WS ((void *)0x300000)
#define WS2 ((void *)0x400000)

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    const char *folder = argv[1];
    for (int i = 2; i < argc; i++) {
        char name[256], file[256];
        snprintf(name, sizeof name, "load_%s", argv[i]);
        snprintf(file, sizeof file, "%s.blob", argv[i]);
        cg_plan_free(load(folder, name, file));
    }
    cg_plan_t plan = load(folder, "load_operands", "operands.blob");
    if (!plan) return 0;
    int count = -1, index = -1;
    size_t workspace = 0;
    cg_plan_tensor_count(plan, &count);
    cg_plan_workspace_size(plan, &workspace);
    printf("query count=%d workspace=%zu |\n", count, workspace);
    for (int i = 0; i < count; i++) {
        cg_tensor_info_t t;
        cg_plan_tensor(plan, i, &t);
        printf("tensor %d uid=%lld name=%s by_value=%d |\n", i, (long long)t.uid, t.name, t.is_pass_by_value);
    }
    report("index_of_graph_scalar", cg_plan_tensor_index(plan, 5, &index));
    report("index_of_view", cg_plan_tensor_index(plan, 6, &index));

    void *stream = (void *)0x5000;
    int64_t uids[] = {4, 1, 2};
    void *pointers[] = {Y, X, W};
    report("execute_good", cg_execute(plan, stream, 3, uids, pointers, WS));
    report("execute_again", cg_execute(plan, stream, 3, uids, pointers, WS));
    report("execute_other_workspace", cg_execute(plan, stream, 3, uids, pointers, WS2));

    static float scale = 1.0f;
    int64_t with_scalar[] = {1, 2, 4, 5};
    void *with_scalar_pointers[] = {X, W, Y, &scale};
    report("execute_passing_the_graph_scalar", cg_execute(plan, stream, 4, with_scalar, with_scalar_pointers, WS));
    int64_t with_scratch[] = {1, 2, 4, 1003};
    report("execute_passing_scratch", cg_execute(plan, stream, 4, with_scratch, with_scalar_pointers, WS));
    int64_t with_view[] = {1, 2, 4, 6};
    report("execute_passing_the_view", cg_execute(plan, stream, 4, with_view, with_scalar_pointers, WS));
    int64_t without_x[] = {2, 4};
    void *without_x_pointers[] = {W, Y};
    report("execute_without_the_withheld_source", cg_execute(plan, stream, 2, without_x, without_x_pointers, WS));
    report("execute_null_workspace", cg_execute(plan, stream, 3, uids, pointers, NULL));
    void *null_x[] = {Y, NULL, W};
    report("execute_null_source", cg_execute(plan, stream, 3, uids, null_x, WS));
    cg_plan_free(plan);
    cg_thread_release();
    return 0;
}
