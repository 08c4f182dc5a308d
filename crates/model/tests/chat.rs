//! Chat-template rendering against llama-cpp-python's jinja2 formatter: the conversations in
//! `tests/fixtures/chat_template.json` (SmolLM2) and `chat_template_qwen2.json` (Qwen2.5) must
//! render to exactly the recorded text. The fixtures come from `scripts/make-fixtures.py`.

use std::path::{Path, PathBuf};

use serde_json::Value;
use sift_model::chat::{ChatMessage, ChatTemplate};
use sift_model::tokenizer::Tokenizer;

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

fn fixture(name: &str) -> Value {
    let p = root().join("tests/fixtures").join(name);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", p.display()))
}

fn template_of(path: &Path) -> (ChatTemplate, Tokenizer) {
    let f = sift_gguf::GgufFile::open(path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    let tok = Tokenizer::from_gguf(&f.gguf).expect("tokenizer");
    let tmpl = ChatTemplate::from_gguf(&f.gguf, &tok).expect("template compiles").expect("model has a chat template");
    (tmpl, tok)
}

fn check(tmpl: &ChatTemplate, fix: &Value) {
    assert_eq!(tmpl.source(), fix["template"].as_str().expect("template"));
    assert_eq!(tmpl.bos_token(), fix["bos_token"].as_str().expect("bos_token"));
    assert_eq!(tmpl.eos_token(), fix["eos_token"].as_str().expect("eos_token"));
    let cases = fix["cases"].as_array().expect("cases");
    assert!(!cases.is_empty());
    for case in cases {
        let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).expect("messages");
        let add = case["add_generation_prompt"].as_bool().expect("add_generation_prompt");
        let got = tmpl.apply(&messages, add).expect("render");
        assert_eq!(
            got,
            case["expected"].as_str().expect("expected"),
            "add_generation_prompt={add}, {} messages",
            messages.len()
        );
    }
}

#[test]
fn smollm_template_matches_llama_cpp_python() {
    let (tmpl, _) = template_of(&smollm_path());
    let fix = fixture("chat_template.json");
    check(&tmpl, &fix);
    // The brief's main case: system, user, assistant, user with a generation prompt.
    let first = &fix["cases"][0];
    assert_eq!(first["messages"].as_array().map(Vec::len), Some(4));
    assert_eq!(first["add_generation_prompt"].as_bool(), Some(true));
}

#[test]
fn qwen2_template_matches_llama_cpp_python() {
    let p = root().join("models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    assert!(p.exists(), "{} missing: run scripts/fetch-model.sh qwen2.5-0.5b first", p.display());
    let (tmpl, _) = template_of(&p);
    check(&tmpl, &fixture("chat_template_qwen2.json"));
}

#[test]
fn chatml_fallback() {
    let f = sift_gguf::GgufFile::open(smollm_path()).expect("open");
    let tok = Tokenizer::from_gguf(&f.gguf).expect("tokenizer");
    let t = ChatTemplate::chatml(&tok).expect("chatml");
    let msgs = [ChatMessage::system("Be brief."), ChatMessage::user("Hi")];
    assert_eq!(
        t.apply(&msgs, true).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(t.apply(&msgs[1..], false).unwrap(), "<|im_start|>user\nHi<|im_end|>\n");
    // SmolLM2 has a template, so the fallback is not used.
    let own = ChatTemplate::from_gguf_or_chatml(&f.gguf, &tok).unwrap();
    assert!(own.source().contains("SmolLM"));
}
