//! The `sift` binary end to end on the real SmolLM2-135M Q4_1 model: generation, perplexity
//! against llama.cpp's figure, bench output shapes, inspect, and clear errors for bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[path = "cli/memory.rs"]
mod memory;
#[path = "cli/train.rs"]
mod train;

/// The sift binary, with the builtin development-machine profile (tests do not probe the
/// machine they run on, nor learn from their runs: `machine_profile_*` tests that part).
fn sift_cmd() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sift"));
    c.env("SIFT_PROFILE", "sift-dev-2core");
    c
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn model() -> PathBuf {
    let p = std::env::var_os("SIFT_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    assert!(p.exists(), "{} missing: run scripts/fetch-model.sh first", p.display());
    p
}

fn sift(args: &[&str]) -> Output {
    sift_cmd().args(args).output().expect("run sift")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn generate_greedy_streams_the_continuation_and_reports_speed() {
    let m = model();
    let out = sift(&[
        "generate",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "The capital of France is",
        "-n",
        "8",
        "--temp",
        "0",
        "-t",
        "2",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    // llama.cpp's top token after this prompt is " Paris" (tests/fixtures/logits.json, id 7042).
    assert!(stdout.starts_with("The capital of France is Paris"), "{stdout}");
    let stderr = text(&out.stderr);
    assert!(stderr.contains("eval time") && stderr.contains("tokens per second"), "{stderr}");
    assert!(stderr.contains("peak memory (VmHWM)"), "{stderr}");
    // --no-mmap: the weights copied into memory give the same text.
    let copied = sift(&[
        "generate",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "The capital of France is",
        "-n",
        "8",
        "--temp",
        "0",
        "-t",
        "2",
        "--no-mmap",
    ]);
    assert!(copied.status.success(), "{}", text(&copied.stderr));
    assert_eq!(text(&copied.stdout), stdout);
    // llama.cpp's threading flags: one thread for the prompt (-tb 1), two for decoding, helpers
    // that never poll (--poll 0): the same text (the kernels' sums do not depend on the split).
    let threaded = sift(&[
        "generate",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "The capital of France is",
        "-n",
        "8",
        "--temp",
        "0",
        "-t",
        "2",
        "-tb",
        "1",
        "--poll",
        "0",
    ]);
    assert!(threaded.status.success(), "{}", text(&threaded.stderr));
    assert_eq!(text(&threaded.stdout), stdout);
    for (flag, value) in [("--poll", "101"), ("-tb", "0"), ("--threads-batch", "1099511627776")] {
        let bad = sift(&["generate", "-m", m.to_str().unwrap(), "-p", "x", "-n", "1", flag, value]);
        assert!(!bad.status.success(), "{flag} {value} was accepted");
        let err = text(&bad.stderr);
        assert!(err.contains("invalid value") && err.contains(value), "{flag} {value}: {err}");
    }
    // Sparse prefill's flags: a short prompt is one block (dense), so the same text; bad values
    // are refused with the flag named.
    let prefill = sift(&[
        "generate",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "The capital of France is",
        "-n",
        "8",
        "--temp",
        "0",
        "--prefill-sparsity",
        "0.5",
        "--prefill-masks",
        "random",
    ]);
    assert!(prefill.status.success(), "{}", text(&prefill.stderr));
    assert_eq!(text(&prefill.stdout), stdout);
    // The down copy is made with sparse prefill (where the CPU has the kernel) and said so.
    if sift_quant::Isa::detect() >= sift_quant::Isa::Avx512Vnni {
        assert!(text(&prefill.stderr).contains("8-bit neuron-major copy"), "{}", text(&prefill.stderr));
    }
    for (flag, value, says) in [
        ("--prefill-sparsity", "1.5", "--prefill-sparsity"),
        ("--prefill-masks", "trained", "oracle, random"),
        ("--prefill-down", "rows", "copy, columns"),
    ] {
        let bad = sift(&["generate", "-m", m.to_str().unwrap(), "-p", "x", "-n", "1", flag, value]);
        assert!(!bad.status.success(), "{flag} {value} was accepted");
        let err = text(&bad.stderr);
        assert!(err.contains(says) && err.contains(value), "{flag} {value}: {err}");
    }
}

#[test]
fn generate_with_seed_is_reproducible_and_stop_strings_stop() {
    let m = model();
    let args = [
        "generate",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "Once upon a time",
        "-n",
        "24",
        "-s",
        "7",
        "--temp",
        "0.9",
        "--no-display-prompt",
    ];
    let a = sift(&args);
    let b = sift(&args);
    assert!(a.status.success());
    assert_eq!(a.stdout, b.stdout, "same seed, different text");
    let full = text(&a.stdout);
    // Stop at the first space the sampled text contains after its first word.
    let word_end = full.trim_start().find(' ').map(|i| i + (full.len() - full.trim_start().len()));
    if let Some(end) = word_end {
        let mut stop_args = args.to_vec();
        stop_args.extend(["-r", " "]);
        let s = sift(&stop_args);
        assert!(s.status.success());
        assert_eq!(text(&s.stdout).trim_end_matches('\n'), &full[..end], "stop string did not cut the text");
    }
}

#[test]
fn perplexity_matches_llama_cpp_on_a_wikitext_excerpt() {
    // llama-perplexity -m SmolLM2-135M-Instruct.Q4_1.gguf -f tests/fixtures/wiki.test.head16k.raw
    //   -c 512 --chunks 4  →  Final estimate: PPL = 22.8855 +/- 2.29357 (llama.cpp 0c1e570)
    const LLAMA_CPP_PPL: f64 = 22.8855;
    let m = model();
    let f = root().join("tests/fixtures/wiki.test.head16k.raw");
    let out = sift(&[
        "perplexity",
        "-m",
        m.to_str().unwrap(),
        "-f",
        f.to_str().unwrap(),
        "-c",
        "512",
        "--chunks",
        "4",
        "-t",
        "2",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("[1]") && stdout.contains("[4]"), "{stdout}");
    let line = stdout.lines().find(|l| l.starts_with("Final estimate: PPL = ")).expect("final line");
    let ppl: f64 = line["Final estimate: PPL = ".len()..].split_whitespace().next().unwrap().parse().unwrap();
    let rel = (ppl - LLAMA_CPP_PPL).abs() / LLAMA_CPP_PPL;
    assert!(rel < 0.01, "PPL {ppl} vs llama.cpp {LLAMA_CPP_PPL} ({:.2}%)", rel * 100.0);
    assert!(line.contains("+/-"));
}

#[test]
fn bench_json_has_llama_bench_fields() {
    let m = model();
    let out = sift(&["bench", "-m", m.to_str().unwrap(), "-p", "16", "-n", "4", "-r", "2", "-t", "2", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let arr = v.as_array().expect("array");
    assert_eq!(arr.len(), 2);
    assert_eq!((arr[0]["n_prompt"].as_u64(), arr[0]["n_gen"].as_u64()), (Some(16), Some(0)));
    assert_eq!((arr[1]["n_prompt"].as_u64(), arr[1]["n_gen"].as_u64()), (Some(0), Some(4)));
    for r in arr {
        assert!(r["avg_ts"].as_f64().unwrap() > 0.0);
        assert!(r["stddev_ts"].as_f64().unwrap() >= 0.0);
        assert_eq!(r["samples_ts"].as_array().unwrap().len(), 2);
        assert_eq!(r["n_depth"].as_u64(), Some(0));
        // The type as llama-bench prints it, from general.file_type.
        assert!(r["model_type"].as_str().unwrap().ends_with(" Q4_1"), "{r}");
    }
    // -p 0 skips the prompt test; markdown is the default; -d runs every test at every depth.
    let out = sift(&["bench", "-m", m.to_str().unwrap(), "-p", "0", "-n", "4", "-d", "0,24", "-r", "1", "-t", "1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let md = text(&out.stdout);
    assert!(md.contains("tg4 |"), "{md}");
    assert!(md.contains("tg4 @ d24 |"), "{md}");
    assert!(!md.contains("pp") && !md.contains("guessed"), "{md}");
}

#[test]
fn inspect_lists_metadata_and_tensors() {
    let m = model();
    let out = sift(&["inspect", m.to_str().unwrap()]);
    assert!(out.status.success());
    let s = text(&out.stdout);
    assert!(s.contains("general.architecture") && s.contains("\"llama\""), "{s}");
    assert!(s.contains("272 tensors") && s.contains("token_embd.weight") && s.contains("Q8_0"), "{s}");
}

#[test]
fn chat_answers_each_turn_with_the_template() {
    use std::io::Write;
    let m = model();
    let mut child = sift_cmd()
        .args(["chat", "-m", m.to_str().unwrap(), "--temp", "0", "-n", "24", "-t", "2"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"What is the capital of France?\nAnd of Italy?\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    // The first answer is what `generate --chat-template` gives for the same single turn (its
    // tokens are llama.cpp's: the `howto`/`chat` greedy fixtures cover this template path).
    let single = sift(&[
        "generate",
        "-m",
        m.to_str().unwrap(),
        "--chat-template",
        "-p",
        "What is the capital of France?",
        "--temp",
        "0",
        "-n",
        "24",
        "-t",
        "2",
        "--no-display-prompt",
    ]);
    let first = text(&single.stdout);
    let first = first.trim_end();
    assert!(!first.is_empty());
    assert!(s.starts_with(first), "chat's first answer {s:?} differs from generate's {first:?}");
    // A second, non-empty answer follows; the template's markup is never printed.
    let rest = s[first.len()..].trim();
    assert!(!rest.is_empty(), "no second answer: {s:?}");
    assert!(!s.contains("<|im_start|>") && !s.contains("<|im_end|>"), "{s}");
}

#[test]
fn bad_inputs_fail_with_clear_errors() {
    let dir = std::env::temp_dir().join(format!("sift-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bytes = std::fs::read(model()).unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated.gguf", bytes[..bytes.len() / 2].to_vec(), "past the end"),
        ("header-only.gguf", bytes[..100].to_vec(), "truncated"),
        ("foreign.gguf", b"PK\x03\x04 this is a zip file, not a model".to_vec(), "not a sift pack or a GGUF file"),
        ("empty.gguf", Vec::new(), "GGUF"),
    ];
    for (name, data, want) in cases {
        let p = dir.join(name);
        std::fs::write(&p, data).unwrap();
        let out = sift(&["generate", "-m", p.to_str().unwrap(), "-p", "hi", "-n", "1"]);
        assert!(!out.status.success(), "{name} should fail");
        let err = text(&out.stderr);
        assert!(err.contains(want), "{name}: {err}");
        assert!(!err.contains("panicked"), "{name} panicked: {err}");
    }
    // An architecture sift does not know: rewrite "llama" in general.architecture.
    let mut foreign = bytes.clone();
    let pos = foreign.windows(5).position(|w| w == b"llama").unwrap();
    foreign[pos..pos + 5].copy_from_slice(b"mamba");
    let p = dir.join("mamba.gguf");
    std::fs::write(&p, &foreign).unwrap();
    let out = sift(&["generate", "-m", p.to_str().unwrap(), "-p", "hi", "-n", "1"]);
    let err = text(&out.stderr);
    assert!(!out.status.success() && err.contains("unsupported architecture 'mamba'"), "{err}");
    // A quant type sift has no kernels for: blk.0.attn_q.weight (Q4_1, id 3, 20 bytes per 32
    // values) relabelled IQ4_NL (id 20, 18 bytes per 32), which still fits inside its own data
    // (a larger type would overlap the next tensor: refused as a corrupt file).
    let mut relabelled = bytes.clone();
    let name = b"blk.0.attn_q.weight";
    let at = relabelled.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    let ty = at + 4 + 2 * 8; // u32 n_dims, two u64 dims, then the u32 type id
    assert_eq!(u32::from_le_bytes(relabelled[ty..ty + 4].try_into().unwrap()), 3);
    relabelled[ty..ty + 4].copy_from_slice(&20u32.to_le_bytes());
    let p = dir.join("iq4_nl.gguf");
    std::fs::write(&p, &relabelled).unwrap();
    let out = sift(&["generate", "-m", p.to_str().unwrap(), "-p", "hi", "-n", "1"]);
    let err = text(&out.stderr);
    assert!(!out.status.success() && err.contains("IQ4_NL") && err.contains("blk.0.attn_q.weight"), "{err}");
    let out = sift(&["generate", "-m", "/nonexistent/model.gguf", "-p", "hi"]);
    assert!(text(&out.stderr).contains("fetch-model.sh"));
    // A prompt longer than the context.
    let out = sift(&["generate", "-m", model().to_str().unwrap(), "-p", &"word ".repeat(100), "-c", "16", "-n", "4"]);
    let err = text(&out.stderr);
    assert!(!out.status.success() && err.contains("more than 16 tokens") && err.contains("raise -c"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn pack_then_sparse_generation_sweep_and_bad_sparsity_flags() {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("m.sift");
    let m = model();
    let o = sift(&["pack", m.to_str().unwrap(), "-o", pack.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    // The pack runs alone (tokenizer, template inside) and decodes on the column kernels.
    let p = pack.to_str().unwrap();
    let o = sift(&[
        "generate",
        "-m",
        p,
        "-p",
        "The capital of France is",
        "-n",
        "8",
        "--temp",
        "0",
        "--sparsity",
        "topk",
        "--ratio",
        "0.3",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stdout).starts_with("The capital of France is") && text(&o.stdout).len() > 30);
    // Sweep over two methods on a short text: CSV rows and the plot.
    let out = dir.path().join("sweep");
    let f = root().join("tests/fixtures/wiki.test.head16k.raw");
    let o = sift(&[
        "sweep",
        "-m",
        m.to_str().unwrap(),
        "-f",
        f.to_str().unwrap(),
        "-c",
        "128",
        "--chunks",
        "2",
        "--methods",
        "topk,glu",
        "--ratios",
        "0,0.5",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let csv = std::fs::read_to_string(out.join("sweep.csv")).unwrap();
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(rows.len(), 4, "header + dense + topk + glu:\n{csv}");
    let ppl = |r: &str| r.split(',').nth(3).unwrap().parse::<f64>().unwrap();
    assert!(ppl(rows[2]) > ppl(rows[1]) && ppl(rows[3]) > ppl(rows[1]) * 0.99, "{csv}");
    assert!(std::fs::read_to_string(out.join("ppl_vs_bytes.svg")).unwrap().contains("<svg"));
    // Bad flags name the problem.
    let ms = m.to_str().unwrap();
    let o = sift(&["generate", "-m", ms, "-p", "x", "-n", "1", "--sparsity", "magic"]);
    assert!(!o.status.success() && text(&o.stderr).contains("unknown sparsity method 'magic'"));
    let o = sift(&["generate", "-m", ms, "-p", "x", "-n", "1", "--sparsity", "topk", "--ratio", "1.5"]);
    assert!(!o.status.success() && text(&o.stderr).contains("use a number from 0 to 1"), "{}", text(&o.stderr));
    let o = sift(&["generate", "-m", ms, "-p", "x", "-n", "1", "--sparsity", "threshold"]);
    assert!(!o.status.success() && text(&o.stderr).contains("sift calibrate"), "{}", text(&o.stderr));
    let bad = dir.path().join("bad.sift");
    let mut header = b"SIFTPACK\x09\0\0\0".to_vec();
    header.resize(64, 0);
    std::fs::write(&bad, &header).unwrap();
    let o = sift(&["generate", "-m", bad.to_str().unwrap(), "-p", "x", "-n", "1"]);
    assert!(!o.status.success() && text(&o.stderr).contains("stale pack"), "{}", text(&o.stderr));
    // Under a memory budget: the same text as in memory, the store's report on stderr.
    let greedy = |extra: &[&str]| {
        let mut args = vec!["generate", "-m", p, "-p", "The capital of France is", "-n", "8", "--temp", "0"];
        args.extend_from_slice(&["-c", "256", "--sparsity", "topk", "--ratio", "0.3"]);
        args.extend_from_slice(extra);
        sift(&args)
    };
    let (free, tight) = (greedy(&[]), greedy(&["--memory", "150%", "--cache-policy", "tam", "--preload", "1", "-v"]));
    assert!(tight.status.success(), "{}", text(&tight.stderr));
    assert_eq!(text(&free.stdout), text(&tight.stdout));
    let err = text(&tight.stderr);
    assert!(err.contains("memory budget") && err.contains("hit rate") && err.contains("preload precision"), "{err}");
    // -v: the decode against its bound.
    assert!(err.contains("% of the bound") && err.contains("amplification") && err.contains("by bytes"), "{err}");
    let o = greedy(&["--memory", "20M"]);
    assert!(!o.status.success() && text(&o.stderr).contains("too small to run"), "{}", text(&o.stderr));
    let o = greedy(&["--memory", "lots"]);
    assert!(!o.status.success() && text(&o.stderr).contains("bad --memory 'lots'"), "{}", text(&o.stderr));
    // --memory on the GGUF itself: its pack is built (here in --pack-dir) and the run goes on.
    let packs = dir.path().join("packs");
    let o =
        sift(&["generate", "-m", ms, "-p", "x", "-n", "1", "--memory", "1G", "--pack-dir", packs.to_str().unwrap()]);
    assert!(o.status.success() && packs.join("SmolLM2-135M-Instruct.Q4_1.sift").exists(), "{}", text(&o.stderr));
    // static: the hot set comes from a calibration file's per-channel magnitudes.
    let o = greedy(&["--memory", "150%", "--cache-policy", "static"]);
    assert!(!o.status.success() && text(&o.stderr).contains("--calib"), "{}", text(&o.stderr));
    let cal = dir.path().join("cal.json");
    let o = sift(&[
        "calibrate",
        ms,
        "-f",
        f.to_str().unwrap(),
        "--tokens",
        "256",
        "--window",
        "128",
        "--target",
        "0.5",
        "--greedy-tokens",
        "16",
        "--step",
        "0.25",
        "-o",
        cal.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let pinned = greedy(&["--memory", "150%", "--cache-policy", "static", "--calib", cal.to_str().unwrap()]);
    assert!(pinned.status.success(), "{}", text(&pinned.stderr));
    assert_eq!(text(&free.stdout), text(&pinned.stdout));
    assert!(text(&pinned.stderr).contains("cache static"), "{}", text(&pinned.stderr));
}

/// Numeric flags out of range are refused with a message naming the range (issue 22): `-t` and
/// `-b` at 2^40 used to abort in the allocator.
#[test]
fn thread_and_batch_counts_out_of_range_are_refused() {
    for (flag, value, says) in [
        ("-t", "1099511627776", "use 1 to 1024"),
        ("-t", "0", "use 1 to 1024"),
        ("-b", "1099511627776", "use 1 to 1048576"),
    ] {
        let out = sift(&["generate", "-m", model().to_str().unwrap(), "-p", "hi", "-n", "1", flag, value]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(err.contains(says), "{flag} {value}: {err}");
        assert!(!err.contains("panicked") && !err.contains("alloc"), "{flag} {value}: {err}");
    }
    let out = sift(&["bench", "-m", model().to_str().unwrap(), "-t", "1,99999", "-p", "8", "-n", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}
