/* The C reader of the plan blob (docs/plan_format.md, versions 1 to 4). It trusts nothing: every field is
 * read with a bounds check, in the order the format prescribes (magic, format version, total size,
 * checksum, then the rest), and every finding is a status with a message, never a crash. */
#include <stdlib.h>
#include <string.h>

#include "cg_internal.h"

static const char blob_magic[8] = {'C', 'D', 'N', 'G', 'P', 'L', 'A', 'N'};

static uint16_t read_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t read_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t read_u64(const uint8_t *p) { return (uint64_t)read_u32(p) | ((uint64_t)read_u32(p + 4) << 32); }
static int64_t read_i64(const uint8_t *p) { return (int64_t)read_u64(p); }
static size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

uint32_t cg_crc32(const uint8_t *data, size_t size, size_t skip_at) {
    /* zlib's CRC-32 (reflected 0xEDB88320); the four bytes at skip_at read as zero (the checksum field). */
    uint32_t table[256];
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        table[i] = c;
    }
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < size; i++) {
        uint8_t byte = (i >= skip_at && i < skip_at + 4) ? 0 : data[i];
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8);
    }
    return crc ^ 0xFFFFFFFFu;
}

static void release_dsl_kernels(cg_blob_t *blob) {
    for (uint32_t i = 0; i < blob->n_dsl_kernels; i++) {
        cg_dsl_kernel_t *k = &blob->dsl_kernels[i];
        if (k->pointers)
            for (uint16_t j = 0; j < k->n_pointers; j++) free(k->pointers[j].name);
        free(k->pointers);
        free(k->scalars);
        free(k->ints);
        free(k->entry_symbol);
        free(k->function_prefix);
        free(k->runtime_hint);
        if (k->tile.addresses)
            for (uint16_t j = 0; j < k->tile.n_addresses; j++) free(k->tile.addresses[j].name);
        free(k->tile.addresses);
        free(k->tile.parameters);
        free(k->tile.image);
    }
    free(blob->dsl_kernels);
    blob->dsl_kernels = NULL;
    blob->n_dsl_kernels = 0;
}

void cg_blob_release(cg_blob_t *blob) {
    release_dsl_kernels(blob);
    if (blob->plan_operands) {
        for (uint32_t i = 0; i < blob->n_plan_operands; i++) free(blob->plan_operands[i].data);
        free(blob->plan_operands);
    }
    blob->plan_operands = NULL;
    blob->n_plan_operands = 0;
    if (blob->records) {
        for (uint32_t i = 0; i < blob->n_records; i++) {
            free(blob->records[i].dims);
            free(blob->records[i].name);
        }
        free(blob->records);
    }
    blob->records = NULL;
    blob->n_records = 0;
}

static int is_power_of_two(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

static cg_status_t parse_tensors(const uint8_t *data, size_t size, cg_blob_t *blob) {
    if (size < 8) return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: the tensor table is cut short (%zu bytes)", size);
    uint32_t count = read_u32(data);
    if (count > CG_MAX_OPERANDS || (size_t)count * 24 > size - 8)
        return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: the tensor table says %u tensors in %zu bytes (corrupt)",
                       count, size);
    blob->records = calloc(count ? count : 1, sizeof *blob->records);
    if (!blob->records) return cg_fail(CG_STATUS_OUT_OF_MEMORY, "plan blob: no memory for %u tensors", count);
    size_t at = 8;
    for (uint32_t i = 0; i < count; i++) {
        if (size - at < 24)
            return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: the tensor table is cut short at tensor %u", i);
        cg_record_t *r = &blob->records[i];
        blob->n_records = i + 1;       /* so cg_blob_release frees what this row allocates */
        const uint8_t *p = data + at;
        r->uid = read_i64(p);
        r->data_type = (int32_t)read_u32(p + 8);
        r->is_virtual = p[12];
        r->is_pass_by_value = p[13];
        size_t name_length = read_u16(p + 14);
        r->alignment = read_u32(p + 16);
        r->rank = read_u32(p + 20);
        at += 24;
        if (r->rank > CG_BLOB_MAX_RANK)
            return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: tensor uid %lld has rank %u (at most %d; corrupt)",
                           (long long)r->uid, r->rank, CG_BLOB_MAX_RANK);
        size_t need = 16 * (size_t)r->rank + pad8(name_length);
        if (size - at < need)
            return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: the tensor table is cut short at tensor uid %lld",
                           (long long)r->uid);
        r->dims = malloc((2 * r->rank + 1) * sizeof(int64_t));
        r->name = malloc(name_length + 1);
        if (!r->dims || !r->name) return cg_fail(CG_STATUS_OUT_OF_MEMORY, "plan blob: no memory for a tensor");
        r->strides = r->dims + r->rank;
        for (uint32_t d = 0; d < 2 * r->rank; d++) r->dims[d] = read_i64(data + at + 8 * d);
        at += 16 * (size_t)r->rank;
        memcpy(r->name, data + at, name_length);
        r->name[name_length] = 0;
        at += pad8(name_length);
        for (uint32_t d = 0; d < r->rank; d++)
            if (r->dims[d] < 0)
                return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: tensor '%s' (uid %lld) has dimension %u = %lld "
                               "(corrupt)", r->name, (long long)r->uid, d, (long long)r->dims[d]);
        if (r->alignment != 0 && !is_power_of_two(r->alignment))
            return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: tensor '%s' (uid %lld) requires %u-byte alignment, "
                           "not a power of two (corrupt)", r->name, (long long)r->uid, r->alignment);
        for (uint32_t j = 0; j < i; j++)
            if (blob->records[j].uid == r->uid)
                return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: uid %lld appears twice in the tensor table "
                               "('%s' and '%s'; corrupt)", (long long)r->uid, blob->records[j].name, r->name);
    }
    return CG_STATUS_SUCCESS;
}

static const char *operand_kind_name(uint16_t kind) {
    switch (kind) {
    case CG_OPERAND_HOST_CONSTANT: return "host constant";
    case CG_OPERAND_DEVICE_CONSTANT: return "device constant";
    case CG_OPERAND_ALIAS: return "alias";
    case CG_OPERAND_SCRATCH: return "scratch";
    case CG_OPERAND_WITHHELD: return "withheld";
    }
    return NULL;
}

static const cg_record_t *record_of(const cg_blob_t *blob, int64_t uid) {
    for (uint32_t i = 0; i < blob->n_records; i++)
        if (blob->records[i].uid == uid) return &blob->records[i];
    return NULL;
}

/* The checks of _plan_blob._check_plan_operand, so both readers refuse the same sections. */
static cg_status_t check_plan_operand(const cg_blob_t *blob, const cg_plan_operand_t *op) {
    const char *kind = operand_kind_name(op->kind);
    long long uid = (long long)op->uid;
    const cg_record_t *row = record_of(blob, op->uid);
    int is_operand = row != NULL && !row->is_virtual;
    uint16_t known = op->kind == CG_OPERAND_HOST_CONSTANT ? CG_OPERAND_FLAG_GRAPH_SCALAR
                     : (op->kind == CG_OPERAND_SCRATCH ? CG_OPERAND_FLAG_ZERO_FILL : 0);
    if (op->flags & ~known)
        return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: plan operand uid %lld (%s): flags 0x%x (corrupt; field "
                       "plan operands)", uid, kind, op->flags);
    switch (op->kind) {
    case CG_OPERAND_HOST_CONSTANT:
        if (op->size < 1 || op->size > CG_MAX_HOST_CONSTANT_BYTES)
            return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: plan operand uid %lld (%s): a scalar of %zu bytes (1 to "
                           "%d; corrupt; field plan operands)", uid, kind, op->size, CG_MAX_HOST_CONSTANT_BYTES);
        if ((op->flags & CG_OPERAND_FLAG_GRAPH_SCALAR) && !(is_operand && row->is_pass_by_value))
            return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: plan operand uid %lld (%s): a graph scalar whose uid is "
                           "no pass-by-value tensor of the table (corrupt; field plan operands)", uid, kind);
        break;
    case CG_OPERAND_DEVICE_CONSTANT:
        if (op->size < 1 || (int64_t)op->size > op->nbytes || op->nbytes > CG_MAX_DEVICE_BYTES)
            return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: plan operand uid %lld (%s): %zu bytes of data for %lld "
                           "bytes of device memory (corrupt; field plan operands)", uid, kind, op->size,
                           (long long)op->nbytes);
        break;
    case CG_OPERAND_SCRATCH:
        if (op->nbytes < 0 || op->nbytes > CG_MAX_DEVICE_BYTES || op->size)
            return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: plan operand uid %lld (%s): %lld bytes (corrupt; field "
                           "plan operands)", uid, kind, (long long)op->nbytes);
        break;
    case CG_OPERAND_ALIAS: {
        const cg_record_t *source = record_of(blob, op->source_uid);
        if (!source || source->is_virtual || source->is_pass_by_value || op->byte_offset < 0 || op->size)
            return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: plan operand uid %lld (%s): a view of uid %lld at byte "
                           "offset %lld, which is no device operand of the tensor table (corrupt; field plan "
                           "operands)", uid, kind, (long long)op->source_uid, (long long)op->byte_offset);
        break;
    }
    default: break;
    }
    if (op->kind == CG_OPERAND_WITHHELD) {
        if (!is_operand || op->size)
            return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: plan operand uid %lld (%s): not an operand of the tensor "
                           "table (corrupt; field plan operands)", uid, kind);
    } else if (is_operand && !(op->flags & CG_OPERAND_FLAG_GRAPH_SCALAR)) {
        return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: plan operand uid %lld (%s): the uid of the caller operand "
                       "'%s' (corrupt; field plan operands)", uid, kind, row->name);
    }
    return CG_STATUS_SUCCESS;
}

static cg_status_t parse_plan_operands(const uint8_t *data, size_t size, cg_blob_t *blob) {
    if (size < 8)
        return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: the plan-operand section is cut short (%zu bytes; field "
                       "plan operands)", size);
    uint32_t count = read_u32(data);
    if (count > CG_MAX_PLAN_OPERANDS || (size_t)count * CG_OPERAND_HEAD_SIZE > size - 8)
        return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: the plan-operand section says %u operands in %zu bytes "
                       "(at most %d; corrupt; field plan operands)", count, size, CG_MAX_PLAN_OPERANDS);
    blob->plan_operands = calloc(count ? count : 1, sizeof *blob->plan_operands);
    if (!blob->plan_operands) return cg_fail(CG_STATUS_OUT_OF_MEMORY, "plan blob: no memory for plan operands");
    size_t at = 8;
    for (uint32_t i = 0; i < count; i++) {
        if (size - at < CG_OPERAND_HEAD_SIZE)
            return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: the plan-operand section is cut short at operand %u "
                           "(field plan operands)", i);
        cg_plan_operand_t *op = &blob->plan_operands[i];
        blob->n_plan_operands = i + 1;     /* so cg_blob_release frees what this row allocates */
        const uint8_t *p = data + at;
        op->kind = read_u16(p);
        op->flags = read_u16(p + 2);
        op->data_type = (int32_t)read_u32(p + 4);
        op->uid = read_i64(p + 8);
        int64_t a = read_i64(p + 16), b = read_i64(p + 24);
        uint64_t length = read_u64(p + 32);
        at += CG_OPERAND_HEAD_SIZE;
        if (!operand_kind_name(op->kind))
            return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: plan operand uid %lld: unknown kind %u (corrupt; field "
                           "plan operands)", (long long)op->uid, op->kind);
        if (length > size - at || pad8((size_t)length) > size - at)
            return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: the plan-operand section is cut short at operand uid "
                           "%lld (field plan operands)", (long long)op->uid);
        if (op->kind == CG_OPERAND_ALIAS) {
            op->source_uid = a;
            op->byte_offset = b;
        } else {
            op->nbytes = a;
        }
        op->size = (size_t)length;
        op->data = malloc(op->size ? op->size : 1);
        if (!op->data) return cg_fail(CG_STATUS_OUT_OF_MEMORY, "plan blob: no memory for a plan operand");
        memcpy(op->data, data + at, op->size);
        at += pad8(op->size);
        cg_status_t status = check_plan_operand(blob, op);
        if (status != CG_STATUS_SUCCESS) return status;
        for (uint32_t j = 0; j < i; j++) {
            const cg_plan_operand_t *other = &blob->plan_operands[j];
            if (other->uid == op->uid &&
                (other->kind == CG_OPERAND_WITHHELD) == (op->kind == CG_OPERAND_WITHHELD))
                return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: plan operand uid %lld appears twice (corrupt; field "
                               "plan operands)", (long long)op->uid);
        }
    }
    return CG_STATUS_SUCCESS;
}

/* ---- section 7: DSL launches (the checks of _plan_launch.unpack_launch, in its order) ---- */

typedef struct {
    const uint8_t *data;
    size_t size, at;
} cursor_t;

/* n bytes (then the zero padding to 8) from the cursor, or NULL when the section is cut short. */
static const uint8_t *take(cursor_t *c, size_t n) {
    if (pad8(n) < n || pad8(n) > c->size - c->at) return NULL;
    const uint8_t *p = c->data + c->at;
    c->at += pad8(n);
    return p;
}

static char *copy_text(const uint8_t *p, size_t n) {
    char *out = malloc(n + 1);
    if (out) {
        memcpy(out, p, n);
        out[n] = 0;
    }
    return out;
}

static int is_identifier(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint8_t ch = p[i];
        int alpha = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || ch == '_';
        if (!alpha && !(i > 0 && ch >= '0' && ch <= '9')) return 0;
    }
    return n > 0;
}

#define DSL_FAIL(...) cg_fail(CG_STATUS_BAD_BLOB, "plan blob: " __VA_ARGS__)
#define DSL_SHORT(i, what) DSL_FAIL("the DSL launch section is cut short at DSL launch kernel %u%s (corrupt; field " \
                                    "DSL launch)", i, what)

/* A section-7 string: a C identifier when `symbol` (the entry, the prefix), else any bytes (a path). */
static cg_status_t read_text(cursor_t *c, size_t n, uint32_t index, const char *what, int symbol, char **out) {
    const uint8_t *p = take(c, n);
    if (!p) return DSL_SHORT(index, what);
    if (symbol && !is_identifier(p, n))
        return DSL_FAIL("DSL launch kernel %u: %s is not a C identifier (corrupt; field DSL launch)", index, what);
    *out = copy_text(p, n);
    return *out ? CG_STATUS_SUCCESS : cg_fail(CG_STATUS_OUT_OF_MEMORY, "plan blob: no memory for %s", what);
}

static int convention_slots(uint16_t convention, uint16_t *pointers, uint16_t *scalars, uint16_t *ints) {
    switch (convention) {
    case CG_CONVENTION_CUTE_PACKED: *pointers = 6; *scalars = 3; *ints = 4; return 1;
    case CG_CONVENTION_CUTILE_PARAMS: *pointers = 0; *scalars = 0; *ints = 0; return 1;   /* its launch follows */
    default: return 0;
    }
}

/* The first format version that may hold `convention` (_plan_launch.CONVENTION_FORMAT_VERSIONS). */
static uint16_t convention_format_version(uint16_t convention) {
    return convention == CG_CONVENTION_CUTILE_PARAMS ? CG_BLOB_FORMAT_VERSION_TILE_LAUNCH
                                                     : CG_BLOB_FORMAT_VERSION_DSL_LAUNCH;
}

/* The checks of _plan_launch._check_tile, in its order and words. */
static cg_status_t check_tile(const cg_blob_t *blob, const cg_tile_params_t *t, uint32_t index) {
    const uint32_t *g = t->grid, *b = t->block;
    if (g[0] < 1 || g[0] > CG_TILE_MAX_GRID_X || g[1] < 1 || g[1] > CG_TILE_MAX_GRID_YZ || g[2] < 1 ||
        g[2] > CG_TILE_MAX_GRID_YZ)
        return DSL_FAIL("DSL launch kernel %u: grid (%u, %u, %u) (x 1 to %u, y and z 1 to %u; corrupt; field DSL "
                        "launch)", index, g[0], g[1], g[2], CG_TILE_MAX_GRID_X, CG_TILE_MAX_GRID_YZ);
    if (b[0] < 1 || b[1] < 1 || b[2] < 1 || (uint64_t)b[0] * b[1] * b[2] > CG_TILE_MAX_BLOCK_THREADS ||
        t->shared_bytes > CG_TILE_MAX_SHARED_BYTES)
        return DSL_FAIL("DSL launch kernel %u: block (%u, %u, %u) with %u bytes of shared memory (at most %u threads "
                        "and %u bytes; corrupt; field DSL launch)", index, b[0], b[1], b[2], t->shared_bytes,
                        CG_TILE_MAX_BLOCK_THREADS, CG_TILE_MAX_SHARED_BYTES);
    const uint32_t *offsets = t->parameters, *sizes = t->parameters + t->n_parameters;
    uint64_t end = 0;
    for (uint16_t i = 0; i < t->n_parameters; i++) {
        uint64_t at = offsets[i], stop = (uint64_t)offsets[i] + sizes[i];
        if (sizes[i] < 1 || at < end || stop > t->image_size)
            return DSL_FAIL("DSL launch kernel %u: parameter %u is bytes %llu..%llu of the %u-byte image (parameters "
                            "lie inside it, in order, apart; corrupt; field DSL launch)", index, i,
                            (unsigned long long)at, (unsigned long long)stop, t->image_size);
        end = stop;
    }
    for (uint16_t i = 0; i < t->n_addresses; i++) {
        const cg_tile_address_t *a = &t->addresses[i];
        int on_pointer = 0;
        for (uint16_t j = 0; j < t->n_parameters && !on_pointer; j++)
            on_pointer = offsets[j] == a->offset && sizes[j] == 8;
        if (!on_pointer)
            return DSL_FAIL("DSL launch kernel %u: address %u ('%s') goes at image offset %u, which is no 8-byte "
                            "parameter (corrupt; field DSL launch)", index, i, a->name, a->offset);
        for (uint16_t j = 0; j < i; j++)
            if (t->addresses[j].offset == a->offset)
                return DSL_FAIL("DSL launch kernel %u: address %u ('%s') writes image offset %u again (corrupt; field "
                                "DSL launch)", index, i, a->name, a->offset);
        if (a->alignment & (a->alignment - 1))
            return DSL_FAIL("DSL launch kernel %u: address %u ('%s') requires %u-byte alignment, not a power of two "
                            "(corrupt; field DSL launch)", index, i, a->name, a->alignment);
        if (a->source == CG_TILE_ADDRESS_WORKSPACE) {
            if (a->add < 0 || (uint64_t)a->add >= t->workspace_size)
                return DSL_FAIL("DSL launch kernel %u: address %u ('%s') is workspace + %lld, outside the kernel's "
                                "%llu-byte workspace (corrupt; field DSL launch)", index, i, a->name,
                                (long long)a->add, (unsigned long long)t->workspace_size);
            continue;
        }
        if (a->add)
            return DSL_FAIL("DSL launch kernel %u: address %u ('%s') adds %lld bytes to operand uid %lld's pointer, "
                            "which is passed as it is (corrupt; field DSL launch)", index, i, a->name,
                            (long long)a->add, (long long)a->uid);
        const cg_record_t *row = record_of(blob, a->uid);
        if (!row || row->is_virtual || row->is_pass_by_value)
            return DSL_FAIL("DSL launch kernel %u: address %u ('%s') is uid %lld, no device operand of the tensor "
                            "table (corrupt; field DSL launch)", index, i, a->name, (long long)a->uid);
    }
    return CG_STATUS_SUCCESS;
}

/* A convention-2 kernel's launch (after its head; checked by check_tile once the record is read). */
static cg_status_t parse_tile(cursor_t *c, uint32_t index, cg_tile_params_t *t) {
    const uint8_t *p = take(c, CG_TILE_HEAD_SIZE);
    if (!p) return DSL_SHORT(index, "'s launch");
    for (int i = 0; i < 3; i++) {
        t->grid[i] = read_u32(p + 4 * i);
        t->block[i] = read_u32(p + 12 + 4 * i);
    }
    t->shared_bytes = read_u32(p + 24);
    t->image_size = read_u32(p + 28);
    t->n_parameters = read_u16(p + 32);
    t->n_addresses = read_u16(p + 34);
    uint32_t reserved = read_u32(p + 36);
    t->workspace_size = read_u64(p + 40);
    if (reserved || t->image_size < 1 || t->image_size > CG_TILE_MAX_IMAGE || t->n_parameters < 1 ||
        t->n_parameters > CG_TILE_MAX_PARAMETERS || t->n_addresses > CG_TILE_MAX_ADDRESSES ||
        t->workspace_size > (uint64_t)CG_MAX_DEVICE_BYTES)
        return DSL_FAIL("DSL launch kernel %u: a %u-byte parameter image with %u parameters, %u addresses and %llu "
                        "bytes of workspace (1 to %d bytes, 1 to %d parameters, at most %d addresses; corrupt; field "
                        "DSL launch)", index, t->image_size, t->n_parameters, t->n_addresses,
                        (unsigned long long)t->workspace_size, CG_TILE_MAX_IMAGE, CG_TILE_MAX_PARAMETERS,
                        CG_TILE_MAX_ADDRESSES);
    t->parameters = calloc(2 * (size_t)t->n_parameters, sizeof *t->parameters);
    t->addresses = calloc(t->n_addresses ? t->n_addresses : 1, sizeof *t->addresses);
    t->image = malloc(t->image_size);
    if (!t->parameters || !t->addresses || !t->image) {
        t->n_addresses = 0;      /* nothing to free per address */
        return cg_fail(CG_STATUS_OUT_OF_MEMORY, "plan blob: no memory for a cuTile launch");
    }
    for (uint16_t i = 0; i < t->n_parameters; i++) {
        if (!(p = take(c, 8))) return DSL_SHORT(index, ", a parameter");
        t->parameters[i] = read_u32(p);
        t->parameters[t->n_parameters + i] = read_u32(p + 4);
    }
    for (uint16_t i = 0; i < t->n_addresses; i++) {
        cg_tile_address_t *a = &t->addresses[i];
        if (!(p = take(c, CG_TILE_ADDRESS_SIZE))) return DSL_SHORT(index, ", an address");
        a->uid = read_i64(p);
        a->add = read_i64(p + 8);
        a->offset = read_u32(p + 16);
        a->alignment = read_u32(p + 20);
        a->source = read_u16(p + 24);
        size_t n_name = read_u16(p + 26);
        uint32_t areserved = read_u32(p + 28);
        if ((a->source != CG_TILE_ADDRESS_OPERAND && a->source != CG_TILE_ADDRESS_WORKSPACE) || areserved ||
            n_name > CG_DSL_MAX_NAME || (a->source == CG_TILE_ADDRESS_WORKSPACE && a->uid))
            return DSL_FAIL("DSL launch kernel %u: address %u has source %u, uid %lld and a %zu-byte name (corrupt; "
                            "field DSL launch)", index, i, a->source, (long long)a->uid, n_name);
        cg_status_t status = read_text(c, n_name, index, "an address's name", 0, &a->name);
        if (status != CG_STATUS_SUCCESS) return status;
    }
    if (!(p = take(c, t->image_size))) return DSL_SHORT(index, "'s parameter image");
    memcpy(t->image, p, t->image_size);
    return CG_STATUS_SUCCESS;
}

static cg_status_t check_dsl_kernel(const cg_blob_t *blob, const cg_dsl_kernel_t *k, uint32_t index) {
    for (uint16_t i = 0; i < k->n_pointers; i++) {
        const cg_dsl_pointer_t *p = &k->pointers[i];
        if (p->alignment & (p->alignment - 1))
            return DSL_FAIL("DSL launch kernel %u: pointer slot %u ('%s') requires %u-byte alignment, not a power of "
                            "two (corrupt; field DSL launch)", index, i, p->name, p->alignment);
        if (p->bound) {
            const cg_record_t *row = record_of(blob, p->uid);
            if (!row || row->is_virtual || row->is_pass_by_value)
                return DSL_FAIL("DSL launch kernel %u: pointer slot %u ('%s') is uid %lld, no device operand of the "
                                "tensor table (corrupt; field DSL launch)", index, i, p->name, (long long)p->uid);
        }
    }
    for (uint16_t i = 0; i < k->n_scalars; i++) {
        const cg_dsl_scalar_t *s = &k->scalars[i];
        if (s->kind == CG_DSL_SCALAR_FIXED) {
            if (s->value != s->value || s->value - s->value != 0)
                return DSL_FAIL("DSL launch kernel %u: scalar slot %u is fixed at a value that is not finite "
                                "(corrupt; field DSL launch)", index, i);
            continue;
        }
        if (s->read_type != 0 && s->read_type != 1)
            return DSL_FAIL("DSL launch kernel %u: scalar slot %u reads data type %d; FLOAT (0) or DOUBLE (1) "
                            "(corrupt; field DSL launch)", index, i, s->read_type);
        const cg_record_t *row = record_of(blob, s->uid);
        if (!row || row->is_virtual || !row->is_pass_by_value)
            return DSL_FAIL("DSL launch kernel %u: scalar slot %u is uid %lld, no pass-by-value operand of the "
                            "tensor table (corrupt; field DSL launch)", index, i, (long long)s->uid);
    }
    if (k->convention == CG_CONVENTION_CUTE_PACKED)
        for (uint16_t i = 0; i < k->n_ints; i++)
            if (k->ints[i] < INT32_MIN || k->ints[i] > INT32_MAX)
                return DSL_FAIL("DSL launch kernel %u: int slot %u = %lld does not fit the entry's int32 (corrupt; "
                                "field DSL launch)", index, i, (long long)k->ints[i]);
    if (k->convention == CG_CONVENTION_CUTILE_PARAMS) return check_tile(blob, &k->tile, index);
    return CG_STATUS_SUCCESS;
}

static cg_status_t parse_dsl_kernel(cursor_t *c, cg_blob_t *blob, const uint8_t *kernels, size_t kernels_size,
                                    uint32_t index, uint16_t version, cg_dsl_kernel_t *k) {
    const uint8_t *p = take(c, 48);
    if (!p) return DSL_SHORT(index, "");
    k->convention = read_u16(p);
    uint16_t flags = read_u16(p + 2);
    k->n_pointers = read_u16(p + 4);
    k->n_scalars = read_u16(p + 6);
    k->n_ints = read_u16(p + 8);
    size_t n_symbol = read_u16(p + 10), n_prefix = read_u16(p + 12), n_hint = read_u16(p + 14);
    k->placeholder = read_u64(p + 16);
    uint64_t code_offset = read_u64(p + 24), code_size = read_u64(p + 32);
    uint16_t want_pointers, want_scalars, want_ints;
    if (!convention_slots(k->convention, &want_pointers, &want_scalars, &want_ints))
        return DSL_FAIL("DSL launch kernel %u: unknown calling convention %u (corrupt, or a newer writer; field DSL "
                        "launch)", index, k->convention);
    if (version < convention_format_version(k->convention))
        return DSL_FAIL("DSL launch kernel %u: calling convention %u in a format-%u blob (it needs format version %u; "
                        "corrupt; field DSL launch)", index, k->convention, version,
                        convention_format_version(k->convention));
    if (flags & ~CG_DSL_FLAG_CODE_IN_KERNELS)
        return DSL_FAIL("DSL launch kernel %u: flags 0x%x (corrupt; field DSL launch)", index, flags);
    if (k->n_pointers != want_pointers || k->n_scalars != want_scalars || k->n_ints != want_ints)
        return DSL_FAIL("DSL launch kernel %u: %u pointer, %u scalar and %u int slots; convention %u takes %u, %u and "
                        "%u (corrupt; field DSL launch)", index, k->n_pointers, k->n_scalars, k->n_ints,
                        k->convention, want_pointers, want_scalars, want_ints);
    int tile = k->convention == CG_CONVENTION_CUTILE_PARAMS;
    if (tile && (n_prefix || n_hint || k->placeholder))
        return DSL_FAIL("DSL launch kernel %u: a %zu-byte function prefix, %zu-byte runtime hint and placeholder "
                        "0x%llx; convention %u has none (corrupt; field DSL launch)", index, n_prefix, n_hint,
                        (unsigned long long)k->placeholder, k->convention);
    if (n_symbol < 1 || n_symbol > CG_DSL_MAX_SYMBOL || (!tile && (n_prefix < 1 || n_prefix > CG_DSL_MAX_SYMBOL)) ||
        n_hint > CG_DSL_MAX_HINT)
        return DSL_FAIL("DSL launch kernel %u: a %zu-byte entry symbol, %zu-byte function prefix or %zu-byte "
                        "runtime hint (corrupt; field DSL launch)", index, n_symbol, n_prefix, n_hint);
    k->pointers = calloc(k->n_pointers ? k->n_pointers : 1, sizeof *k->pointers);
    k->scalars = calloc(k->n_scalars ? k->n_scalars : 1, sizeof *k->scalars);
    k->ints = calloc(k->n_ints ? k->n_ints : 1, sizeof *k->ints);
    if (!k->pointers || !k->scalars || !k->ints)
        return cg_fail(CG_STATUS_OUT_OF_MEMORY, "plan blob: no memory for a DSL launch");
    for (uint16_t i = 0; i < k->n_pointers; i++) {
        cg_dsl_pointer_t *slot = &k->pointers[i];
        if (!(p = take(c, 16))) return DSL_SHORT(index, ", a pointer slot");
        slot->uid = read_i64(p);
        slot->alignment = read_u32(p + 8);
        uint16_t pflags = read_u16(p + 12);
        size_t n_name = read_u16(p + 14);
        if ((pflags & ~CG_DSL_FLAG_POINTER_BOUND) || n_name > CG_DSL_MAX_NAME)
            return DSL_FAIL("DSL launch kernel %u: pointer slot %u has flags 0x%x and a %zu-byte name (corrupt; field "
                            "DSL launch)", index, i, pflags, n_name);
        slot->bound = (pflags & CG_DSL_FLAG_POINTER_BOUND) != 0;
        cg_status_t status = read_text(c, n_name, index, "a pointer slot's name", 0, &slot->name);
        if (status != CG_STATUS_SUCCESS) return status;
    }
    for (uint16_t i = 0; i < k->n_scalars; i++) {
        cg_dsl_scalar_t *slot = &k->scalars[i];
        if (!(p = take(c, 24))) return DSL_SHORT(index, ", a scalar slot");
        slot->uid = read_i64(p);
        slot->kind = read_u16(p + 8);
        uint16_t sflags = read_u16(p + 10);
        slot->read_type = (int32_t)read_u32(p + 12);
        uint64_t bits = read_u64(p + 16);
        memcpy(&slot->value, &bits, sizeof bits);
        if ((slot->kind != CG_DSL_SCALAR_OPERAND && slot->kind != CG_DSL_SCALAR_FIXED) || sflags)
            return DSL_FAIL("DSL launch kernel %u: scalar slot %u has kind %u and flags 0x%x (corrupt; field DSL "
                            "launch)", index, i, slot->kind, sflags);
    }
    for (uint16_t i = 0; i < k->n_ints; i++) {
        if (!(p = take(c, 8))) return DSL_SHORT(index, ", an int slot");
        k->ints[i] = read_i64(p);
    }
    cg_status_t status = tile ? parse_tile(c, index, &k->tile) : CG_STATUS_SUCCESS;
    if (status == CG_STATUS_SUCCESS) status = read_text(c, n_symbol, index, "the entry symbol", 1, &k->entry_symbol);
    if (status == CG_STATUS_SUCCESS)
        status = read_text(c, n_prefix, index, "the function prefix", !tile, &k->function_prefix);
    if (status == CG_STATUS_SUCCESS) status = read_text(c, n_hint, index, "the runtime hint", 0, &k->runtime_hint);
    if (status != CG_STATUS_SUCCESS) return status;
    if (code_size == 0) return DSL_FAIL("DSL launch kernel %u: no code (corrupt; field DSL launch)", index);
    if (flags & CG_DSL_FLAG_CODE_IN_KERNELS) {
        if (code_offset > kernels_size || code_size > kernels_size - code_offset)
            return DSL_FAIL("DSL launch kernel %u: its code is bytes %llu..%llu of the kernels section, which has %zu "
                            "bytes (corrupt; field DSL launch)", index, (unsigned long long)code_offset,
                            (unsigned long long)(code_offset + code_size), kernels_size);
        k->code = kernels + code_offset;
    } else {
        if (code_offset)
            return DSL_FAIL("DSL launch kernel %u: inline code at offset %llu (corrupt; field DSL launch)", index,
                            (unsigned long long)code_offset);
        if (code_size > c->size || !(k->code = take(c, (size_t)code_size))) return DSL_SHORT(index, "'s code");
    }
    k->code_size = (size_t)code_size;
    return check_dsl_kernel(blob, k, index);
}

static cg_status_t parse_dsl_launch(const uint8_t *data, size_t size, const uint8_t *kernels, size_t kernels_size,
                                    uint16_t version, cg_blob_t *blob) {
    cursor_t c = {data, size, 0};
    const uint8_t *head = take(&c, 8);
    if (!head)
        return DSL_FAIL("the DSL launch section is cut short at its head (corrupt; field DSL launch)");
    uint32_t count = read_u32(head);
    if (count < 1 || count > CG_DSL_MAX_KERNELS)
        return DSL_FAIL("the DSL launch section says %u kernels (1 to %d; corrupt; field DSL launch)", count,
                        CG_DSL_MAX_KERNELS);
    if (version < CG_BLOB_FORMAT_VERSION_TILE_LAUNCH && count > CG_DSL_MAX_KERNELS_V3)
        return DSL_FAIL("the DSL launch section says %u kernels in a format-%u blob (1 to %d before format version %d; "
                        "corrupt; field DSL launch)", count, version, CG_DSL_MAX_KERNELS_V3,
                        CG_BLOB_FORMAT_VERSION_TILE_LAUNCH);
    blob->dsl_kernels = calloc(count, sizeof *blob->dsl_kernels);
    if (!blob->dsl_kernels) return cg_fail(CG_STATUS_OUT_OF_MEMORY, "plan blob: no memory for a DSL launch");
    for (uint32_t i = 0; i < count; i++) {
        blob->n_dsl_kernels = i + 1;     /* so cg_blob_release frees what this kernel allocates */
        cg_status_t status = parse_dsl_kernel(&c, blob, kernels, kernels_size, i, version, &blob->dsl_kernels[i]);
        if (status != CG_STATUS_SUCCESS) return status;
    }
    if (c.at != size)
        return DSL_FAIL("the DSL launch section has %zu bytes past its last kernel (corrupt; field DSL launch)",
                        size - c.at);
    return CG_STATUS_SUCCESS;
}

cg_status_t cg_blob_parse(const uint8_t *data, size_t size, cg_blob_t *blob) {
    memset(blob, 0, sizeof *blob);
    if (size < sizeof blob_magic || memcmp(data, blob_magic, sizeof blob_magic) != 0)
        return cg_fail(CG_STATUS_BAD_BLOB, "not a cudnn_graph plan blob: it does not start with the magic "
                       "'CDNGPLAN' (field magic; %zu bytes given)", size);
    if (size < CG_BLOB_HEADER_SIZE)
        return cg_fail(CG_STATUS_BAD_BLOB, "the plan blob is truncated: %zu bytes, shorter than its %d-byte "
                       "header (field total_size)", size, CG_BLOB_HEADER_SIZE);
    uint16_t version = read_u16(data + 8);
    if (version < CG_BLOB_FORMAT_VERSION || version > CG_BLOB_FORMAT_VERSION_NEWEST)
        return cg_fail(CG_STATUS_VERSION_MISMATCH, "the plan blob is format version %u; this runtime reads "
                       "versions %d to %d (field format version): serialize the plan again", version,
                       CG_BLOB_FORMAT_VERSION, CG_BLOB_FORMAT_VERSION_NEWEST);
    uint64_t total = read_u64(data + 48);
    if (total != size)
        return cg_fail(CG_STATUS_BAD_BLOB, "the plan blob is %zu bytes, its header says %llu (truncated or "
                       "padded; field total_size)", size, (unsigned long long)total);
    if (cg_crc32(data, size, 56) != read_u32(data + 56))
        return cg_fail(CG_STATUS_BAD_BLOB, "the plan blob's checksum does not match its contents (corrupt; "
                       "field checksum)");
    uint16_t header_size = read_u16(data + 10);
    uint32_t count = read_u32(data + 60);
    if (header_size != CG_BLOB_HEADER_SIZE || count > CG_BLOB_MAX_SECTIONS ||
        (uint64_t)header_size + (uint64_t)CG_BLOB_SECTION_ENTRY_SIZE * count > total)
        return cg_fail(CG_STATUS_BAD_BLOB, "the plan blob's header is malformed (%u-byte header, %u sections; "
                       "field header_size)", header_size, count);
    blob->format_version = version;
    blob->flags = read_u32(data + 12);
    blob->library_version = read_u32(data + 16);
    blob->cudnn_version = read_u32(data + 20);
    blob->arch = read_u32(data + 24);
    blob->engine_family = read_u16(data + 28);
    blob->engine_id = read_i64(data + 32);
    blob->workspace_size = read_u64(data + 40);
    const uint8_t *tensors = NULL, *operands = NULL, *launch = NULL, *kernels = NULL;
    size_t tensors_size = 0, operands_size = 0, launch_size = 0, kernels_size = 0;
    for (uint32_t i = 0; i < count; i++) {
        const uint8_t *entry = data + header_size + (size_t)CG_BLOB_SECTION_ENTRY_SIZE * i;
        uint32_t kind = read_u32(entry);
        uint64_t offset = read_u64(entry + 8), length = read_u64(entry + 16);
        if (offset > total || length > total - offset)
            return cg_fail(CG_STATUS_BAD_BLOB, "plan blob: section %u runs past the end of the blob (field "
                           "sections)", kind);
        const uint8_t *body = data + offset;
        switch (kind) {        /* kinds this runtime does not use are skipped, as the format says */
        case CG_SECTION_TENSORS: tensors = body; tensors_size = (size_t)length; break;
        case CG_SECTION_PLAN: blob->recipe = body; blob->recipe_size = (size_t)length; break;
        case CG_SECTION_CUDNN_PLAN: blob->cudnn_plan = body; blob->cudnn_plan_size = (size_t)length; break;
        case CG_SECTION_PLAN_OPERANDS: operands = body; operands_size = (size_t)length; break;
        case CG_SECTION_KERNELS: kernels = body; kernels_size = (size_t)length; break;
        case CG_SECTION_DSL_LAUNCH: launch = body; launch_size = (size_t)length; break;
        default: break;
        }
    }
    if (!tensors) return cg_fail(CG_STATUS_BAD_BLOB, "the plan blob has no tensor table (field tensors)");
    cg_status_t status = parse_tensors(tensors, tensors_size, blob);
    if (status == CG_STATUS_SUCCESS && operands) {
        if (version < CG_BLOB_FORMAT_VERSION_PLAN_OPERANDS)
            status = cg_fail(CG_STATUS_BAD_BLOB, "plan blob: a format-%u blob with a plan-operand section (section "
                             "%d needs format version %d; corrupt; field plan operands)", version,
                             CG_SECTION_PLAN_OPERANDS, CG_BLOB_FORMAT_VERSION_PLAN_OPERANDS);
        else
            status = parse_plan_operands(operands, operands_size, blob);
    }
    if (status == CG_STATUS_SUCCESS && launch) {
        if (version < CG_BLOB_FORMAT_VERSION_DSL_LAUNCH)
            status = cg_fail(CG_STATUS_BAD_BLOB, "plan blob: a format-%u blob with a DSL launch section (section %d "
                             "needs format version %d; corrupt; field DSL launch)", version, CG_SECTION_DSL_LAUNCH,
                             CG_BLOB_FORMAT_VERSION_DSL_LAUNCH);
        else
            status = parse_dsl_launch(launch, launch_size, kernels ? kernels : (const uint8_t *)"", kernels_size,
                                      version, blob);
    }
    if (status != CG_STATUS_SUCCESS) cg_blob_release(blob);
    return status;
}

void cg_blob_engine_name(const cg_blob_t *blob, char *out, size_t capacity) {
    /* The recipe is JSON that the Python writer emits compactly ("engine":"<name>"); an engine name is an
     * identifier, so a plain scan finds it. Anything else leaves the name empty (it is only for messages). */
    static const char key[] = "\"engine\":\"";
    out[0] = 0;
    if (!blob->recipe || capacity == 0) return;
    size_t n = blob->recipe_size, k = sizeof key - 1;
    for (size_t i = 0; i + k <= n; i++) {
        if (memcmp(blob->recipe + i, key, k) != 0) continue;
        size_t j = 0;
        for (size_t at = i + k; at < n && blob->recipe[at] != '"' && j + 1 < capacity; at++, j++)
            out[j] = (char)blob->recipe[at];
        out[j] = 0;
        return;
    }
}
