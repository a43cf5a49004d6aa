/* What the C case programs (dsl_cases.c, tile_cases.c, plan_operand_cases.c) share: one line per case,
 * "<case> <status name> | <cg_last_error()>", and loading a blob file as a case (a failed load must leave
 * the plan handle NULL, which is reported as <case>_out_not_null FAIL). */
#ifndef CUDNN_GRAPH_TESTS_CASE_REPORT_H
#define CUDNN_GRAPH_TESTS_CASE_REPORT_H

#include <stdio.h>
#include <stdlib.h>

#include <cudnn_graph/cudnn_graph.h>

#include "../../examples/c/read_file.h"

static void report(const char *name, cg_status_t status) {
    printf("%s %s | %s\n", name, cg_status_name(status), status == CG_STATUS_SUCCESS ? "" : cg_last_error());
}

/* Load the blob at folder/file on device 0 as case `name`: the plan, or NULL when the load failed. */
static cg_plan_t load_case(const char *folder, const char *file, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", folder, file);
    size_t size = 0;
    void *blob = read_file(path, &size);
    if (!blob) { fprintf(stderr, "cannot read %s\n", path); exit(2); }
    cg_plan_t plan = (cg_plan_t)0x1;
    cg_status_t status = cg_plan_load(blob, size, 0, &plan);
    free(blob);
    report(name, status);
    if (status != CG_STATUS_SUCCESS && plan != NULL) printf("%s_out_not_null FAIL |\n", name);
    return status == CG_STATUS_SUCCESS ? plan : NULL;
}

#endif
