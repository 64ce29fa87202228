#!/usr/bin/env python3
"""Regenerates fuzz/corpus/: small safetensors file images, valid ones and one per kind of damage.
Hand-written JSON (not a safetensors library) so the seeds do not depend on the code under test."""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus")


def image(header_text, data=b"", pad=True):
    raw = header_text.encode()
    if pad:
        raw += b" " * ((8 - len(raw) % 8) % 8)
    return struct.pack("<Q", len(raw)) + raw + data


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def valid_files():
    two = {"__metadata__": {"format": "pt"},
           "a": entry("F32", [2, 2], 0, 16), "b": entry("BF16", [3], 16, 22)}
    yield "valid_two_tensors", image(json.dumps(two), bytes(range(22)))

    sizes = {"F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "U8": 1, "I8": 1, "I32": 4,
             "I64": 8, "BOOL": 1}
    hdr, off = {}, 0
    for name, size in sizes.items():
        hdr["t_" + name.lower()] = entry(name, [2], off, off + 2 * size)
        off += 2 * size
    yield "valid_all_dtypes", image(json.dumps(hdr), bytes(off))

    scalar = {"scalar": entry("F32", [], 0, 4), "empty": entry("BF16", [0, 5], 4, 4)}
    yield "valid_scalar_and_empty", image(json.dumps(scalar), b"\0\0\x80?")

    nvfp4 = {"__metadata__": {"format": "pt", "quant": "nvfp4"},
             "w.weight": entry("U8", [4, 8], 0, 32),
             "w.weight_scale": entry("F8_E4M3", [4, 1], 32, 36),
             "w.weight_scale_2": entry("F32", [], 36, 40),
             "w.input_scale": entry("F32", [], 40, 44)}
    yield "valid_nvfp4_like", image(json.dumps(nvfp4), bytes(44))

    yield "valid_empty_header", image("{}")


def broken_files():
    a = {"a": entry("F32", [2], 0, 8)}
    yield "broken_too_short", b"\x08\0\0"
    yield "broken_header_cut", image(json.dumps(a), bytes(8))[:20]
    yield "broken_data_cut", image(json.dumps(a), bytes(4))
    yield "broken_header_len_huge", struct.pack("<Q", 1 << 40) + b"{}"
    yield "broken_not_json", image("{not json", bytes(8))
    yield "broken_top_array", image("[1, 2]")
    yield "broken_missing_dtype", image('{"a":{"shape":[2],"data_offsets":[0,8]}}', bytes(8))
    yield "broken_unknown_dtype", image(json.dumps({"a": entry("F64", [1], 0, 8)}), bytes(8))
    yield "broken_negative_shape", image(json.dumps({"a": entry("F32", [-2], 0, 8)}), bytes(8))
    yield "broken_size_mismatch", image(json.dumps({"a": entry("F32", [3], 0, 8)}), bytes(8))
    yield "broken_overlap", image(json.dumps({"a": entry("F32", [2], 0, 8),
                                              "b": entry("F32", [2], 4, 12)}), bytes(12))
    yield "broken_duplicate_name", image('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                         '"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}',
                                         bytes(2))
    yield "broken_metadata_number", image('{"__metadata__":{"format":1}}')
    yield "broken_shape_overflow", image(json.dumps(
        {"a": entry("F32", [4294967296, 4294967296, 4], 0, 0)}))
    yield "broken_deep_nesting", image("[" * 64 + "]" * 64)


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, data in list(valid_files()) + list(broken_files()):
        with open(os.path.join(OUT, name + ".safetensors"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
