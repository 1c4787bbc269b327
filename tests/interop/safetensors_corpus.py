"""The malformed (and borderline valid) safetensors corpus of the differential suite.

Each case is a whole file: the 8-byte little-endian header length, the header bytes, then
the data section. Headers are written as text so that duplicate keys, odd whitespace and
broken JSON can be expressed. Which cases the reference accepts is not recorded here: the
reference implementation (safetensors 0.8.0) decides that when the suite runs.

    python3 safetensors_corpus.py OUT_DIR   writes every case to OUT_DIR/<name>

The committed copy lives in tests/fuzz/corpus/safetensors/reference/, where the fuzz
replay driver also runs it; interop_safetensors_malformed fails when that copy and this
generator disagree. Needs only the standard library.
"""
import os
import struct
import sys

SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "F16": 2, "BF16": 2, "U32": 4,
         "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1}

CASES = {}


def raw(name, blob):
    assert name not in CASES, name
    CASES[name] = blob


def case(name, header, data=b""):
    """A file whose header length is right for `header` (str or bytes)."""
    h = header.encode("utf-8") if isinstance(header, str) else header
    raw(name, struct.pack("<Q", len(h)) + h + data)


def T(name, dtype, shape, begin, end, extra=""):
    """One tensor entry, as header text."""
    return '"%s":{"dtype":"%s","shape":%s,"data_offsets":[%s,%s]%s}' % (name, dtype, shape, begin, end, extra)


def obj(*entries):
    return "{" + ",".join(entries) + "}"


U8_1 = T("a", "U8", "[1]", 0, 1)
F32_2 = T("a", "F32", "[2]", 0, 8)


def build():
    # Accepted by both: the shapes of valid files keepsake must read.
    case("valid_empty", "{}")
    case("valid_padded", "{}" + " " * 62)
    case("valid_whitespace", ' \n\t{ "a" :\r\n{ "dtype" : "U8" , "shape" : [ 1 ] , "data_offsets" : [ 0 , 1 ] } }\n', b"\x07")
    case("valid_meta_only", '{"__metadata__":{"format":"pt","k":""}}')
    case("valid_meta_null", obj('"__metadata__":null', U8_1), b"\x01")
    case("valid_meta_empty", obj('"__metadata__":{}', U8_1), b"\x01")
    case("valid_meta_last", obj(U8_1, '"__metadata__":{"x":"y"}'), b"\x01")
    case("valid_meta_escaped_key", obj('"\\u005f_metadata__":{"x":"y"}', U8_1), b"\x01")
    case("valid_meta_escapes", obj('"__metadata__":{"q\\"\\\\\\/":"\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00"}', U8_1), b"\x01")
    case("valid_0d", obj(T("s", "F32", "[]", 0, 4)), struct.pack("<f", 1.5))
    case("valid_empty_tensor", obj(T("e", "F32", "[0]", 0, 0), T("f", "I64", "[2,0,3]", 0, 0)))
    case("valid_empty_between", obj(T("a", "U8", "[1]", 0, 1), T("e", "F64", "[0,4]", 1, 1), T("b", "U8", "[1]", 1, 2)), b"\x01\x02")
    case("valid_empty_at_end", obj(U8_1, T("e", "BOOL", "[0]", 1, 1)), b"\x01")
    case("valid_unordered", obj(T("b", "U8", "[2]", 4, 6), T("a", "F32", "[1]", 0, 4)), bytes(6))
    entries, data, off = [], b"", 0
    for d, size in SIZES.items():
        entries.append(T(d.lower(), d, "[3]", off, off + 3 * size))
        data += bytes(range(off, off + 3 * size))
        off += 3 * size
    case("valid_all_dtypes", obj(*entries), data)
    case("valid_field_order", '{"a":{"data_offsets":[0,2],"shape":[1],"dtype":"F16"}}', b"\x00\x3c")
    case("valid_uppercase_hex_escape", obj(T("\\u00E9\\u00e9", "U8", "[1]", 0, 1)), b"\x01")
    case("valid_empty_same_offset", obj(T("e", "U8", "[0]", 0, 0), T("f", "I32", "[0]", 0, 0), T("a", "I32", "[1]", 0, 4)),
         bytes(4))
    case("valid_rank_8", obj(T("r", "U8", "[1,1,1,1,1,1,1,1]", 0, 1)), b"\x01")
    case("valid_unknown_fields", obj(T("a", "U8", "[1]", 0, 1, ',"x":{"y":[1,-2.5e-3,true,false,null,"s"]},"x":0')), b"\x01")
    case("valid_unknown_negative_zero", obj(T("a", "U8", "[1]", 0, 1, ',"x":-0,"y":-9223372036854775809')), b"\x01")
    case("valid_unknown_big_int", obj(T("a", "U8", "[1]", 0, 1, ',"x":123456789012345678901234567890')), b"\x01")
    case("valid_unknown_max_double", obj(T("a", "U8", "[1]", 0, 1, ',"x":1.7976931348623157e308,"y":1e-999')), b"\x01")
    case("valid_unknown_long_max", obj(T("a", "U8", "[1]", 0, 1, ',"x":17976931348623157' + "0" * 292)), b"\x01")
    case("valid_unknown_tiny_exponent", obj(T("a", "U8", "[1]", 0, 1, ',"x":1e-2147483649,"y":0e2147483648')), b"\x01")
    case("valid_unknown_nul", obj(T("a", "U8", "[1]", 0, 1, ',"x":"\\u0000"')), b"\x01")
    case("valid_depth_127", obj(T("a", "U8", "[1]", 0, 1, ',"x":' + "[" * 125 + "1" + "]" * 125)), b"\x01")
    case("valid_escaped_name", obj(T("caf\\u00e9\\/\\n\\t\\\"", "U8", "[1]", 0, 1)), b"\x01")
    case("valid_utf8_name", obj(T("w\u00e9ight\u2603\U0001F600\uffff", "U8", "[1]", 0, 1)), b"\x01")
    case("valid_surrogate_pair_name", obj(T("\\ud83d\\ude00", "U8", "[1]", 0, 1)), b"\x01")
    case("valid_del_in_name", obj(T("a\x7fb", "U8", "[1]", 0, 1)), b"\x01")
    case("valid_name_1024", obj(T("n" * 1024, "U8", "[1]", 0, 1)), b"\x01")
    case("valid_zero_dim_then_huge", obj(T("z", "U8", "[0,4294967296,4294967296]", 0, 0)))
    case("valid_dim_int64_max", obj(T("z", "U8", "[9223372036854775807,0]", 0, 0)))
    case("valid_keepsake_meta", obj('"__metadata__":{"keepsake.format":"keepsake","keepsake.format_version":"1",'
                                    '"keepsake.scalars":"{\\"step\\":3}","keepsake.checksums":"{}"}'))

    # Rejected by both: the 8-byte length prefix.
    raw("short_empty_file", b"")
    raw("short_7_bytes", b"\x02\x00\x00\x00\x00\x00\x00")
    case("length_zero", "")
    raw("length_past_eof", struct.pack("<Q", 100) + b"{}")
    raw("length_over_limit", struct.pack("<Q", 100_000_001) + b"{}")
    raw("length_u64_max", struct.pack("<Q", 2**64 - 1) + b"{}")
    raw("length_cuts_object", struct.pack("<Q", 1) + b"{}")

    # Rejected by both: bytes that are not UTF-8 or not JSON.
    case("utf8_invalid_byte", b'{"a\xff":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x01")
    case("utf8_overlong", b'{"a\xc0\x80":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x01")
    case("utf8_encoded_surrogate", b'{"a\xed\xa0\x80":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x01")
    case("utf8_truncated", b'{"__metadata__":{"a":"\xe2\x82"}}')
    case("utf8_above_u10ffff", b'{"a\xf4\x90\x80\x80":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x01")
    case("json_bom", "\ufeff{}")
    case("json_not_json", "hello")
    case("json_top_array", "[]")
    case("json_top_string", '"x"')
    case("json_top_null", "null")
    case("json_garbage_after", "{} x")
    case("json_second_object", "{}{}")
    case("json_nul_padding", b"{}\x00\x00")
    case("json_trailing_comma", obj(U8_1)[:-1] + ",}", b"\x01")
    case("json_single_quotes", "{'a':{}}")
    case("json_unterminated", '{"a":{"dtype":"U8"')
    case("json_raw_newline_in_name", obj(T("a\nb", "U8", "[1]", 0, 1)), b"\x01")
    case("json_raw_tab_in_meta", '{"__metadata__":{"a":"x\ty"}}')
    case("json_raw_nul_in_name", obj(T("a\x00b", "U8", "[1]", 0, 1)), b"\x01")
    case("json_bad_escape", obj(T("a\\x", "U8", "[1]", 0, 1)), b"\x01")
    case("json_bad_u_escape", obj(T("a\\u12g4", "U8", "[1]", 0, 1)), b"\x01")
    case("json_lone_high_surrogate", obj(T("a\\ud800", "U8", "[1]", 0, 1)), b"\x01")
    case("json_lone_low_surrogate", obj(T("a\\udc00", "U8", "[1]", 0, 1)), b"\x01")
    case("json_bad_literal", obj(T("a", "U8", "[1]", 0, 1, ',"x":nul')), b"\x01")
    case("json_bad_number", obj(T("a", "U8", "[1]", 0, 1, ',"x":01')), b"\x01")
    case("json_plus_number", obj(T("a", "U8", "[1]", 0, 1, ',"x":+1')), b"\x01")
    case("json_number_overflow", obj(T("a", "U8", "[1]", 0, 1, ',"x":1e999')), b"\x01")
    case("json_negative_overflow", obj(T("a", "U8", "[1]", 0, 1, ',"x":-1e309')), b"\x01")
    case("json_long_integer_overflow", obj(T("a", "U8", "[1]", 0, 1, ',"x":1' + "0" * 400)), b"\x01")
    case("json_just_above_max_double", obj(T("a", "U8", "[1]", 0, 1, ',"x":1.8e308')), b"\x01")
    case("json_max_double_next", obj(T("a", "U8", "[1]", 0, 1, ',"x":1.7976931348623158e308')), b"\x01")
    case("json_exponent_overflow", obj(T("a", "U8", "[1]", 0, 1, ',"x":1e2147483648')), b"\x01")
    case("json_depth_128", obj(T("a", "U8", "[1]", 0, 1, ',"x":' + "[" * 126 + "]" * 126)), b"\x01")
    case("json_depth_huge", obj(T("a", "U8", "[1]", 0, 1, ',"x":' + "[" * 5000 + "]" * 5000)), b"\x01")

    # Rejected by both: the structure of the header.
    case("meta_not_object", '{"__metadata__":[]}')
    case("meta_string", '{"__metadata__":"x"}')
    case("meta_value_number", '{"__metadata__":{"a":1}}')
    case("meta_value_null", '{"__metadata__":{"a":null}}')
    case("meta_value_object", '{"__metadata__":{"a":{}}}')
    case("meta_duplicate_object", '{"__metadata__":{},"__metadata__":{}}')
    case("meta_duplicate_escaped", '{"__metadata__":{},"\\u005f_metadata__":{}}')
    case("meta_key_case_is_a_tensor", '{"__METADATA__":{"a":"b"}}')
    case("dtype_with_nul", obj(T("a", "U8\\u0000", "[1]", 0, 1)), b"\x01")
    case("entry_array", '{"a":[]}')
    case("entry_null", '{"a":null}')
    case("entry_string", '{"a":"U8"}')
    case("missing_dtype", '{"a":{"shape":[1],"data_offsets":[0,1]}}', b"\x01")
    case("missing_shape", '{"a":{"dtype":"U8","data_offsets":[0,1]}}', b"\x01")
    case("missing_offsets", '{"a":{"dtype":"U8","shape":[1]}}', b"\x01")
    case("duplicate_dtype", '{"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x01")
    case("duplicate_shape", '{"a":{"dtype":"U8","shape":[1],"shape":[1],"data_offsets":[0,1]}}', b"\x01")
    case("duplicate_offsets", '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"data_offsets":[0,1]}}', b"\x01")
    case("dtype_unknown", obj(T("a", "F128", "[1]", 0, 1)), b"\x01")
    case("dtype_lowercase", obj(T("a", "f32", "[2]", 0, 8)), bytes(8))
    case("dtype_number", '{"a":{"dtype":4,"shape":[1],"data_offsets":[0,1]}}', b"\x01")
    case("dtype_sub_byte_misaligned", obj(T("a", "F4", "[3]", 0, 2)), bytes(2))
    case("shape_negative", obj(T("a", "U8", "[-1]", 0, 1)), b"\x01")
    case("shape_negative_zero", obj(T("a", "U8", "[-0]", 0, 0)))
    case("shape_float", obj(T("a", "U8", "[1.0]", 0, 1)), b"\x01")
    case("shape_exponent", obj(T("a", "U8", "[1e0]", 0, 1)), b"\x01")
    case("shape_string", obj(T("a", "U8", '["1"]', 0, 1)), b"\x01")
    case("shape_nested", obj(T("a", "U8", "[[1]]", 0, 1)), b"\x01")
    case("shape_not_array", obj(T("a", "U8", "1", 0, 1)), b"\x01")
    case("shape_null", obj(T("a", "U8", "null", 0, 1)), b"\x01")
    case("shape_above_u64", obj(T("a", "U8", "[0,18446744073709551616]", 0, 0)))
    case("shape_overflow", obj(T("a", "F32", "[4294967296,4294967296]", 0, 4)), bytes(4))
    case("shape_overflow_then_zero", obj(T("a", "U8", "[4294967296,4294967296,0]", 0, 0)))
    case("offsets_negative", obj(T("a", "U8", "[1]", -1, 0)), b"\x01")
    case("offsets_float", obj(T("a", "U8", "[1]", "0.0", 1)), b"\x01")
    case("offsets_three", obj(T("a", "U8", "[1]", 0, "1,1")), b"\x01")
    case("offsets_one", '{"a":{"dtype":"U8","shape":[1],"data_offsets":[1]}}', b"\x01")
    case("offsets_empty", '{"a":{"dtype":"U8","shape":[0],"data_offsets":[]}}')
    case("offsets_object", '{"a":{"dtype":"U8","shape":[1],"data_offsets":{"0":0,"1":1}}}', b"\x01")
    case("offsets_reversed", obj(T("a", "U8", "[1]", 1, 0)), b"\x01")
    case("offsets_above_u64", obj(T("a", "U8", "[0]", "18446744073709551616", "18446744073709551616")))
    case("offsets_leading_zero", obj(T("a", "U8", "[1]", "00", 1)), b"\x01")

    # Rejected by both: the data section.
    case("size_too_small", obj(T("a", "F32", "[2]", 0, 4)), bytes(4))
    case("size_too_large", obj(T("a", "F32", "[1]", 0, 8)), bytes(8))
    case("hole_at_start", obj(T("a", "U8", "[1]", 1, 2)), bytes(2))
    case("hole_between", obj(T("a", "U8", "[1]", 0, 1), T("b", "U8", "[1]", 2, 3)), bytes(3))
    case("overlap", obj(T("a", "U8", "[2]", 0, 2), T("b", "U8", "[2]", 1, 3)), bytes(3))
    case("trailing_bytes", obj(U8_1), b"\x01\x02")
    case("trailing_bytes_no_tensors", "{}", b"\x00")
    case("data_truncated", obj(F32_2), bytes(5))
    case("empty_tensor_past_end", obj(U8_1, T("e", "U8", "[0]", 5, 5)), b"\x01")
    case("duplicate_name_moved", obj(T("a", "U8", "[1]", 0, 1), T("a", "U8", "[1]", 1, 2)), bytes(2))

    # Accepted by the reference, refused by keepsake on purpose (docs/FORMAT.md, section 5.1).
    case("diff_duplicate_tensor", obj(U8_1, U8_1), b"\x01")
    case("diff_duplicate_meta_key", '{"__metadata__":{"a":"1","a":"2"}}')
    case("diff_nul_in_name", obj(T("a\\u0000b", "U8", "[1]", 0, 1)), b"\x01")
    case("diff_nul_in_meta_value", '{"__metadata__":{"a":"x\\u0000y"}}')
    case("diff_empty_name", obj(T("", "U8", "[1]", 0, 1)), b"\x01")
    case("diff_name_1025", obj(T("n" * 1025, "U8", "[1]", 0, 1)), b"\x01")
    case("diff_rank_9", obj(T("r", "U8", "[1,1,1,1,1,1,1,1,1]", 0, 1)), b"\x01")
    case("diff_dim_above_int64", obj(T("z", "U8", "[18446744073709551615,0]", 0, 0)))
    case("diff_dtype_f8_e8m0", obj(T("a", "F8_E8M0", "[2]", 0, 2)), bytes(2))
    case("dtype_c64", obj(T("a", "C64", "[1]", 0, 8)), bytes(8))
    case("diff_dtype_f4", obj(T("a", "F4", "[2]", 0, 1)), bytes(1))
    case("diff_keepsake_other_format", '{"__metadata__":{"keepsake.format":"other"}}')
    case("diff_keepsake_future_version", '{"__metadata__":{"keepsake.format":"keepsake","keepsake.format_version":"2"}}')
    case("diff_keepsake_bad_version", '{"__metadata__":{"keepsake.format":"keepsake","keepsake.format_version":"1a"}}')
    case("diff_keepsake_bad_scalars", '{"__metadata__":{"keepsake.format":"keepsake","keepsake.format_version":"1",'
                                      '"keepsake.scalars":"[1]"}}')
    return CASES


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: safetensors_corpus.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, blob in build().items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(blob)
    print(f"wrote {len(CASES)} cases to {out}")


if __name__ == "__main__":
    main()
