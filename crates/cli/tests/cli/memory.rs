//! The memory budget end to end: trace, simulate and plan, a budget changed while generating,
//! the KV cache grown inside it, the column file a budgeted GGUF run builds (and where), and the
//! machine profile budgeted runs learn from.

use super::*;

/// A pack of the default model and a trace recorded from it under a 120 MiB budget (Top-K 0.5,
/// preloading 4 layers), made once for this file's tests, with the hit rate and budget the run
/// printed.
struct Traced {
    _dir: tempfile::TempDir,
    pack: PathBuf,
    trace: PathBuf,
    /// The engine's hit rate over the traced run, in percent.
    hit_rate: f64,
    /// The budget line's MiB, as printed.
    budget: String,
}

/// The prompt and settings the traced run and the budget-change runs share.
const PROMPT: [&str; 6] = ["-p", "The capital of France is", "--temp", "0", "-c", "256"];

fn traced() -> &'static Traced {
    static TRACED: std::sync::OnceLock<Traced> = std::sync::OnceLock::new();
    TRACED.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let pack = dir.path().join("m.sift");
        let o = sift(&["pack", model().to_str().unwrap(), "-o", pack.to_str().unwrap()]);
        assert!(o.status.success(), "{}", text(&o.stderr));
        let trace = dir.path().join("t.trace");
        let mut args = vec!["trace", "-m", pack.to_str().unwrap()];
        args.extend_from_slice(&PROMPT);
        args.extend_from_slice(&[
            "-n",
            "12",
            "--sparsity",
            "topk",
            "--ratio",
            "0.5",
            "--memory",
            "120M",
            "--preload",
            "4",
        ]);
        args.extend_from_slice(&["--profile", "dip-a18", "-o", trace.to_str().unwrap()]);
        let o = sift(&args);
        assert!(o.status.success(), "{}", text(&o.stderr));
        let err = text(&o.stderr);
        let at = err.find("hit rate").unwrap_or_else(|| panic!("no 'hit rate' in {err}")) + "hit rate".len();
        let hit_rate =
            err[at..].trim_start().split(|c: char| c == '%' || c.is_whitespace()).next().unwrap().parse().unwrap();
        let budget = err.split("memory budget ").nth(1).unwrap().split(' ').next().unwrap().to_string();
        Traced { _dir: dir, pack, trace, hit_rate, budget }
    })
}

#[test]
fn simulator_replays_a_traced_run_at_the_engines_hit_rate() {
    let t = traced();
    let (p, real, budget) = (t.pack.to_str().unwrap(), t.hit_rate, &t.budget);
    let trace = &t.trace;
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
}

#[test]
fn hybrid_simulation_on_a_paper_gpu_is_bounded_by_the_oracle_placement() {
    let t = traced();
    let (p, trace) = (t.pack.to_str().unwrap(), &t.trace);
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
}

#[test]
fn hybrid_simulation_from_a_measured_gpu_profile_places_dense_parts_as_the_engine_does() {
    let t = traced();
    let (p, trace) = (t.pack.to_str().unwrap(), &t.trace);
    let dir = tempfile::tempdir().unwrap();
    // A measured profile with the engine's costs (`sift probe --gpu -m PACK`): sift's own hybrid
    // decode replayed, its dense parts placed as the engine places them.
    let mut prof = serde_json::json!({
        "name": "a GPU", "device_bw": 3.0e12, "round_trip_ns": 17000.0, "host_read_bw": 5.0e10,
        "h2d": [[4096, 1.6e9], [65536, 1.67e10], [1048576, 4.78e10], [16777216, 5.43e10]],
        "engine": {"attention_gpu_ns": 70000.0, "attention_cpu_ns": 40000.0, "site_ns": 2000.0,
            "gpu_queue_ns": 12000.0, "gpu_result_ns": 15000.0, "cpu_site_ns": 5000.0, "cpu_value_ns": 0.02,
            "layer_ns": 20000.0, "head_gpu_ns": 30000.0, "head_cpu_ns": 500000.0, "load_issue_ns": 4000.0, "dense_gpu_layer_ns": 60000.0,
            "dense_cpu_layer_ns": 80000.0, "dense_round_trip_ns": 17000.0}
    });
    let profile = dir.path().join("gpu.json");
    std::fs::write(&profile, prof.to_string()).unwrap();
    let gpu_sim = |extra: &[&str]| {
        let mut args =
            vec!["simulate", "--trace", trace.to_str().unwrap(), "-m", p, "--gpu", profile.to_str().unwrap()];
        args.extend_from_slice(&["-c", "256", "--gpu-memory", "10%,75%", "-o", "json"]);
        args.extend_from_slice(extra);
        sift(&args)
    };
    let o = gpu_sim(&["--gpu-policy", "layers,static,tam-adaptive,oracle"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("oracle bound belongs to KAIROX"), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let runs = v.as_array().unwrap();
    assert_eq!(runs.len(), 6, "{v}");
    assert!(runs[0]["placed"].as_str().unwrap().ends_with("of 30 layers"), "{v}");
    assert_eq!(runs[1]["reloads_per_token"], 0.0, "{v}");
    // At 75 % attention (with its KV cache for -c 256) goes to the GPU first; at 10 % it does not.
    assert!(!runs[1]["placed"].as_str().unwrap().contains("attention"), "{v}");
    assert!(runs[4]["placed"].as_str().unwrap().starts_with("attention"), "{v}");
    assert_eq!(runs[5]["lambda"].as_array().unwrap().len(), 12, "λ after each decoded token");
    let o = gpu_sim(&["--gpu-policy", "static", "--gpu-attention", "off"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(!v[1]["placed"].as_str().unwrap().contains("attention"), "{v}");
    // A damaged profile is refused, naming what to do.
    prof["engine"]["cpu_value_ns"] = serde_json::json!(-1.0);
    std::fs::write(&profile, prof.to_string()).unwrap();
    let o = gpu_sim(&[]);
    assert!(!o.status.success() && text(&o.stderr).contains("sift probe --gpu -m PACK"), "{}", text(&o.stderr));
}

/// `sift plan`'s JSON answer for the fixture's pack under `budget`.
fn plan_json(budget: &str, extra: &[&str]) -> serde_json::Value {
    let p = traced().pack.to_str().unwrap();
    let mut args = vec!["plan", "-m", p, "--memory", budget, "--profile", "dip-a18", "-c", "256", "-o", "json"];
    args.extend_from_slice(extra);
    let o = sift(&args);
    assert!(o.status.success(), "{}", text(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn planner_picks_settings_within_the_budget_and_refuses_what_cannot_run() {
    let pack = &traced().pack;
    let p = pack.to_str().unwrap();
    // The planner: settings and the predicted speed, within the budget.
    let plan = plan_json("130M", &[]);
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
    assert!(pack.with_extension("sift.plan.trace").exists());
    let cost = plan_json("130M", &["--cost-model"]);
    assert_eq!(cost["predicted_by"], "cost model", "{cost}");
    let o = sift(&["plan", "-m", p, "--memory", "10M", "--profile", "dip-a18"]);
    assert!(!o.status.success() && text(&o.stderr).contains("too small"), "{}", text(&o.stderr));
    let o = sift(&["plan", "-m", p, "--memory", "130M", "--profile", "no-such-device"]);
    assert!(!o.status.success() && text(&o.stderr).contains("sift probe"), "{}", text(&o.stderr));
}

#[test]
fn a_budget_changed_while_generating_keeps_the_text_and_holds() {
    let p = traced().pack.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // A budget file rewritten mid-generation: the text stays that of an unchanged run, and the
    // process is under the new budget right after the change.
    let gen = |extra: &[&str]| -> Vec<String> {
        let mut args = vec!["generate", "-m", p];
        args.extend_from_slice(&PROMPT);
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
    let plan_mib =
        plan_json("140M", &["--cost-model"])["memory"]["runtime"].as_u64().unwrap() as f64 / (1 << 20) as f64;
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
