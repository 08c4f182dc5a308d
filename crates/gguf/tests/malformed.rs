//! Malformed files: truncations, bad header fields, absurd counts and lengths, bad tensor
//! infos. Every case must return an error whose message names the problem, never panic.

mod support;

use sift_gguf::{Gguf, GgufError, MetaValue};
use support::{assert_msg, sample_builder, GgufBuilder, Writer};

/// The real model's header plus the start of its data section.
const REAL_PREFIX: usize = 2 << 20;

/// Offset just past the GGUF string `s` (u64 length + bytes) in `bytes`.
fn after_string(bytes: &[u8], s: &str) -> usize {
    let mut needle = (s.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(s.as_bytes());
    let pos = bytes.windows(needle.len()).position(|w| w == needle).unwrap_or_else(|| panic!("{s} not found"));
    pos + needle.len()
}

fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// A minimal v3 file with one metadata pair written by `kv`.
fn one_kv(kv: impl FnOnce(&mut Writer)) -> Vec<u8> {
    let mut w = Writer::new();
    w.header(3, 0, 1);
    kv(&mut w);
    w.buf
}

/// A v3 file with one F32-typed tensor info whose fields are given raw, plus `data` bytes.
fn one_tensor(name: &[u8], dims: &[u64], type_id: u32, offset: u64, data: usize) -> Vec<u8> {
    let mut w = Writer::new();
    w.header(3, 1, 0).str_bytes(name).u32(dims.len() as u32);
    for &d in dims {
        w.u64(d);
    }
    w.u32(type_id).u64(offset).pad_to(32);
    w.buf.resize(w.buf.len() + data, 0);
    w.buf
}

#[test]
fn synthetic_truncated_at_every_cut() {
    let built = sample_builder().build();
    let bytes = &built.bytes;
    assert!(Gguf::parse(bytes).is_ok());
    for cut in 0..bytes.len() {
        let res = Gguf::parse(&bytes[..cut]);
        if cut < built.tensor_infos_end {
            assert_msg(res, &["truncated", "the download may be incomplete"]);
        } else {
            assert_msg(res, &["past the end of the file", &format!("(size {cut})")]);
        }
    }
}

#[test]
fn real_header_truncated_at_many_cuts() {
    let bytes = support::smollm_prefix(REAL_PREFIX);
    let data_offset = 1_785_664;
    let mut cuts: Vec<usize> = (0..2048).collect();
    cuts.extend((2048..data_offset).step_by(7919));
    // Dense cuts through the last part of the tensor table (each parses all the metadata).
    cuts.extend((data_offset - 2048..data_offset - 32).step_by(11));
    for cut in cuts {
        let msg = Gguf::parse(&bytes[..cut]).unwrap_err().to_string();
        assert!(msg.contains("truncated"), "cut {cut}: {msg}");
        assert!(msg.contains("the download may be incomplete"), "cut {cut}: {msg}");
        assert!(msg.contains(&format!("file is {cut} bytes")) || msg.contains(" claims "), "cut {cut}: {msg}");
    }
    // A cut in the data section: the header parses, the first tensor does not fit.
    assert_msg(
        Gguf::parse(&bytes),
        &[
            "tensor 'token_embd.weight' data [1785664, 31866688) lies past the end of the file",
            &format!("(size {REAL_PREFIX})"),
        ],
    );
}

#[test]
fn truncation_messages_name_the_field() {
    assert_msg(Gguf::parse(b"GG"), &["needed 4 bytes at offset 0 to read the magic bytes, file is 2 bytes"]);
    assert_msg(Gguf::parse(b"GGUF\x03\x00"), &["the version"]);
    assert_msg(Gguf::parse(b"GGUF\x03\x00\x00\x00\x01\x00"), &["the tensor count"]);
    let bytes = support::smollm_prefix(REAL_PREFIX);
    let at = after_string(&bytes, "tokenizer.ggml.tokens") + 4 + 4 + 8;
    assert_msg(
        Gguf::parse(&bytes[..at + 100]),
        &["metadata array 'tokenizer.ggml.tokens' claims 49152 elements but only 100 bytes remain", "truncated"],
    );
    assert_msg(
        Gguf::parse(&bytes[..at + 400_000]),
        &["needed", "an element of metadata array 'tokenizer.ggml.tokens'", "truncated GGUF file"],
    );
    let at = after_string(&bytes, "output_norm.weight");
    assert_msg(
        Gguf::parse(&bytes[..at + 10]),
        &["needed 8 bytes", "to read dimension 0 of tensor 'output_norm.weight'"],
    );
    assert_msg(Gguf::parse(&bytes[..at + 4 + 8 + 3]), &["the ggml type of tensor 'output_norm.weight'"]);
}

#[test]
fn bad_magic() {
    assert_msg(
        Gguf::parse(b"PK\x03\x04 zip archive..."),
        &["not a GGUF file: magic is 'PK\\x03\\x04' (expected 'GGUF')", "zip"],
    );
    assert_msg(Gguf::parse(b"SIFT\x01\x00\x00\x00"), &["not a GGUF file", "'SIFT'", "pass a .gguf model file"]);
    assert_msg(Gguf::parse(b"tjgg\x01\x00\x00\x00"), &["legacy GGML"]);
    let mut real = support::smollm_prefix(4096);
    real[0] = b'g';
    let err = Gguf::parse(&real).unwrap_err();
    assert!(matches!(err, GgufError::BadMagic { found } if &found == b"gGUF"));
}

#[test]
fn unsupported_and_big_endian_versions() {
    let mut w = Writer::new();
    w.header(1, 0, 0);
    assert_msg(Gguf::parse(&w.buf), &["unsupported GGUF version 1", "v1 is obsolete", "re-convert"]);
    for v in [0, 4, 99, 0xFFFF_FFFF] {
        let mut w = Writer::new();
        w.header(v, 0, 0);
        assert_msg(Gguf::parse(&w.buf), &[&format!("unsupported GGUF version {v} ")]);
    }
    let mut w = Writer::new();
    w.header(4, 0, 0);
    assert_msg(Gguf::parse(&w.buf), &["needs a newer sift"]);
    for v in [2u32, 3] {
        let mut real = support::smollm_prefix(4096);
        put_u32(&mut real, 4, v.swap_bytes());
        let err = Gguf::parse(&real).unwrap_err();
        assert!(matches!(err, GgufError::BigEndian { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("big-endian") && msg.contains(&format!("0x0{v}000000")), "{msg}");
    }
}

#[test]
fn huge_counts_are_rejected_before_allocating() {
    let real = support::smollm_prefix(REAL_PREFIX);
    for n in [u64::MAX, 1 << 60, REAL_PREFIX as u64] {
        let mut b = real.clone();
        put_u64(&mut b, 8, n);
        assert_msg(Gguf::parse(&b), &["the header claims", &format!("{n} tensors but only")]);
        let mut b = real.clone();
        put_u64(&mut b, 16, n);
        assert_msg(Gguf::parse(&b), &["the header claims", &format!("{n} metadata entries")]);
    }
    // The tokens array count: type 9, element type 8, count.
    let at = after_string(&real, "tokenizer.ggml.tokens") + 8;
    let mut b = real.clone();
    put_u64(&mut b, at, 1 << 60);
    assert_msg(
        Gguf::parse(&b),
        &["metadata array 'tokenizer.ggml.tokens' claims 1152921504606846976 elements but only", "bytes remain"],
    );
    // A count that fits the bytes left for 1-byte items but not for 8-byte string headers.
    let remaining = (REAL_PREFIX - at - 8) as u64;
    put_u64(&mut b, at, remaining / 2);
    assert_msg(Gguf::parse(&b), &["claims", "at least 8 bytes"]);
    // Nested arrays with a huge inner count.
    let bytes = one_kv(|w| {
        w.str("nest").u32(9).u32(9).u64(1).u32(0).u64(u64::MAX);
    });
    assert_msg(Gguf::parse(&bytes), &["metadata array 'nest' claims 18446744073709551615 elements"]);
}

#[test]
fn huge_string_lengths() {
    let real = support::smollm_prefix(REAL_PREFIX);
    // Length of the value of general.architecture.
    let at = after_string(&real, "general.architecture") + 4;
    let mut b = real.clone();
    put_u64(&mut b, at, u64::MAX);
    assert_msg(
        Gguf::parse(&b),
        &["truncated GGUF file: needed 18446744073709551615 bytes", "the value of metadata key 'general.architecture'"],
    );
    // Length of a key.
    let at = after_string(&real, "general.architecture") - "general.architecture".len() - 8;
    let mut b = real.clone();
    put_u64(&mut b, at, 1 << 40);
    assert_msg(Gguf::parse(&b), &["needed 1099511627776 bytes", "the key of metadata entry #0"]);
    // Length of a tensor name.
    let at = after_string(&real, "token_embd.weight") - "token_embd.weight".len() - 8;
    let mut b = real;
    put_u64(&mut b, at, u64::MAX - 3);
    assert_msg(Gguf::parse(&b), &["truncated", "the name of tensor #0"]);
}

#[test]
fn tensor_offsets_past_the_end() {
    let bytes = one_tensor(b"w", &[4], 0, 0, 16);
    assert!(Gguf::parse(&bytes).is_ok());
    let bytes = one_tensor(b"w", &[4], 0, 32, 16);
    assert_msg(Gguf::parse(&bytes), &["tensor 'w' data [96, 112) lies past the end of the file (size 80)"]);
    let bytes = one_tensor(b"w", &[4], 0, u64::MAX - 31, 16);
    assert_msg(Gguf::parse(&bytes), &["tensor 'w' data [", "past the end"]);
    let bytes = one_tensor(b"w", &[1 << 40, 1 << 20], 0, 0, 16);
    assert_msg(Gguf::parse(&bytes), &["past the end"]);
    // The real file's last tensor moved past the end.
    let f = sift_gguf::GgufFile::open(support::smollm_path()).unwrap();
    let mut bytes = f.bytes().to_vec();
    let at = after_string(&bytes[..f.gguf.data_offset as usize], "output_norm.weight") + 4 + 8 + 4;
    put_u64(&mut bytes, at, 1 << 50);
    assert_msg(Gguf::parse(&bytes), &["tensor 'output_norm.weight' data [", "past the end"]);
}

#[test]
fn unaligned_offsets() {
    let bytes = one_tensor(b"w", &[4], 0, 4, 64);
    assert_msg(Gguf::parse(&bytes), &["tensor 'w' data offset 4 is not a multiple of the alignment 32"]);
    let f = sift_gguf::GgufFile::open(support::smollm_path()).unwrap();
    let mut bytes = f.bytes()[..f.gguf.data_offset as usize].to_vec();
    let at = after_string(&bytes, "blk.0.attn_q.weight") + 4 + 16 + 4;
    put_u64(&mut bytes, at, 32_020_993);
    assert_msg(Gguf::parse(&bytes), &["'blk.0.attn_q.weight' data offset 32020993 is not a multiple"]);
}

/// An offset moved by the alignment stays aligned and inside the file but reads the next
/// tensor's bytes (bench/file_probe.py found it accepted).
#[test]
fn overlapping_tensors() {
    let f = sift_gguf::GgufFile::open(support::smollm_path()).unwrap();
    let mut bytes = f.bytes().to_vec();
    let at = after_string(&bytes[..f.gguf.data_offset as usize], "blk.0.attn_q.weight") + 4 + 16 + 4;
    let old = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    put_u64(&mut bytes, at, old + 32);
    assert_msg(Gguf::parse(&bytes), &["overlap", "blk.0.attn_q.weight", "the file is corrupt"]);
}

#[test]
fn unknown_value_types() {
    let bytes = one_kv(|w| {
        w.str("k.bad").u32(13).u32(0);
    });
    assert_msg(Gguf::parse(&bytes), &["metadata key 'k.bad' has unknown value type 13 at offset 37"]);
    let bytes = one_kv(|w| {
        w.str("k.arr").u32(9).u32(99).u64(0);
    });
    assert_msg(Gguf::parse(&bytes), &["'k.arr' has unknown value type 99"]);
    let real = support::smollm_prefix(REAL_PREFIX);
    let at = after_string(&real, "llama.block_count");
    let mut b = real;
    put_u32(&mut b, at, 0xDEAD);
    assert_msg(Gguf::parse(&b), &["'llama.block_count' has unknown value type 57005"]);
}

#[test]
fn unknown_tensor_types() {
    let f = sift_gguf::GgufFile::open(support::smollm_path()).unwrap();
    let header = &f.bytes()[..f.gguf.data_offset as usize];
    for id in [99, 4, 5, 31, 40, u32::MAX] {
        let mut b = header.to_vec();
        let at = after_string(&b, "blk.0.attn_q.weight") + 4 + 16;
        put_u32(&mut b, at, id);
        assert_msg(
            Gguf::parse(&b),
            &[&format!("tensor 'blk.0.attn_q.weight' has unknown ggml type id {id}; this file needs a newer sift")],
        );
    }
}

#[test]
fn bad_alignment() {
    for v in [
        MetaValue::U32(0),
        MetaValue::U32(3),
        MetaValue::U32(24),
        MetaValue::U64(1 << 40),
        MetaValue::I32(-32),
        MetaValue::String("32".into()),
        MetaValue::F32(32.0),
    ] {
        let bytes = GgufBuilder::new().kv("general.alignment", v.clone()).bytes();
        assert_msg(Gguf::parse(&bytes), &[&format!("bad general.alignment {v}"), "nonzero power of two"]);
    }
    // Integer types other than u32 are accepted when the value is valid.
    let bytes = GgufBuilder::new()
        .kv("general.alignment", MetaValue::U64(64))
        .tensor("w", &[3], sift_gguf::GgmlType::F32)
        .bytes();
    assert_eq!(Gguf::parse(&bytes).unwrap().alignment, 64);
}

#[test]
fn invalid_utf8() {
    let bytes = one_kv(|w| {
        w.str_bytes(b"bad\xFFkey").u32(4).u32(1);
    });
    assert_msg(Gguf::parse(&bytes), &["invalid UTF-8 in the key of metadata entry #0 at offset 35"]);
    let bytes = one_kv(|w| {
        w.str("k.s").u32(8).str_bytes(b"ok\xC3");
    });
    assert_msg(Gguf::parse(&bytes), &["invalid UTF-8 in the value of metadata key 'k.s'"]);
    let bytes = one_kv(|w| {
        w.str("k.arr").u32(9).u32(8).u64(2).str("fine").str_bytes(b"\x80");
    });
    assert_msg(Gguf::parse(&bytes), &["invalid UTF-8 in an element of metadata array 'k.arr'"]);
    let bytes = one_tensor(b"w\xFE", &[4], 0, 0, 16);
    assert_msg(Gguf::parse(&bytes), &["invalid UTF-8 in the name of tensor #0"]);
    // A real token string corrupted into invalid UTF-8.
    let mut real = support::smollm_prefix(REAL_PREFIX);
    let at = after_string(&real, "<|im_start|>") - 1;
    real[at] = 0xFF;
    assert_msg(Gguf::parse(&real), &["invalid UTF-8", "tokenizer.ggml.tokens"]);
}

#[test]
fn invalid_bool() {
    let bytes = one_kv(|w| {
        w.str("k.b").u32(7).u8(2);
    });
    assert_msg(Gguf::parse(&bytes), &["'k.b' has invalid bool byte 2", "expected 0 or 1"]);
    let real = support::smollm_prefix(REAL_PREFIX);
    let at = after_string(&real, "tokenizer.ggml.add_bos_token") + 4;
    let mut b = real;
    b[at] = 0x80;
    assert_msg(Gguf::parse(&b), &["'tokenizer.ggml.add_bos_token' has invalid bool byte 128"]);
}

#[test]
fn nesting_depth_limit() {
    let nest = |levels: usize| {
        let mut v = MetaValue::U8(1);
        for _ in 0..levels {
            v = MetaValue::Array(vec![v].into());
        }
        GgufBuilder::new().kv("deep", v).bytes()
    };
    let ok = Gguf::parse(&nest(sift_gguf::MAX_ARRAY_DEPTH)).unwrap();
    assert_eq!(ok.get("deep").unwrap().type_name(), "array[array[array]]");
    assert_msg(
        Gguf::parse(&nest(sift_gguf::MAX_ARRAY_DEPTH + 1)),
        &["metadata key 'deep' nests arrays deeper than 8 levels"],
    );
    // A self-similar chain far deeper than the limit stops at the limit.
    let bytes = one_kv(|w| {
        w.str("k").u32(9);
        for _ in 0..10_000 {
            w.u32(9).u64(1);
        }
    });
    assert_msg(Gguf::parse(&bytes), &["deeper than 8"]);
}

#[test]
fn bad_dims() {
    for n in [0u32, 5, u32::MAX] {
        let mut w = Writer::new();
        w.header(3, 1, 0).str("t").u32(n).raw(&[0; 64]);
        assert_msg(Gguf::parse(&w.buf), &[&format!("tensor 't' has n_dims = {n}, out of range (must be 1 to 4)")]);
    }
    for dims in [&[u64::MAX, 2][..], &[1 << 32, 1 << 32], &[1 << 63], &[1 << 31, 1 << 31, 4]] {
        let bytes = one_tensor(b"t", dims, 0, 0, 64);
        assert_msg(Gguf::parse(&bytes), &["tensor 't' dims", "overflow"]);
    }
    // The element count fits in 63 bits but the byte size does not.
    let bytes = one_tensor(b"t", &[1 << 62], 0, 0, 64);
    assert_msg(Gguf::parse(&bytes), &["tensor 't' dims [4611686018427387904] overflow"]);
    // Zero-sized dimensions are allowed: the tensor has no data.
    let bytes = one_tensor(b"t", &[0, 7], 0, 0, 0);
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!((g.tensors[0].n_elements(), g.tensors[0].n_bytes), (0, 0));
}

#[test]
fn rows_must_be_whole_blocks() {
    let bytes = one_tensor(b"q", &[33, 2], 2, 0, 4096);
    assert_msg(
        Gguf::parse(&bytes),
        &["tensor 'q' of type Q4_0 has row length ne[0] = 33, not a multiple of the block size 32"],
    );
    let bytes = one_tensor(b"k", &[128], 12, 0, 4096);
    assert_msg(Gguf::parse(&bytes), &["type Q4_K", "block size 256"]);
    let f = sift_gguf::GgufFile::open(support::smollm_path()).unwrap();
    let mut b = f.bytes()[..f.gguf.data_offset as usize].to_vec();
    let at = after_string(&b, "blk.0.attn_q.weight") + 4;
    put_u64(&mut b, at, 575);
    assert_msg(Gguf::parse(&b), &["'blk.0.attn_q.weight' of type Q4_1 has row length ne[0] = 575"]);
}

#[test]
fn duplicates() {
    let bytes =
        GgufBuilder::new().kv("a", MetaValue::U8(1)).kv("b", MetaValue::U8(2)).kv("a", MetaValue::U8(3)).bytes();
    assert_msg(Gguf::parse(&bytes), &["duplicate metadata key 'a'"]);
    let bytes = GgufBuilder::new()
        .tensor("w", &[4], sift_gguf::GgmlType::F32)
        .tensor("w", &[8], sift_gguf::GgmlType::F32)
        .bytes();
    assert_msg(Gguf::parse(&bytes), &["duplicate tensor name 'w'"]);
}

#[test]
fn names_in_messages_are_escaped_and_shortened() {
    let bytes = one_kv(|w| {
        w.str("evil\n\u{1b}[31mkey").u32(77);
    });
    let msg = Gguf::parse(&bytes).unwrap_err().to_string();
    assert!(msg.contains(r"evil\n\u{1b}[31mkey"), "{msg}");
    assert!(!msg.contains('\n') && !msg.contains('\u{1b}'), "{msg}");
    let long = "k".repeat(100_000);
    let bytes = one_kv(|w| {
        w.str(&long).u32(77);
    });
    let msg = Gguf::parse(&bytes).unwrap_err().to_string();
    assert!(msg.len() < 400 && msg.contains("(100000 bytes)"), "{msg}");
}
