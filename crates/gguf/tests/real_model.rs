//! Facts read from the real SmolLM2-135M model (required) and the Qwen2.5-0.5B model
//! (optional).

mod support;

use std::collections::BTreeSet;

use sift_gguf::{GgmlType, GgufFile, MetaValue};

fn smollm() -> GgufFile {
    GgufFile::open(support::smollm_path()).expect("the SmolLM2 model parses")
}

#[test]
fn smollm_header_and_metadata() {
    let f = smollm();
    let g = &f.gguf;
    assert_eq!(g.version, 3);
    assert_eq!(g.alignment, 32);
    assert_eq!(g.file_size, f.bytes().len() as u64);
    assert_eq!(g.metadata.len(), 33);
    assert_eq!(g.architecture(), Some("llama"));
    assert_eq!(g.get_u64("llama.block_count"), Some(30));
    assert_eq!(g.get_u64("llama.embedding_length"), Some(576));
    assert_eq!(g.get_u64("llama.context_length"), Some(8192));
    assert_eq!(g.get_u64("llama.attention.head_count"), Some(9));
    assert_eq!(g.get_u64("llama.attention.head_count_kv"), Some(3));
    assert_eq!(g.get_f32("llama.rope.freq_base"), Some(100000.0));
    assert_eq!(g.get_f32("llama.attention.layer_norm_rms_epsilon"), Some(1e-5));
    assert_eq!(g.get_bool("tokenizer.ggml.add_bos_token"), Some(false));
    assert_eq!(g.get_str("tokenizer.ggml.model"), Some("gpt2"));
    assert_eq!(g.get_u64("tokenizer.ggml.eos_token_id"), Some(2));
    assert!(g.get_str("tokenizer.chat_template").unwrap().contains("<|im_start|>"));

    let tokens = g.get_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(tokens.strings().and_then(|t| t.get(0)), Some("<|endoftext|>"));
    assert_eq!(tokens.strings().and_then(|t| t.get(1)), Some("<|im_start|>"));
    assert!(tokens.iter().all(|t| t.as_str().is_some()));
    assert_eq!(g.get("tokenizer.ggml.tokens").unwrap().type_name(), "array[string]");
    assert_eq!(g.get("tokenizer.ggml.token_type").unwrap().type_name(), "array[i32]");
    assert_eq!(g.get_array("tokenizer.ggml.merges").unwrap().len(), 48900);
    assert_eq!(
        g.get("tokenizer.ggml.tokens").unwrap().to_string(),
        r#"["<|endoftext|>", "<|im_start|>", "<|im_end|>", ... (49152 items)]"#
    );
    assert_eq!(g.get("general.languages"), Some(&MetaValue::Array(vec![MetaValue::String("en".into())].into())));
    assert_eq!(g.get("no.such.key"), None);
}

#[test]
fn smollm_tensor_table() {
    let f = smollm();
    let g = &f.gguf;
    assert_eq!(g.tensors.len(), 272);
    assert_eq!(g.data_offset, 1_785_664);
    assert_eq!(g.data_offset % g.alignment, 0);

    let emb = g.tensor("token_embd.weight").unwrap();
    assert_eq!(emb.dims, [576, 49152]);
    assert_eq!(emb.ty, GgmlType::Q8_0);
    assert_eq!(emb.offset, 0);
    assert_eq!(emb.n_bytes, 576 / 32 * 34 * 49152);
    assert_eq!(emb.row_bytes(), 576 / 32 * 34);
    assert_eq!(emb.n_rows(), 49152);

    let q = g.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(q.ty, GgmlType::Q4_1);
    assert_eq!(q.dims, [576, 576]);
    let k = g.tensor("blk.0.attn_k.weight").unwrap();
    assert_eq!(k.dims, [576, 192]);
    assert_eq!(g.tensor("blk.29.ffn_down.weight").unwrap().dims, [1536, 576]);
    assert!(g.tensor("blk.30.ffn_down.weight").is_none());
    assert!(g.tensor("output.weight").is_none(), "SmolLM2 ties embeddings");
    assert_eq!(g.tensor("output_norm.weight").unwrap().ty, GgmlType::F32);

    let types: BTreeSet<&str> = g.tensors.iter().map(|t| t.ty.name()).collect();
    assert_eq!(types, BTreeSet::from(["F32", "Q4_1", "Q8_0"]));

    let mut end = 0;
    for t in &g.tensors {
        let bs = t.ty.block_size() as u64;
        assert_eq!(t.dims[0] % bs, 0, "{}", t.name);
        assert_eq!(t.n_bytes, t.n_elements() / bs * t.ty.block_bytes() as u64, "{}", t.name);
        assert_eq!(t.offset % g.alignment, 0, "{}", t.name);
        let data = f.tensor_bytes(&t.name).unwrap();
        assert_eq!(data.len() as u64, t.n_bytes);
        assert_eq!(g.tensor_data(f.bytes(), t).as_ptr(), data.as_ptr());
        end = end.max(g.data_offset + t.offset + t.n_bytes);
    }
    assert_eq!(end, g.file_size, "the last tensor ends at the end of the file");
    let n_params: u64 = g.tensors.iter().map(|t| t.n_elements()).sum();
    assert_eq!(n_params, 134_515_008);

    // The attention norm is all-finite f32 data.
    let norm = f.tensor_bytes("blk.0.attn_norm.weight").unwrap();
    assert_eq!(norm.len(), 576 * 4);
    assert!(norm.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).all(f32::is_finite));
    assert!(f.tensor_bytes("nope").is_none());
}

#[test]
fn smollm_file_accessors() {
    let f = smollm();
    assert_eq!(f.path(), support::smollm_path().as_path());
    assert_eq!(&f.bytes()[..4], b"GGUF");
    let dbg = format!("{f:?}");
    assert!(dbg.contains("n_tensors: 272"), "{dbg}");
    // Parsing the mapped bytes again gives the same result.
    let g = sift_gguf::Gguf::parse(f.bytes()).unwrap();
    assert_eq!(g.metadata, f.gguf.metadata);
    assert_eq!(g.data_offset, f.gguf.data_offset);
}

#[test]
fn qwen_optional() {
    let path = support::qwen_path()
        .expect("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf missing: run scripts/fetch-model.sh qwen2.5-0.5b first");
    let f = GgufFile::open(path).unwrap();
    let g = &f.gguf;
    assert_eq!(g.architecture(), Some("qwen2"));
    assert_eq!(g.get_u64("qwen2.block_count"), Some(24));
    assert_eq!(g.get_u64("qwen2.embedding_length"), Some(896));
    assert_eq!(g.get_array("tokenizer.ggml.tokens").unwrap().len(), 151936);
    assert_eq!(g.tensors.len(), 291);
    let types: BTreeSet<GgmlType> = g.tensors.iter().map(|t| t.ty).collect();
    eprintln!("qwen2.5 tensor types: {types:?}");
    assert_eq!(types, BTreeSet::from([GgmlType::F32, GgmlType::Q4_K, GgmlType::Q5_0, GgmlType::Q6_K, GgmlType::Q8_0]));
    assert_eq!(g.tensor("token_embd.weight").unwrap().ty, GgmlType::Q5_0);
    assert_eq!(g.tensor("output.weight").unwrap().ty, GgmlType::Q8_0);
    assert_eq!(g.tensor("blk.0.attn_q.bias").unwrap().dims, [896]);
    for t in &g.tensors {
        assert_eq!(
            f.tensor_bytes(&t.name).unwrap().len() as u64,
            t.n_elements() / t.ty.block_size() as u64 * t.ty.block_bytes() as u64
        );
    }
}

#[test]
fn taking_a_metadata_array_leaves_the_others_found() {
    let mut f = smollm();
    let merges = f.gguf.take_metadata("tokenizer.ggml.merges").expect("the merges are there");
    assert_eq!(merges.as_array().map(|a| a.len()), Some(48900));
    assert_eq!(f.gguf.get("tokenizer.ggml.merges"), None);
    assert_eq!(f.gguf.take_metadata("tokenizer.ggml.merges"), None);
    assert_eq!(f.gguf.metadata.len(), 32);
    // Keys after the removed one are still found through the index.
    assert_eq!(f.gguf.get_u64("tokenizer.ggml.eos_token_id"), Some(2));
    assert!(f.gguf.get_str("tokenizer.chat_template").is_some());
    assert_eq!(f.gguf.get_u64("llama.block_count"), Some(30));
}

/// Resident bytes (kB in /proc/self/smaps) of the mapping that starts at `addr`.
fn mapping_rss_kb(addr: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
    let mut inside = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((start, _)) = first
            .split_once('-')
            .filter(|(s, e)| s.chars().all(|c| c.is_ascii_hexdigit()) && e.chars().all(|c| c.is_ascii_hexdigit()))
        {
            inside = usize::from_str_radix(start, 16) == Ok(addr);
        } else if inside && line.starts_with("Rss:") {
            return line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
        }
    }
    panic!("no mapping at {addr:#x}");
}

#[test]
fn a_partial_copy_holds_its_resident_tensors_and_frees_the_parsed_header() {
    let path = support::smollm_path();
    let bytes = std::fs::read(&path).unwrap();
    let header_len = 1_785_664; // SmolLM2's data offset (see smollm_tensor_table)
    let fill = |buf: &mut [u8], ranges: &[std::ops::Range<usize>]| {
        for r in ranges {
            buf[r.clone()].copy_from_slice(&bytes[r.clone()]);
        }
        Ok(())
    };
    let norms = |_: &sift_gguf::Gguf, t: &sift_gguf::TensorInfo| t.name.ends_with("_norm.weight");
    let f = GgufFile::from_parts(&path, bytes.len(), header_len, fill, norms, |_, _| Ok(())).unwrap();
    // The kept tensors read back the file's bytes.
    let norm = f.tensor_bytes("blk.3.ffn_norm.weight").unwrap();
    let t = f.gguf.tensor("blk.3.ffn_norm.weight").unwrap();
    let start = (f.gguf.data_offset + t.offset) as usize;
    assert_eq!(norm, &bytes[start..start + norm.len()]);
    // 61 norms of 576 f32 (2.3 KiB each) touch at most two pages each; the 1.7 MiB header is
    // not among them.
    let rss = mapping_rss_kb(f.bytes().as_ptr() as usize);
    assert!(rss <= 61 * 8, "the partial copy holds {rss} kB");
    assert_eq!(f.gguf.metadata.len(), 33, "the metadata lives on, parsed");
}

#[test]
fn weights_loaded_into_memory_are_the_files() {
    let mapped = smollm();
    let mut loaded = smollm();
    loaded.load_into_memory().expect("an anonymous copy");
    assert!(loaded.bytes() == mapped.bytes());
    for t in &mapped.gguf.tensors {
        assert!(loaded.tensor_bytes(&t.name) == mapped.tensor_bytes(&t.name), "{}", t.name);
    }
    // A second call has nothing to do.
    loaded.load_into_memory().unwrap();
    assert_eq!(loaded.bytes().len(), mapped.bytes().len());
}

/// Edits in a private mapping (`edit_mapped`, the load-time repack's way) change what the process
/// reads and nothing on disk, and dropping pages (`release`) never brings the file's bytes back.
#[test]
fn an_edited_mapping_keeps_its_edits_and_leaves_the_file_alone() {
    let mut f = smollm();
    let t = f.gguf.tensors.iter().max_by_key(|t| t.n_bytes).unwrap().clone();
    let start = (f.gguf.data_offset + t.offset) as usize;
    let range = start..start + t.n_bytes as usize;
    let before = f.bytes()[range.clone()].to_vec();
    assert!(f.edit_mapped(|b| b[range.clone()].fill(0xAB)).expect("a private mapping"));
    assert!(f.is_file_backed());
    f.release(range.clone());
    assert!(f.bytes()[range.clone()].iter().all(|&b| b == 0xAB), "{}: the edit was lost", t.name);
    let fresh = smollm();
    assert!(fresh.bytes()[range] == before[..], "the file on disk changed");
    assert!(fresh.bytes()[..start] == f.bytes()[..start], "bytes outside the edit differ");
}
