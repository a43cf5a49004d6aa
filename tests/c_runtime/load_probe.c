/* Load argv[1] on device 0 and print the status, then one line per operand: "<uid> <name> <dims>". */
#include <stdio.h>
#include <stdlib.h>

#include <cudnn_graph/cudnn_graph.h>

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    FILE *f = fopen(argv[1], "rb");
    if (!f) return 2;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *blob = malloc(n > 0 ? (size_t)n : 1);
    size_t got = fread(blob, 1, (size_t)n, f);
    fclose(f);
    cg_plan_t plan;
    cg_status_t status = cg_plan_load(blob, got, 0, &plan);
    free(blob);
    printf("%s %s\n", cg_status_name(status), status == CG_STATUS_SUCCESS ? "" : cg_last_error());
    if (status != CG_STATUS_SUCCESS) return 0;
    int count;
    cg_plan_tensor_count(plan, &count);
    for (int i = 0; i < count; i++) {
        cg_tensor_info_t t;
        cg_plan_tensor(plan, i, &t);
        printf("%lld %s", (long long)t.uid, t.name);
        for (int d = 0; d < t.rank; d++) printf("%s%lld", d ? "," : " ", (long long)t.dims[d]);
        printf("\n");
    }
    cg_plan_free(plan);
    cg_thread_release();
    return 0;
}
