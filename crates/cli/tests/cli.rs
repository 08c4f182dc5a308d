//! The `sift` binary end to end on the real SmolLM2-135M Q4_1 model: generation, perplexity
//! against llama.cpp's figure, bench output shapes, inspect, and clear errors for bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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
    for (flag, value, says) in
        [("--prefill-sparsity", "1.5", "--prefill-sparsity"), ("--prefill-masks", "trained", "oracle, random")]
    {
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

#[test]
fn trace_simulate_plan_and_a_budget_changed_while_generating() {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("m.sift");
    let o = sift(&["pack", model().to_str().unwrap(), "-o", pack.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let p = pack.to_str().unwrap();
    let base = ["-m", p, "-p", "The capital of France is", "--temp", "0", "-c", "256"];
    // Record a trace under a budget, then replay it: the simulator's hit rate is the engine's.
    let trace = dir.path().join("t.trace");
    let mut args = vec!["trace"];
    args.extend_from_slice(&base);
    args.extend_from_slice(&["-n", "12", "--sparsity", "topk", "--ratio", "0.5", "--memory", "120M", "--preload", "4"]);
    args.extend_from_slice(&["--profile", "dip-a18", "-o", trace.to_str().unwrap()]);
    let o = sift(&args);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    let hit = |s: &str, key: &str| -> f64 {
        let at = s.find(key).unwrap_or_else(|| panic!("no '{key}' in {s}")) + key.len();
        s[at..].trim_start().split(|c: char| c == '%' || c.is_whitespace()).next().unwrap().parse().unwrap()
    };
    let real = hit(&err, "hit rate");
    let budget = err.split("memory budget ").nth(1).unwrap().split(' ').next().unwrap().to_string();
    let o = sift(&[
        "simulate",
        "--trace",
        trace.to_str().unwrap(),
        "-m",
        p,
        "--profile",
        "dip-a18",
        "--memory",
        "120M",
        "--policy",
        "lfu,belady",
        "-o",
        "json",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let sim = v[0]["hit_rate"].as_f64().unwrap() * 100.0;
    assert!((sim - real).abs() < 0.051, "simulated hit rate {sim} vs the engine's {real} (budget {budget} MiB)");
    assert!(v[1]["hit_rate"].as_f64().unwrap() >= v[0]["hit_rate"].as_f64().unwrap(), "belady >= lfu");
    assert!(v[0]["tok_s"].as_f64().unwrap() > 0.0);
    // The same trace through KAIROX's hybrid decode on a paper GPU: every budget × policy, the
    // oracle placement bounding the others, and the static placement never reloading.
    let o = sift(&[
        "simulate",
        "--trace",
        trace.to_str().unwrap(),
        "-m",
        p,
        "--gpu",
        "rtx4090-pcie4",
        "--gpu-memory",
        "50%,75%",
        "--gpu-policy",
        "oracle,static,lru,tam-adaptive",
        "--group-size",
        "8",
        "-o",
        "json",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let runs = v.as_array().unwrap();
    assert_eq!(runs.len(), 8, "{v}");
    for budget in runs.chunks(4) {
        let oracle = budget[0]["tok_s"].as_f64().unwrap();
        assert_eq!(budget[1]["reloads_per_token"], 0.0, "{v}");
        for r in budget {
            assert!(r["tok_s"].as_f64().unwrap() <= oracle * 1.000001, "{v}");
            let share = r["cpu_share"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&share), "{v}");
        }
    }
    let groups = |r: &serde_json::Value| r["placed"].as_str().unwrap().parse::<u64>().unwrap();
    assert!(groups(&runs[4]) > groups(&runs[0]), "{v}");
    assert_eq!(runs[3]["lambda"].as_array().unwrap().len(), 12, "λ after each decoded token");
    let o = sift(&["simulate", "--trace", trace.to_str().unwrap(), "-m", p, "--gpu", "no-such-gpu"]);
    assert!(!o.status.success() && text(&o.stderr).contains("rtx4090-pcie4"), "{}", text(&o.stderr));
    // The planner: settings and the predicted speed, within the budget.
    let o = sift(&["plan", "-m", p, "--memory", "130M", "--profile", "dip-a18", "-c", "256", "-o", "json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let plan: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mem = &plan["memory"];
    let used: u64 = [
        "runtime",
        "resident_weights",
        "column_scales",
        "kv_and_scratch",
        "buffers",
        "cache_index",
        "cache_entries",
        "cache",
    ]
    .iter()
    .map(|k| mem[k].as_u64().unwrap())
    .sum();
    assert!(used <= 130 << 20, "{plan}");
    assert!(plan["predicted_tok_s"].as_f64().unwrap() > 0.0 && plan["ratio"].as_f64().unwrap() <= 0.6);
    // Without --trace the planner simulates its own trace, recorded once beside the pack.
    assert_eq!(plan["predicted_by"], "simulation", "{plan}");
    assert!(dir.path().join("m.sift.plan.trace").exists());
    let o =
        sift(&["plan", "-m", p, "--memory", "130M", "--profile", "dip-a18", "-c", "256", "--cost-model", "-o", "json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let cost: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(cost["predicted_by"], "cost model", "{cost}");
    let o = sift(&["plan", "-m", p, "--memory", "10M", "--profile", "dip-a18"]);
    assert!(!o.status.success() && text(&o.stderr).contains("too small"), "{}", text(&o.stderr));
    let o = sift(&["plan", "-m", p, "--memory", "130M", "--profile", "no-such-device"]);
    assert!(!o.status.success() && text(&o.stderr).contains("sift probe"), "{}", text(&o.stderr));

    // A budget file rewritten mid-generation: the text stays that of an unchanged run, and the
    // process is under the new budget right after the change.
    let gen = |extra: &[&str]| -> Vec<String> {
        let mut args = vec!["generate"];
        args.extend_from_slice(&base);
        args.extend_from_slice(&["-n", "40", "--sparsity", "topk", "--ratio", "0.5", "--profile", "dip-a18"]);
        args.extend_from_slice(extra);
        args.into_iter().map(String::from).collect()
    };
    let steady = sift_cmd().args(gen(&["--memory", "140M"])).output().unwrap();
    assert!(steady.status.success(), "{}", text(&steady.stderr));
    // `sift plan` and a budgeted run measure the process's runtime memory the same way.
    let line =
        text(&steady.stderr).lines().find(|l| l.contains("memory budget 140 MiB = runtime")).unwrap().to_string();
    let run_mib: f64 = line.split("runtime ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    let plan_mib = mem["runtime"].as_u64().unwrap() as f64 / (1 << 20) as f64;
    assert!((plan_mib - run_mib).abs() <= 4.0, "sift plan counts {plan_mib:.1} MiB of runtime, the run {line}");
    let file = dir.path().join("budget");
    std::fs::write(&file, "140M").unwrap();
    let mut child = sift_cmd()
        .args(gen(&["--memory", "140M", "--budget-file", file.to_str().unwrap()]))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Rewrite the file once the first words are out.
    let mut stdout = child.stdout.take().unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 64];
    use std::io::Read;
    while got.len() < "The capital of France is".len() + 12 {
        let n = stdout.read(&mut buf).unwrap();
        assert!(n > 0, "the run ended early");
        got.extend_from_slice(&buf[..n]);
    }
    std::fs::write(&file, "115M").unwrap();
    stdout.read_to_end(&mut got).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(text(&got), text(&steady.stdout), "the budget change must not change the text");
    let line = err.lines().find(|l| l.contains("budget -> 115 MiB")).unwrap_or_else(|| panic!("{err}"));
    let rss: f64 = line.split("RSS after ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(rss <= 115.0, "RSS {rss} MiB after the change to 115 MiB: {line}");
    assert!(err.contains("memory budget 115 MiB"), "{err}");
}

/// The number after `key` in `s` (up to a space, '%' or ';').
fn number_after(s: &str, key: &str) -> f64 {
    let at = s.find(key).unwrap_or_else(|| panic!("no '{key}' in {s}")) + key.len();
    let tail = s[at..].trim_start();
    tail.split(|c: char| c.is_whitespace() || c == '%' || c == ';' || c == ')').next().unwrap().parse().unwrap()
}

#[test]
fn kv_cache_grows_inside_the_budget_and_a_sequence_that_outgrows_it_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pack = dir.path().join("m.sift");
    let o = sift(&["pack", model().to_str().unwrap(), "-o", pack.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let p = pack.to_str().unwrap();
    let run = |budget: &str, n: &str| {
        sift(&[
            "generate",
            "-m",
            p,
            "-p",
            "Once upon a time",
            "--temp",
            "0",
            "--ignore-eos",
            "-c",
            "2048",
            "-n",
            n,
            "-t",
            "2",
            "--sparsity",
            "topk",
            "--ratio",
            "0.5",
            // The fixed part must not change with the budget (the planner's preload would).
            "--preload",
            "0",
            "--memory",
            budget,
        ])
    };
    // 600 tokens: the KV cache takes three pages of 256 positions, the first planned at the start
    // and two taken from the column cache on the way; the process stays inside the budget.
    let o = run("150%", "600");
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    let budget = number_after(&err, "memory budget");
    let grown = number_after(&err, "KV grown by");
    // Two pages of SmolLM2's f16 K and V: 2 × 256 positions × 30 layers × 2 × 192 values × 2 bytes.
    assert!((grown - 11.25).abs() <= 0.1, "KV growth {grown} MiB: {err}");
    let peak = number_after(&err, "peak memory (VmHWM) =");
    assert!(peak <= budget, "peak RSS {peak} MiB over the budget {budget} MiB: {err}");
    // The same run with the budget's fixed part (at the start: the printed one holds the growth)
    // + 3 MiB: the first page fits, the second cannot
    // come out of a 3 MiB cache, so generation stops at 256 tokens with the reason.
    let fixed = number_after(&err, "fixed part") - grown;
    let tight = format!("{}M", (fixed + 3.0).ceil() as u64);
    let o = run(&tight, "600");
    let err = text(&o.stderr);
    assert!(!o.status.success(), "a 600-token sequence cannot fit {tight}: {err}");
    assert!(err.contains("the KV cache for 257 tokens") && err.contains("does not fit the memory budget"), "{err}");
    assert!(err.contains("that are not weight cache take"), "the error gives the figures: {err}");
    assert!(err.contains("-ctk q8_0"), "the error says what to do: {err}");
}

#[test]
fn memory_on_a_gguf_builds_its_column_file_once_and_never_trusts_a_stale_one() {
    let dir = tempfile::tempdir().unwrap();
    let g = dir.path().join("smol.gguf");
    std::fs::copy(model(), &g).unwrap();
    let gs = g.to_str().unwrap().to_string();
    let run = |extra: &[&str]| {
        let mut args = vec!["generate", "-m", &gs, "-p", "The capital of France is", "-n", "6", "--temp", "0"];
        args.extend_from_slice(&["-c", "256", "-t", "2", "--sparsity", "topk", "--ratio", "0.5", "--memory", "150%"]);
        args.extend_from_slice(extra);
        sift(&args)
    };
    let pack = dir.path().join("smol.sift");
    // First run: the column file is built next to the GGUF; it holds no copy of the GGUF.
    let o = run(&[]);
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("building the column file") && pack.exists(), "{err}");
    let (gguf_len, pack_len) = (std::fs::metadata(&g).unwrap().len(), std::fs::metadata(&pack).unwrap().len());
    assert!(pack_len as f64 <= 1.15 * gguf_len as f64, "column file {pack_len} bytes for a GGUF of {gguf_len}");
    let want = text(&o.stdout);
    assert!(want.len() > "The capital of France is".len(), "{want}");
    // Second run: reused, same text.
    let o = run(&[]);
    assert!(o.status.success() && !text(&o.stderr).contains("building"), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), want);
    // Only the GGUF's modification time changed (a copy, a touch): the whole file is hashed once,
    // matches, and the column file is reused.
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(60);
    std::fs::File::options().write(true).open(&g).unwrap().set_modified(later).unwrap();
    let o = run(&[]);
    assert!(o.status.success() && !text(&o.stderr).contains("building"), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), want);
    // The GGUF's contents changed (one byte in its middle, same size): built again,
    // and it says why.
    let mut bytes = std::fs::read(&g).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    std::fs::write(&g, &bytes).unwrap();
    let o = run(&[]);
    let err = text(&o.stderr);
    assert!(o.status.success() && err.contains("contents differ") && err.contains("building it again"), "{err}");
    bytes[mid] ^= 1;
    std::fs::write(&g, &bytes).unwrap();
    // --pack-dir: the column file lives there. A build killed mid-write leaves nothing a later
    // run trusts; a foreign file in its place is replaced.
    let pd = dir.path().join("packs");
    std::fs::create_dir(&pd).unwrap();
    let out = pd.join("smol.sift");
    let mut child = sift_cmd()
        .args(["pack", &gs, "-o", out.to_str().unwrap()])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut progress = child.stderr.take().unwrap();
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    use std::io::Read;
    while !String::from_utf8_lossy(&seen).contains("packing layer") {
        assert_eq!(progress.read(&mut byte).unwrap(), 1, "sift pack ended before its first layer");
        seen.push(byte[0]);
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!out.exists(), "a killed build left {}", out.display());
    std::fs::write(&out, b"SIFTPACK half a pack").unwrap();
    let o = run(&["--pack-dir", pd.to_str().unwrap()]);
    let err = text(&o.stderr);
    assert!(o.status.success() && err.contains("cannot be used") && err.contains("building it again"), "{err}");
    assert_eq!(text(&o.stdout), want);
}

/// A folder made read-only for the test's lifetime: by its permission bits, and where those do
/// not stop this user (root), by the immutable attribute. `None` when neither holds.
struct ReadOnlyDir(PathBuf);

impl ReadOnlyDir {
    fn new(dir: &Path) -> Option<ReadOnlyDir> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555)).ok()?;
        let guard = ReadOnlyDir(dir.to_path_buf());
        let writable = || tempfile::tempfile_in(dir).is_ok();
        if writable() {
            let ok = Command::new("chattr").arg("+i").arg(dir).status().is_ok_and(|s| s.success());
            if !ok || writable() {
                return None;
            }
        }
        Some(guard)
    }
}

impl Drop for ReadOnlyDir {
    fn drop(&mut self) {
        use std::os::unix::fs::PermissionsExt;
        let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
        let _ = std::fs::set_permissions(&self.0, std::fs::Permissions::from_mode(0o755));
    }
}

#[test]
fn memory_on_a_gguf_in_a_read_only_folder_builds_its_column_file_in_the_cache_folder() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir(&models).unwrap();
    let g = models.join("smol.gguf");
    std::fs::copy(model(), &g).unwrap();
    let Some(_ro) = ReadOnlyDir::new(&models) else {
        eprintln!("skipping: cannot make a folder read-only here (no permission bits, no chattr)");
        return;
    };
    let cache = dir.path().join("cache");
    let run = || {
        sift_cmd()
            .args(["generate", "-m", g.to_str().unwrap(), "-p", "The capital of France is", "-n", "6"])
            .args(["--temp", "0", "-c", "256", "-t", "2", "--sparsity", "topk", "--ratio", "0.5", "--memory", "150%"])
            .env("XDG_CACHE_HOME", &cache)
            .output()
            .expect("run sift")
    };
    let o = run();
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    let pack = cache.join("sift/smol.sift");
    assert!(err.contains("building the column file") && pack.exists(), "{err}");
    assert_eq!(std::fs::read_dir(&models).unwrap().count(), 1, "nothing was written beside the GGUF");
    let want = text(&o.stdout);
    // Found again in the cache folder: not rebuilt, same text.
    let o = run();
    assert!(o.status.success() && !text(&o.stderr).contains("building"), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), want);
}

/// Without `--profile`, this machine is probed once, its profile kept in the user's cache
/// folder, re-probed when stale or damaged, and budgeted runs fold what they measured into it.
#[test]
fn machine_profile_is_probed_once_kept_and_learns_from_runs() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let pack = dir.path().join("m.sift");
    let o = sift(&["pack", model().to_str().unwrap(), "-o", pack.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let p = pack.to_str().unwrap();
    let run = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_sift"));
        c.env_remove("SIFT_PROFILE").env("XDG_CACHE_HOME", &cache).args(args);
        let o = c.output().expect("run sift");
        assert!(o.status.success(), "{}", text(&o.stderr));
        text(&o.stderr)
    };
    let plan = ["plan", "-m", p, "--memory", "130M", "-c", "256", "--cost-model"];
    let profiles = || -> Vec<PathBuf> {
        std::fs::read_dir(cache.join("sift"))
            .map(|d| d.map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "toml")).collect())
            .unwrap_or_default()
    };
    let err = run(&plan);
    assert!(err.contains("probing this machine") && err.contains("first use"), "{err}");
    let kept = profiles();
    assert_eq!(kept.len(), 1, "{kept:?}");
    let toml = std::fs::read_to_string(&kept[0]).unwrap();
    let section = |toml: &str| toml.lines().any(|l| l == "[observed]");
    assert!(toml.contains("[disk]") && !section(&toml), "{toml}");
    // Kept: the next command does not probe.
    assert!(!run(&plan).contains("probing"));
    // A budgeted run records what it measured.
    run(&[
        "bench",
        "-m",
        p,
        "--memory",
        "120M",
        "--sparsity",
        "topk",
        "--ratio",
        "0.5",
        "-p",
        "0",
        "-n",
        "8",
        "-r",
        "1",
    ]);
    let toml = std::fs::read_to_string(&kept[0]).unwrap();
    assert!(section(&toml) && toml.contains("runs = 1"), "{toml}");
    // An old probe is taken again (its observations with it).
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(40 * 86_400);
    std::fs::File::options().write(true).open(&kept[0]).unwrap().set_modified(old).unwrap();
    let err = run(&plan);
    assert!(err.contains("probing this machine") && err.contains("stale (probed 40 days ago)"), "{err}");
    assert!(!section(&std::fs::read_to_string(&kept[0]).unwrap()));
    // So is a damaged one.
    std::fs::write(&kept[0], "name = [\n").unwrap();
    let err = run(&plan);
    assert!(err.contains("probing this machine") && err.contains("not a valid profile"), "{err}");
    assert_eq!(profiles(), kept);
}

/// `sift train prefill` on real text writes the expert predictor beside the model; sparse
/// prefill finds it there by itself, `--resume` continues it, and a missing or damaged one is a
/// clear error.
#[test]
fn train_prefill_writes_a_predictor_that_sparse_prefill_finds() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m.gguf");
    std::os::unix::fs::symlink(std::fs::canonicalize(model()).unwrap(), &m).unwrap();
    let bare = dir.path().join("bare.gguf");
    std::os::unix::fs::symlink(std::fs::canonicalize(model()).unwrap(), &bare).unwrap();
    let wiki = root().join("tests/fixtures/wiki.test.head16k.raw");
    let (m_s, text_s) = (m.to_str().unwrap(), wiki.to_str().unwrap());
    let train = [
        "train",
        "prefill",
        "-m",
        m_s,
        "-f",
        text_s,
        "--blocks",
        "3",
        "--seq-blocks",
        "4",
        "--compensator-steps",
        "6",
        "--compensator-batch",
        "1",
    ];
    let o = sift(&[&train[..], &["--steps", "4", "--batch", "2", "-t", "2", "--checkpoint-every", "2"]].concat());
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("wrote") && text(&o.stderr).contains("compensator r' = 72"),
        "{}",
        text(&o.stderr)
    );
    let side = dir.path().join("m.gguf.prefill");
    assert!(side.exists());
    let o = sift(&[&train[..], &["--batch", "2", "-t", "2", "--resume", "--steps", "2"]].concat());
    assert!(o.status.success() && text(&o.stderr).contains("resuming"), "{}", text(&o.stderr));
    let ppl = |model: &str, extra: &[&str]| {
        let mut a = vec!["perplexity", "-m", model, "-f", text_s, "-c", "512", "--chunks", "1", "-t", "2"];
        a.extend_from_slice(extra);
        sift(&a)
    };
    let o = ppl(m_s, &["--prefill-sparsity", "0.5"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("expert predictor"), "{}", text(&o.stderr));
    let o = ppl(m_s, &["--prefill-sparsity", "0.5", "--prefill-compensator", "on"]);
    assert!(o.status.success() && text(&o.stderr).contains("error compensator (r' = 72"), "{}", text(&o.stderr));
    // No predictor beside the model: auto keeps the oracle, `predicted` says what to do.
    let o = ppl(bare.to_str().unwrap(), &["--prefill-sparsity", "0.5"]);
    assert!(o.status.success() && !text(&o.stderr).contains("expert predictor"), "{}", text(&o.stderr));
    let o = ppl(bare.to_str().unwrap(), &["--prefill-sparsity", "0.5", "--prefill-masks", "predicted"]);
    assert!(!o.status.success() && text(&o.stderr).contains("sift train prefill"), "{}", text(&o.stderr));
    // A damaged side file is refused, naming it.
    std::fs::write(&side, b"SIFTPRED not really").unwrap();
    let o = ppl(m_s, &["--prefill-sparsity", "0.5"]);
    assert!(!o.status.success() && text(&o.stderr).contains("m.gguf.prefill"), "{}", text(&o.stderr));
}

/// `sift train distill` writes a GGUF LoRA that `--lora` loads on a sparse run and the fused
/// model beside it, resumes from them, and a damaged or foreign adapter file is refused naming
/// the problem.
#[test]
fn train_distill_writes_adapters_that_lora_loads() {
    let dir = tempfile::tempdir().unwrap();
    let m = model();
    let m = m.to_str().unwrap();
    let wiki = root().join("tests/fixtures/wiki.test.head16k.raw");
    let out = dir.path().join("a.lora.gguf");
    let o_s = out.to_str().unwrap();
    let train = ["train", "distill", "-m", m, "-f", wiki.to_str().unwrap(), "--seq", "32", "--rank", "4"];
    let more = ["--tokens", "2000", "-t", "2", "-o", o_s, "--checkpoint-every", "1"];
    let o = sift(&[&train[..], &more[..], &["--steps", "2", "--ratio", "0.5"]].concat());
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("adapters written"), "{}", text(&o.stderr));
    let o =
        sift(&[&train[..], &more[..], &["--steps", "1", "--ratio", "0.5", "--resume", "--rounding", "fresh"]].concat());
    assert!(o.status.success() && text(&o.stderr).contains("after 2 steps"), "{}", text(&o.stderr));
    let gen = |lora: &str| {
        sift(&[
            "generate",
            "-m",
            m,
            "--sparsity",
            "topk",
            "--ratio",
            "0.5",
            "--lora",
            lora,
            "-p",
            "The",
            "-n",
            "4",
            "--temp",
            "0",
            "-t",
            "2",
        ])
    };
    let o = gen(o_s);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stdout).len() > "The".len(), "{}", text(&o.stdout));
    // The fused model beside the adapters runs as any GGUF, the same size as the original.
    let fused = dir.path().join("a.gguf");
    assert_eq!(std::fs::metadata(&fused).unwrap().len(), std::fs::metadata(m).unwrap().len());
    let o = sift(&["generate", "-m", fused.to_str().unwrap(), "-p", "The", "-n", "2", "--temp", "0", "-t", "2"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    // export-lora with calibration text fuses with GPTQ's feedback on the tensors' own grids;
    // text with a rounding that does not read it is refused.
    let fused2 = dir.path().join("b.gguf");
    let export = ["export-lora", "-m", m, "--lora", o_s, "-f", wiki.to_str().unwrap(), "--calib-tokens", "1024"];
    let o = sift(&[&export[..], &["--sparsity", "topk", "-t", "2", "-o", fused2.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(std::fs::metadata(&fused2).unwrap().len(), std::fs::metadata(m).unwrap().len());
    let o = sift(&[&export[..], &["--rounding", "fresh", "-o", fused2.to_str().unwrap(), "--force"]].concat());
    assert!(!o.status.success() && text(&o.stderr).contains("gptq"), "{}", text(&o.stderr));
    // For another architecture (the same bytes, 'llama' written 'qwen2'), cut short, absent.
    let mut bytes = std::fs::read(&out).unwrap();
    let at = bytes.windows(5).position(|w| w == b"llama").unwrap();
    bytes[at..at + 5].copy_from_slice(b"qwen2");
    let foreign = dir.path().join("foreign.gguf");
    std::fs::write(&foreign, &bytes).unwrap();
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &std::fs::read(&out).unwrap()[..5000]).unwrap();
    for (f, want) in
        [(&foreign, "for a 'qwen2' model"), (&cut, "cut.gguf"), (&dir.path().join("none.gguf"), "none.gguf")]
    {
        let o = gen(f.to_str().unwrap());
        assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
        assert!(text(&o.stderr).contains(want) && !text(&o.stderr).contains("panicked"), "{}", text(&o.stderr));
    }
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
