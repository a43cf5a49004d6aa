/* The C reader of the plan blob (docs/plan_format.md, version 1). It trusts nothing: every field is
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

void cg_blob_release(cg_blob_t *blob) {
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

cg_status_t cg_blob_parse(const uint8_t *data, size_t size, cg_blob_t *blob) {
    memset(blob, 0, sizeof *blob);
    if (size < sizeof blob_magic || memcmp(data, blob_magic, sizeof blob_magic) != 0)
        return cg_fail(CG_STATUS_BAD_BLOB, "not a cudnn_graph plan blob: it does not start with the magic "
                       "'CDNGPLAN' (field magic; %zu bytes given)", size);
    if (size < CG_BLOB_HEADER_SIZE)
        return cg_fail(CG_STATUS_BAD_BLOB, "the plan blob is truncated: %zu bytes, shorter than its %d-byte "
                       "header (field total_size)", size, CG_BLOB_HEADER_SIZE);
    uint16_t version = read_u16(data + 8);
    if (version != CG_BLOB_FORMAT_VERSION)
        return cg_fail(CG_STATUS_VERSION_MISMATCH, "the plan blob is format version %u; this runtime reads only "
                       "version %d (field format version): serialize the plan again", version,
                       CG_BLOB_FORMAT_VERSION);
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
    blob->flags = read_u32(data + 12);
    blob->library_version = read_u32(data + 16);
    blob->cudnn_version = read_u32(data + 20);
    blob->arch = read_u32(data + 24);
    blob->engine_family = read_u16(data + 28);
    blob->engine_id = read_i64(data + 32);
    blob->workspace_size = read_u64(data + 40);
    const uint8_t *tensors = NULL;
    size_t tensors_size = 0;
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
        default: break;
        }
    }
    if (!tensors) return cg_fail(CG_STATUS_BAD_BLOB, "the plan blob has no tensor table (field tensors)");
    cg_status_t status = parse_tensors(tensors, tensors_size, blob);
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
