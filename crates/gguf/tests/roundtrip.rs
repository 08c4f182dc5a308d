//! Synthetic files from the test writer: round-trips of every value type, tensor layout,
//! accessors, display forms, the ggml type table and `GgufFile`.

mod support;

use sift_gguf::{GgmlType, Gguf, GgufError, GgufFile, MetaValue};
use support::{assert_msg, pattern_byte, sample_builder, GgufBuilder, Writer};

#[test]
fn all_value_types_round_trip() {
    let b = sample_builder();
    let bytes = b.bytes();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.metadata, b.metadata, "values and order are preserved");
    for (k, v) in &b.metadata {
        assert_eq!(g.get(k), Some(v), "{k}");
    }
    assert_eq!(g.architecture(), Some("llama"));
    assert_eq!(g.get_u64("t.u32"), Some(4_000_000_000));
    assert_eq!(g.get_u64("t.u64"), Some(u64::MAX));
    assert_eq!(g.get_u64("t.i8"), None, "negative");
    assert_eq!(g.get_i64("t.i64"), Some(i64::MIN));
    assert_eq!(g.get_i64("t.u64"), None, "does not fit");
    assert_eq!(g.get_f32("t.f32"), Some(1.5e-5));
    assert_eq!(g.get_f32("t.u16"), Some(65000.0));
    assert_eq!(g.get_f32("t.string"), None);
    assert_eq!(g.get_bool("t.bool.true"), Some(true));
    assert_eq!(g.get_bool("t.u8"), None);
    assert_eq!(g.get_str("t.string"), Some("héllo\n\"wörld\" ✓"));
    assert_eq!(g.get_str("t.string.empty"), Some(""));
    assert_eq!(g.get_array("t.arr.u8").unwrap().len(), 20);
    assert!(g.get_array("t.arr.empty").is_some_and(|a| a.is_empty()));
    let nested = g.get_array("t.arr.nested").unwrap();
    assert_eq!(nested.get(0).unwrap().as_array().unwrap().get(1), Some(MetaValue::I16(-2)));
    let deep = g.get_array("t.arr.nested3").unwrap().get(0).unwrap();
    let deep = deep.as_array().unwrap().get(0).unwrap();
    assert_eq!(deep.as_array().unwrap().strings().and_then(|s| s.get(0)), Some("deep"));
    // Strings, i32 and f32 arrays are packed; the others keep one value per element.
    assert_eq!(
        g.get_array("t.arr.string").unwrap().strings().map(|s| s.iter().collect::<Vec<_>>()),
        Some(vec!["a", "", "ü"])
    );
    assert_eq!(g.get_array("t.arr.i32").unwrap().i32s(), Some(&[-1, 0, 7][..]));
    assert_eq!(g.get_array("t.arr.f32").unwrap().f32s(), Some(&[0.25, -3.0][..]));
    assert_eq!(g.get("missing"), None);
    assert_eq!(g.get_u64("missing"), None);
}

#[test]
fn version_2_and_empty_files_parse() {
    let mut b = sample_builder();
    b.version = 2;
    let g = Gguf::parse(&b.bytes()).unwrap();
    assert_eq!(g.version, 2);
    assert_eq!(g.tensors.len(), 5);

    let mut w = Writer::new();
    w.header(3, 0, 0);
    let g = Gguf::parse(&w.buf).unwrap();
    assert!(g.metadata.is_empty() && g.tensors.is_empty());
    assert_eq!(g.alignment, 32);
    assert_eq!(g.data_offset, 32, "24-byte header rounded up to the alignment");
}

#[test]
fn tensors_round_trip() {
    let b = sample_builder();
    let built = b.build();
    let g = Gguf::parse(&built.bytes).unwrap();
    assert_eq!(g.data_offset as usize, built.data_offset);
    assert_eq!(g.file_size as usize, built.bytes.len());
    assert_eq!(g.tensors.len(), b.tensors.len());
    for (i, (t, spec)) in g.tensors.iter().zip(&b.tensors).enumerate() {
        assert_eq!(t.name, spec.name);
        assert_eq!(t.dims, spec.dims);
        assert_eq!(t.ty, spec.ty);
        assert_eq!(t.n_bytes, GgufBuilder::n_bytes(spec));
        assert_eq!(t.offset % 32, 0);
        assert_eq!(g.tensor(&t.name).unwrap().name, t.name);
        let data = g.tensor_data(&built.bytes, t);
        assert_eq!(data.len() as u64, t.n_bytes);
        assert!(data.iter().enumerate().all(|(j, &x)| x == pattern_byte(i, j)));
    }
    let q = g.tensor("blk.0.q.weight").unwrap();
    assert_eq!((q.n_elements(), q.n_bytes, q.row_bytes(), q.n_rows()), (512, 288, 144, 2));
    let x3 = g.tensor("x.3d").unwrap();
    assert_eq!((x3.n_elements(), x3.n_bytes, x3.n_rows()), (24, 48, 12));
    assert!(g.tensor("nope").is_none());
    // Bytes other than the parsed ones: checked access says None.
    let t = &g.tensors[4];
    assert!(g.try_tensor_data(&built.bytes[..100], t).is_none());
    assert_eq!(g.tensor_range(t).unwrap().end, built.bytes.len());
}

#[test]
fn custom_alignment() {
    for align in [1u32, 8, 64, 4096] {
        let b = sample_builder().kv("general.alignment", MetaValue::U32(align));
        let built = b.build();
        let g = Gguf::parse(&built.bytes).unwrap();
        assert_eq!(g.alignment, u64::from(align));
        assert_eq!(g.data_offset % g.alignment, 0);
        assert_eq!(g.data_offset as usize, built.data_offset);
        for t in &g.tensors {
            assert_eq!(t.offset % g.alignment, 0);
        }
    }
}

#[test]
fn lookups_survive_edits_to_public_fields() {
    let mut g = Gguf::parse(&sample_builder().bytes()).unwrap();
    g.metadata.remove(0);
    g.metadata.push(("added".into(), MetaValue::U8(1)));
    assert_eq!(g.get_u64("added"), Some(1));
    assert_eq!(g.architecture(), None);
    assert_eq!(g.get_u64("t.u8"), Some(250));
    g.tensors.reverse();
    assert_eq!(g.tensor("norm.weight").unwrap().dims, [5]);
}

#[test]
fn type_names() {
    let g = Gguf::parse(&sample_builder().bytes()).unwrap();
    let expect = [
        ("t.u8", "u8"),
        ("t.i8", "i8"),
        ("t.u16", "u16"),
        ("t.i16", "i16"),
        ("t.u32", "u32"),
        ("t.i32", "i32"),
        ("t.f32", "f32"),
        ("t.bool.true", "bool"),
        ("t.string", "string"),
        ("t.u64", "u64"),
        ("t.i64", "i64"),
        ("t.f64", "f64"),
        ("t.arr.u8", "array[u8]"),
        ("t.arr.i32", "array[i32]"),
        ("t.arr.string", "array[string]"),
        ("t.arr.empty", "array"),
        ("t.arr.nested", "array[array[i16]]"),
        ("t.arr.nested3", "array[array[array]]"),
    ];
    for (k, name) in expect {
        assert_eq!(g.get(k).unwrap().type_name(), name, "{k}");
    }
}

#[test]
fn display_forms() {
    use MetaValue::*;
    assert_eq!(U32(7).to_string(), "7");
    assert_eq!(I64(-3).to_string(), "-3");
    assert_eq!(F32(1.0).to_string(), "1.0");
    assert_eq!(F64(0.5).to_string(), "0.5");
    assert_eq!(Bool(true).to_string(), "true");
    assert_eq!(String("a\"b\n".into()).to_string(), r#""a\"b\n""#);
    assert_eq!(Array(vec![].into()).to_string(), "[]");
    let eight = Array((1..=8).map(U8).collect());
    assert_eq!(eight.to_string(), "[1, 2, 3, 4, 5, 6, 7, 8]");
    let nine = Array((1..=9).map(U8).collect());
    assert_eq!(nine.to_string(), "[1, 2, 3, ... (9 items)]");
    let nested = Array(vec![Array(vec![I8(1)].into()), Array(vec![].into())].into());
    assert_eq!(nested.to_string(), "[[1], []]");
}

#[test]
fn value_accessors() {
    use MetaValue::*;
    assert_eq!(I32(-1).as_u64(), None);
    assert_eq!(I32(5).as_u64(), Some(5));
    assert_eq!(U64(u64::MAX).as_i64(), None);
    assert_eq!(U8(200).as_i64(), Some(200));
    assert_eq!(F32(1.5).as_u64(), None, "floats are not integers");
    assert_eq!(F64(2.5).as_f32(), Some(2.5));
    assert_eq!(I16(-4).as_f32(), Some(-4.0));
    assert_eq!(Bool(true).as_u64(), None);
    assert_eq!(String("x".into()).as_array(), None);
    assert_eq!(Array(vec![U8(1)].into()).as_str(), None);
}

#[test]
fn ggml_type_table() {
    let ids: Vec<u32> = GgmlType::ALL.iter().map(|t| t.id()).collect();
    assert_eq!(
        ids,
        [
            0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30,
            34, 35, 39
        ]
    );
    for t in GgmlType::ALL {
        assert_eq!(GgmlType::from_id(t.id()), Some(t));
        assert_eq!(format!("{t}"), t.name());
        assert_eq!(format!("{t:?}"), t.name(), "name matches the variant");
        assert!(t.block_size() == 1 || t.block_size() == 32 || t.block_size() == 256);
    }
    for id in [4, 5, 31, 32, 33, 36, 37, 38, 40, 99, u32::MAX] {
        assert_eq!(GgmlType::from_id(id), None, "{id}");
    }
    let geo = |t: GgmlType| (t.block_size(), t.block_bytes());
    assert_eq!(geo(GgmlType::Q4_1), (32, 20));
    assert_eq!(geo(GgmlType::Q8_0), (32, 34));
    assert_eq!(geo(GgmlType::Q4_K), (256, 144));
    assert_eq!(geo(GgmlType::Q6_K), (256, 210));
    assert_eq!(geo(GgmlType::IQ1_M), (256, 56));
    assert_eq!(geo(GgmlType::MXFP4), (32, 17));
    assert_eq!(geo(GgmlType::BF16), (1, 2));
    assert!(GgmlType::Q4_0.is_quantized() && !GgmlType::F16.is_quantized());
    assert_eq!(GgmlType::Q4_0.bytes_for(64), Some(36));
    assert_eq!(GgmlType::Q4_0.bytes_for(33), None);
    assert!(GgmlType::F32 < GgmlType::MXFP4);
}

#[test]
fn gguf_file_open_synthetic() {
    let built = sample_builder().build();
    let path = support::scratch_path("sample.gguf");
    std::fs::write(&path, &built.bytes).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.path(), path.as_path());
    assert_eq!(f.bytes(), &built.bytes[..]);
    assert_eq!(f.tensor_bytes("norm.weight").unwrap().len(), 20);
    assert_eq!(f.tensor_bytes("norm.weight").unwrap()[1], pattern_byte(1, 1));
    assert!(f.tensor_bytes("missing").is_none());
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn gguf_file_open_errors() {
    let missing = support::scratch_path("does-not-exist.gguf");
    let err = GgufFile::open(&missing).unwrap_err();
    assert!(matches!(err, GgufError::Io { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("does-not-exist.gguf") && msg.contains("cannot read"), "{msg}");

    let dir = env!("CARGO_TARGET_TMPDIR");
    assert_msg(GgufFile::open(dir), &["cannot read", "directory"]);

    let sift = support::scratch_path("model.sift");
    std::fs::write(&sift, b"SIFT\x01\x00\x00\x00 rest of a sift file").unwrap();
    let err = GgufFile::open(&sift).unwrap_err();
    assert!(matches!(err, GgufError::BadMagic { found } if &found == b"SIFT"), "{err:?}");
    assert!(err.to_string().contains("not a GGUF file: magic is 'SIFT'"));

    let empty = support::scratch_path("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert_msg(GgufFile::open(&empty), &["truncated", "magic", "file is 0 bytes"]);

    for p in [sift, empty] {
        std::fs::remove_file(p).unwrap();
    }
}
