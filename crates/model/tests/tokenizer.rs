//! Tokenizer parity with llama.cpp on real model files: every string in
//! `tests/fixtures/tokens.json` (SmolLM2, `smollm` pre-tokenizer) and `tokens_qwen2.json`
//! (Qwen2.5, `qwen2` pre-tokenizer) must encode to exactly llama.cpp's ids and decode to exactly
//! llama.cpp's text. The fixtures come from `scripts/make-fixtures.py`.
//!
//! `tokens_spm.json` does the same for SentencePiece (`tokenizer.ggml.model = "llama"`) on
//! `spm-vocab.gguf`, a small vocabulary written by the same script.
//!
//! The SmolLM2 model is required (`SIFT_MODEL` or `models/SmolLM2-135M-Instruct.Q4_1.gguf`); the
//! Qwen2.5 tests are skipped when `models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf` is absent.

use std::path::{Path, PathBuf};

use serde_json::Value;
use sift_model::tokenizer::{StreamDecoder, Tokenizer};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn smollm_path() -> PathBuf {
    let p = std::env::var_os("SIFT_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    assert!(p.exists(), "model file {} is missing: run scripts/fetch-model.sh first", p.display());
    p
}

fn qwen_path() -> Option<PathBuf> {
    let p = root().join("models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    assert!(p.exists(), "{} missing: run scripts/fetch-model.sh qwen2.5-0.5b first", p.display());
    Some(p)
}

fn load(path: &Path) -> Tokenizer {
    let f = sift_gguf::GgufFile::open(path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    Tokenizer::from_gguf(&f.gguf).unwrap_or_else(|e| panic!("tokenizer of {}: {e}", path.display()))
}

fn fixture(name: &str) -> Value {
    let p = root().join("tests/fixtures").join(name);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", p.display()))
}

struct Entry {
    text: String,
    add_special: bool,
    parse_special: bool,
    ids: Vec<u32>,
    detok_special: String,
    detok_plain: String,
}

fn entries(fix: &Value) -> Vec<Entry> {
    let list = fix["entries"].as_array().expect("fixture has no 'entries'");
    list.iter()
        .map(|e| Entry {
            text: e["text"].as_str().expect("text").to_string(),
            add_special: e["add_special"].as_bool().expect("add_special"),
            parse_special: e["parse_special"].as_bool().expect("parse_special"),
            ids: e["ids"].as_array().expect("ids").iter().map(|v| v.as_u64().expect("id") as u32).collect(),
            detok_special: e["detok_special"].as_str().expect("detok_special").to_string(),
            detok_plain: e["detok_plain"].as_str().expect("detok_plain").to_string(),
        })
        .collect()
}

fn check_encode(tok: &Tokenizer, fix: &Value) {
    let entries = entries(fix);
    assert!(entries.len() >= 24, "fixture has only {} entries", entries.len());
    let mut failures = Vec::new();
    for e in &entries {
        let got = tok.encode(&e.text, e.add_special, e.parse_special).expect("encode");
        if got != e.ids {
            failures.push(format!(
                "{:?} (add_special={}, parse_special={}):\n  llama.cpp {:?}\n  sift      {:?}",
                e.text, e.add_special, e.parse_special, e.ids, got
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} strings tokenize differently:\n{}",
        failures.len(),
        entries.len(),
        failures.join("\n")
    );
}

/// Decoding must give llama.cpp's text; with `round_trip`, decoding must also give back the input
/// (byte-level BPE; SentencePiece adds a leading space).
fn check_decode(tok: &Tokenizer, fix: &Value, round_trip: bool) {
    let mut failures = Vec::new();
    for e in entries(fix) {
        let with_special = tok.decode(&e.ids, false);
        let plain = tok.decode(&e.ids, true);
        if with_special != e.detok_special || plain != e.detok_plain {
            failures.push(format!(
                "{:?}: llama.cpp {:?} / {:?}, sift {:?} / {:?}",
                e.text, e.detok_special, e.detok_plain, with_special, plain
            ));
        }
        if round_trip && e.parse_special && with_special != e.text {
            failures.push(format!("{:?} does not round-trip: decoded {:?}", e.text, with_special));
        }
    }
    assert!(failures.is_empty(), "decode mismatches:\n{}", failures.join("\n"));
}

#[test]
fn smollm_tokens_match_llama_cpp() {
    let tok = load(&smollm_path());
    check_encode(&tok, &fixture("tokens.json"));
}

#[test]
fn smollm_decode_matches_llama_cpp_and_round_trips() {
    let tok = load(&smollm_path());
    check_decode(&tok, &fixture("tokens.json"), true);
}

#[test]
fn smollm_metadata() {
    let tok = load(&smollm_path());
    let fix = fixture("tokens.json");
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.model_name(), "gpt2");
    assert_eq!(tok.pre(), "smollm");
    assert_eq!(tok.bos().map(u64::from), fix["bos_id"].as_u64());
    assert_eq!(tok.eos().map(u64::from), fix["eos_id"].as_u64());
    assert!(!tok.add_bos());
    assert_eq!(tok.token_str(1), "<|im_start|>");
    assert_eq!(tok.token_str(2), "<|im_end|>");
    assert_eq!(tok.token_str(u32::MAX), "");
    // <|endoftext|> and <|im_end|> end generation, as in llama.cpp; <|im_start|> does not.
    assert!(tok.is_eog(0) && tok.is_eog(2));
    assert!(!tok.is_eog(1) && !tok.is_eog(504));
    assert_eq!(tok.token_to_piece(2), b"<|im_end|>");
    assert_eq!(tok.token_to_piece(tok.encode(" world", false, false).unwrap()[0]), b" world");
    assert!(tok.token_to_piece(u32::MAX).is_empty());
    // Without parse_special the markup is plain text.
    let plain = tok.encode("<|im_end|>", false, false).unwrap();
    assert!(plain.len() > 1 && !plain.contains(&2));
    assert_eq!(tok.encode("<|im_end|>", false, true).unwrap(), vec![2]);
}

/// Streaming over the ids of non-ASCII strings rebuilds the text with no U+FFFD, and really has
/// to hold bytes back on the way.
#[test]
fn smollm_stream_decoder_holds_back_partial_utf8() {
    let tok = load(&smollm_path());
    let mut held_back = 0;
    let mut checked = 0;
    for e in entries(&fixture("tokens.json")) {
        if e.text.is_ascii() || !e.parse_special {
            continue;
        }
        let mut dec = StreamDecoder::new();
        let mut out = String::new();
        for &id in &e.ids {
            match dec.push(&tok, id) {
                Some(s) => out.push_str(&s),
                None => held_back += usize::from(dec.has_pending()),
            }
        }
        if let Some(s) = dec.flush() {
            out.push_str(&s);
        }
        assert!(!out.contains('\u{FFFD}'), "{:?} streamed to {out:?}", e.text);
        assert_eq!(out, e.detok_plain, "streaming {:?}", e.text);
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} non-ASCII strings");
    assert!(held_back > 0, "no token ever split a UTF-8 character; the test proves nothing");
}

#[test]
fn stream_decoder_specials_and_flush() {
    let tok = load(&smollm_path());
    let ids = tok.encode("<|im_start|>hi<|im_end|>", false, true).unwrap();
    let run = |mut dec: StreamDecoder| -> String {
        let mut s: String = ids.iter().filter_map(|&id| dec.push(&tok, id)).collect();
        s.extend(dec.flush());
        s
    };
    assert_eq!(run(StreamDecoder::new()), "hi");
    assert_eq!(run(StreamDecoder::with_special(true)), "<|im_start|>hi<|im_end|>");
    // A lone first byte of a 4-byte character is held, then flushed as U+FFFD.
    let emoji = tok.encode("😀", false, false).unwrap();
    let mut dec = StreamDecoder::new();
    let first = dec.push(&tok, emoji[0]);
    if emoji.len() > 1 {
        assert_eq!(first, None);
        assert_eq!(dec.flush().as_deref(), Some("\u{FFFD}"));
    }
}

#[test]
fn qwen2_tokens_match_llama_cpp() {
    let Some(p) = qwen_path() else { return };
    let tok = load(&p);
    assert_eq!(tok.pre(), "qwen2");
    check_encode(&tok, &fixture("tokens_qwen2.json"));
}

#[test]
fn qwen2_decode_matches_llama_cpp_and_round_trips() {
    let Some(p) = qwen_path() else { return };
    let tok = load(&p);
    check_decode(&tok, &fixture("tokens_qwen2.json"), true);
    for t in ["<|im_end|>", "<|endoftext|>"] {
        let id = tok.token_id(t).expect(t);
        assert!(tok.is_eog(id), "{t} should end generation");
    }
}

#[test]
fn spm_tokens_and_text_match_llama_cpp() {
    let tok = load(&root().join("tests/fixtures/spm-vocab.gguf"));
    assert_eq!(tok.model_name(), "llama");
    assert!(tok.add_bos(), "SentencePiece vocabularies add BOS by default");
    let fix = fixture("tokens_spm.json");
    check_encode(&tok, &fix);
    check_decode(&tok, &fix, false);
}

/// llama.cpp's own tokenizer test suites (`models/ggml-vocab-*.gguf` with `.inp`/`.out`, as run by
/// its `test-tokenizer-0`), from the reference checkout that `scripts/build-llama-ref.sh` makes.
/// Ignored by default (the checkout is not part of the test command): `cargo test -p sift-model
/// --test tokenizer -- --ignored` after `scripts/build-llama-ref.sh`.
#[test]
#[ignore = "needs llama.cpp's checkout with its vocabulary tests (scripts/build-llama-ref.sh)"]
fn llama_cpp_vocab_test_suites() {
    let dir = root().join(".ref/src/vendor/llama.cpp/models");
    assert!(dir.is_dir(), "{} missing: run scripts/build-llama-ref.sh first", dir.display());
    let names = [
        "command-r",
        "deepseek-coder",
        "deepseek-llm",
        "falcon",
        "gpt-2",
        "llama-bpe",
        "llama-spm",
        "mpt",
        "phi-3",
        "qwen2",
        "qwen35",
        "refact",
        "starcoder",
    ];
    let mut failures = Vec::new();
    for name in names {
        let p = dir.join(format!("ggml-vocab-{name}.gguf"));
        let (Ok(inp), Ok(out)) = (
            std::fs::read_to_string(p.with_extension("gguf.inp")),
            std::fs::read_to_string(p.with_extension("gguf.out")),
        ) else {
            eprintln!("skipping {name}: no .inp/.out");
            continue;
        };
        let tok = load(&p);
        for (text, expected) in inp.split("\n__ggml_vocab_test__\n").zip(out.lines()) {
            let expected: Vec<u32> = expected.split_whitespace().map(|t| t.parse().expect("token id")).collect();
            let got = tok.encode(text, false, false).expect("encode");
            if got != expected {
                failures.push(format!("{name} {text:?}:\n  llama.cpp {expected:?}\n  sift      {got:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

/// Byte-level BPE pre-tokenizes long texts in pieces (issue 22: a 2 MB text took 200+ MB at
/// once); the pieces are cut where every pre-tokenizer splits anyway, so the ids are the whole
/// text's, for pieces of any size, on real text (WikiText-2's first 16 KiB, special tokens and
/// newline runs in it) and on text made to stress the cuts.
#[test]
fn encoding_in_pieces_gives_the_same_ids() {
    let wiki = std::fs::read_to_string(root().join("tests/fixtures/wiki.test.head16k.raw")).unwrap();
    let hostile =
        "a\nb\n\nC\r\nd \n e\n\n\n  f\n1\n!x\n's\n<|im_start|>user\nHi\nit's  a b\t c.d e1 f\u{301} g\u{e9} h\n"
            .repeat(50);
    let mut paths = vec![smollm_path()];
    paths.extend(qwen_path());
    for p in paths {
        let tok = load(&p);
        for text in [&wiki, &hostile] {
            for special in [false, true] {
                let whole = tok.encode_in_pieces(text, true, special, usize::MAX).unwrap();
                assert_eq!(tok.encode(text, true, special).unwrap(), whole, "{}", p.display());
                for piece in [1, 7, 100, 4096] {
                    let got = tok.encode_in_pieces(text, true, special, piece).unwrap();
                    assert_eq!(got, whole, "{}: pieces of {piece}", p.display());
                }
            }
        }
    }
}

/// `encode_at_most`: the same ids as `encode` when the text fits, the `TooManyTokens` error as
/// soon as it does not; `encode_prefix`: the whole text's first ids; and `max_piece_bytes` bounds
/// the bytes per token (real text).
#[test]
fn encoding_at_most_stops_at_the_limit() {
    let wiki = std::fs::read_to_string(root().join("tests/fixtures/wiki.test.head16k.raw")).unwrap();
    let mut paths = vec![smollm_path()];
    paths.extend(qwen_path());
    for p in paths {
        let tok = load(&p);
        let all = tok.encode(&wiki, true, false).unwrap();
        assert_eq!(tok.encode_at_most(&wiki, true, false, all.len()).unwrap(), all, "{}", p.display());
        match tok.encode_at_most(&wiki, true, false, all.len() - 1) {
            Err(sift_model::tokenizer::TokenizerError::TooManyTokens { limit }) => assert_eq!(limit, all.len() - 1),
            other => panic!("{}: {other:?}", p.display()),
        }
        assert!(tok.encode_at_most(&wiki, true, false, 10).is_err());
        // A prefix is the start of the whole text's ids, wherever it ends (160 KB: three of the
        // tokenizer's 64 KiB pieces, the later ones never tokenized for a short prefix).
        let long = wiki.repeat(10);
        let all = tok.encode(&long, true, false).unwrap();
        for n in [0, 1, 7, 1000, 20_000, all.len() - 1, all.len(), all.len() + 5] {
            assert_eq!(tok.encode_prefix(&long, true, false, n), all[..n.min(all.len())], "{}: {n}", p.display());
        }
        let m = tok.max_piece_bytes();
        assert!(
            m >= 2 && all.len() >= wiki.len() / m,
            "{}: {} tokens, {} bytes, max piece {m}",
            p.display(),
            all.len(),
            wiki.len()
        );
    }
}

/// `encode_reader` (a text read from a file a piece at a time, as `sift perplexity` reads it):
/// the pieces' ids joined are `encode`'s on the whole text, BOS once at the start, for reads of
/// any size (the cut falls where the pre-tokenizers split), on real text and the hostile one;
/// text that is not UTF-8 is an error naming its byte, not a panic or a wrong id.
#[test]
fn encoding_a_reader_gives_the_whole_texts_ids() {
    let wiki = std::fs::read_to_string(root().join("tests/fixtures/wiki.test.head16k.raw")).unwrap();
    let hostile =
        "a\nb\n\nC\r\nd \n e\n\n\n  f\n1\n!x\n's\n<|im_start|>user\nHi\nit's  a b\t c.d e1 f\u{301} g\u{e9} h\n"
            .repeat(50);
    let mut paths = vec![smollm_path()];
    paths.extend(qwen_path());
    for p in paths {
        let tok = load(&p);
        for text in [&wiki, &hostile] {
            let whole = tok.encode(text, true, false).unwrap();
            for read in [1, 13, 1000, 4096, 1 << 20] {
                let r = tok.encode_reader_in_pieces(text.as_bytes(), true, false, read);
                let pieces: Vec<Vec<u32>> = r.collect::<Result<_, _>>().unwrap();
                if read < text.len() / 2 {
                    assert!(pieces.len() > 1, "{}: reads of {read} gave one piece", p.display());
                }
                assert_eq!(pieces.concat(), whole, "{}: reads of {read}", p.display());
            }
        }
        let mut bad = wiki.as_bytes()[..3000].to_vec();
        bad[2500] = 0xff;
        let e = tok.encode_reader_in_pieces(&bad[..], true, false, 1000).find_map(Result::err).expect("an error");
        assert!(e.to_string().contains("not UTF-8 (at byte 2500)"), "{e}");
    }
    // SentencePiece merges may cross a space: its text is read whole and tokenized once.
    let spm = load(&root().join("tests/fixtures/spm-vocab.gguf"));
    for text in [&wiki[..4000], &hostile[..2000]] {
        let pieces: Vec<Vec<u32>> =
            spm.encode_reader_in_pieces(text.as_bytes(), true, false, 13).collect::<Result<_, _>>().unwrap();
        assert_eq!(pieces.len(), 1);
        assert_eq!(pieces.concat(), spm.encode(text, true, false).unwrap());
    }
}
