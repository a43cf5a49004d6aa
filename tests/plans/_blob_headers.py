"""Test helper: a plan blob with some header fields replaced and its checksum made right again (a
well-formed blob of another version / architecture, not a corrupt one)."""
from __future__ import annotations

import struct
import zlib

from cudnn_graph import _plan_blob

FIELDS = ["magic", "format_version", "header_size", "flags", "library_version", "cudnn_version", "arch",
          "engine_family", "reserved", "engine_id", "workspace_size", "total_size", "checksum", "section_count"]


def with_header(blob: bytes, **fields) -> bytes:
    values = dict(zip(FIELDS, _plan_blob.HEADER.unpack_from(blob, 0)))
    values.update(fields, checksum=0)
    data = bytearray(_plan_blob.HEADER.pack(*[values[n] for n in FIELDS]) + blob[_plan_blob.HEADER.size:])
    struct.pack_into("<I", data, 56, zlib.crc32(data))
    return bytes(data)
