/* A whole file read into malloc'ed memory (NULL if it cannot be opened): shared by the example and the
 * C benchmark loop, which both read a blob and raw operand files written by Python. */
#ifndef CG_EXAMPLE_READ_FILE_H
#define CG_EXAMPLE_READ_FILE_H
#include <stdio.h>
#include <stdlib.h>

static inline void *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *data = malloc(n > 0 ? (size_t)n : 1);
    *size = fread(data, 1, (size_t)n, f);
    fclose(f);
    return data;
}

#endif
