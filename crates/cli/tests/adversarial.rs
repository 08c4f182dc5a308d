//! Hostile input to the `sift` binary (issue 22's probe, kept as a suite): numbers at 2^40, 2^62,
//! NaN, infinity and 1e30 on every numeric flag family; a FIFO as a budget file; chat templates that loop or grow; a model whose
//! weights compute NaN. Each must end with a clear error (exit 2 for flags, 1 for the rest) or run
//! normally — never a panic, an abort, a hang or a silent NaN. Real model: SmolLM2-135M.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn sift_cmd() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sift"));
    c.env("SIFT_PROFILE", "sift-dev-2core");
    c
}

fn model() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "{} missing: run scripts/fetch-model.sh first", p.display());
    p
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs sift, killing it after `limit` (a hang is a failure, not a stuck test run).
fn run_with_limit(args: &[&str], limit: Duration) -> Output {
    let mut child = sift_cmd()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run sift");
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            child.kill().unwrap();
            panic!("sift {} hung for more than {limit:?}", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

const HUGE: [&str; 6] = ["1099511627776", "4611686018427387904", "18446744073709551616", "nan", "inf", "1e30"];

/// Every numeric flag family at hostile values: refused when the command line is read (exit 2),
/// the message naming the accepted range; never a panic.
#[test]
fn hostile_numbers_are_refused_with_the_range() {
    let m = model();
    let m = m.to_str().unwrap();
    let gen = ["generate", "-m", m, "-p", "hi", "-n", "1"];
    let ppl = ["perplexity", "-m", m, "-f", "x.txt"];
    let bench = ["bench", "-m", m];
    let plan = ["plan", "-m", m, "--memory", "100M"];
    let calib = ["calibrate", m, "-f", "x.txt", "-o", "c.json"];
    let sweep = ["sweep", "-m", m, "-f", "x.txt"];
    let eval = ["eval", "-m", m, "-f", "x.jsonl"];
    let serve = ["serve", "-m", m, "--port", "0"];
    let prefill = ["train", "prefill", "-m", m, "-f", "x.txt"];
    let distill = ["train", "distill", "-m", m, "-f", "x.txt"];
    let cases: &[(&[&str], &str, &[&str], &str)] = &[
        (&gen, "-c", &HUGE, "use 0 to 16777216"),
        (&gen, "-t", &["0", "1099511627776"], "use 1 to 1024"),
        (&gen, "-b", &["0", "1099511627776"], "use 1 to 1048576"),
        (&gen, "--ratio", &["1", "1.5", "nan", "inf", "1e30"], "from 0 to 1"),
        (&gen, "--sparse-head", &["1", "nan", "inf"], "from 0 to 1"),
        (&gen, "--prefill-sparsity", &["1", "nan", "inf"], "from 0 to 1"),
        (&gen, "--cache-frac", &["1.5", "nan"], "from 0 to 1"),
        (&gen, "--alpha", &["2", "nan"], "from 0 to 1"),
        (&gen, "--gamma", &["nan", "inf", "1e30"], "from 0 to 1000"),
        (&gen, "--tam-lambda", &["1", "nan", "inf", "1e30"], "from 0 to 1"),
        (&gen, "--tam-eps", &["2", "nan", "inf", "1e30"], "from 0 to 1"),
        (&gen, "--max-ratio", &["1", "nan", "inf"], "from 0 to 1"),
        (&gen, "--preload", &["1099511627776", "4611686018427387904"], "use 0 to 4096"),
        (&gen, "--main-gpu", &["1099511627776"], "use 0 to 255"),
        (&gen, "--gpu-layers", &["1099511627776"], "use 0 to 65536"),
        (&gen, "--temp", &["nan", "inf", "1e30"], "from -1000 to 1000"),
        (&gen, "--top-p", &["nan", "2"], "from 0 to 1"),
        (&gen, "--min-p", &["nan", "2"], "from 0 to 1"),
        (&gen, "--repeat-penalty", &["0", "nan", "inf"], "above 0"),
        (&gen, "--presence-penalty", &["nan", "inf"], "from -1000 to 1000"),
        (&gen, "--frequency-penalty", &["nan", "inf"], "from -1000 to 1000"),
        (&ppl, "-c", &["1099511627776"], "use 0 to 16777216"),
        (&ppl, "--score-last", &["x"], "invalid value"),
        (&bench, "-p", &["1099511627776", "4611686018427387904"], "use 0 to 16777216"),
        (&bench, "-n", &["1099511627776"], "use 0 to 16777216"),
        (&bench, "-d", &["1099511627776"], "use 0 to 16777216"),
        (&bench, "-r", &["0", "1099511627776"], "use 1 to 1000"),
        (&plan, "-c", &["4611686018427387904"], "use 0 to 16777216"),
        (&plan, "--ratio", &["nan", "1"], "from 0 to 1"),
        (&calib, "--skip", &["1099511627776"], "use 0 to 4294967296"),
        (&calib, "--tokens", &["0", "1099511627776"], "use 1 to 16777216"),
        (&calib, "--window", &["1099511627776"], "use 2 to 65536"),
        (&calib, "--step", &["0", "nan"], "above 0"),
        (&calib, "--target", &["0.5,nan"], "from 0 to 1"),
        (&sweep, "--ratios", &["0.5,1e30"], "from 0 to 1"),
        (&sweep, "--chunks", &["0"], "use 1 to 16777216"),
        (&eval, "--shots", &["65", "1099511627776"], "use 0 to 64"),
        // Found by bench/flag_probe.py on serve and train: --shutdown-grace 1e30 panicked in
        // Duration, --seq-blocks 2^62 overflowed, a NaN learning rate trained NaN weights.
        (&serve, "--shutdown-grace", &["1e30", "18446744073709551616", "nan", "inf"], "from 0 to 86400"),
        (&serve, "--max-queue", &["0", "1099511627776"], "use 1 to 65536"),
        (&serve, "--max-tokens-limit", &["0", "1099511627776"], "use 1 to 16777216"),
        (&serve, "--parallel", &["0", "1099511627776"], "use 1 to 256"),
        (&serve, "--timeout", &["0", "1099511627776"], "use 1 to 86400"),
        (&prefill, "--seq-blocks", &["0", "4611686018427387904"], "use 1 to 1024"),
        (&prefill, "--blocks", &["0", "1099511627776"], "use 1 to 65536"),
        (&prefill, "--lr", &["0", "nan", "inf", "1e30"], "above 0, up to 10"),
        (&prefill, "--compensator-lr", &["nan", "inf"], "above 0, up to 10"),
        (&prefill, "--ratio", &["1", "nan"], "from 0 to 1"),
        (&prefill, "-t", &["0", "1099511627776"], "use 1 to 1024"),
        (&distill, "--lr", &["nan", "inf", "1e30"], "above 0, up to 10"),
        (&distill, "--lora-alpha", &["0", "nan", "inf"], "above 0, up to 1000"),
        (&distill, "--checkpoint-every", &["1099511627776"], "0..=10000000"),
    ];
    let mut n = 0;
    for (base, flag, values, says) in cases {
        for v in *values {
            let mut args = base.to_vec();
            args.extend([*flag, *v]);
            let out = run_with_limit(&args, Duration::from_secs(30));
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{flag} {v}: {err}");
            assert!(err.contains(says), "{flag} {v}: expected '{says}' in: {err}");
            assert!(!err.contains("panicked"), "{flag} {v}: {err}");
            n += 1;
        }
    }
    eprintln!("{n} hostile flag values refused");
    // A request body limit past 1 GiB would reserve 12 x that of the budget.
    let out = run_with_limit(&["serve", "-m", m, "--port", "0", "--max-body", "2000G"], Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("use 1 byte to 1G"), "{}", text(&out.stderr));
    // A budget is at most 1 PiB ("1e30" used to wrap the budget arithmetic).
    for v in ["1e30", "2000000G", "1e300%"] {
        let out = run_with_limit(&["generate", "-m", m, "-p", "hi", "-n", "1", "--memory", v], Duration::from_secs(30));
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "--memory {v}: {err}");
        assert!(err.contains("budgets go up to 1 PiB"), "--memory {v}: {err}");
    }
}

/// `--budget-file` on a FIFO used to block the budget watcher forever: now a warning names it and
/// the run goes on with its budget.
#[test]
fn a_fifo_budget_file_does_not_hang() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("budget");
    let ok = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(ok.success());
    let m = model();
    let args = [
        "generate",
        "-m",
        m.to_str().unwrap(),
        "-p",
        "The capital of France is",
        "-n",
        "4",
        "--temp",
        "0",
        "--memory",
        "300M",
        "--pack-dir",
        dir.path().to_str().unwrap(),
        "--budget-file",
        fifo.to_str().unwrap(),
    ];
    let out = run_with_limit(&args, Duration::from_secs(300));
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("not a regular file"), "{err}");
    assert!(!text(&out.stdout).trim().is_empty());
}

/// `sift perplexity` reads its text from the file a piece at a time: a FIFO is refused at once
/// (it cannot be read twice, and used to block), text that is not UTF-8 is an error naming the
/// byte, a text shorter than two windows says how long it is.
#[test]
fn perplexity_texts_that_cannot_be_scored_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let m = model();
    let m = m.to_str().unwrap();
    let fifo = dir.path().join("text");
    assert!(Command::new("mkfifo").arg(&fifo).status().expect("mkfifo").success());
    let bad = dir.path().join("latin1.txt");
    let mut bytes = b"The tower is 324 metres tall. ".repeat(100);
    bytes[1234] = 0xe9;
    std::fs::write(&bad, &bytes).unwrap();
    let short = dir.path().join("short.txt");
    std::fs::write(&short, "A short text.").unwrap();
    for (file, says) in [
        (&fifo, "is not a regular file"),
        (&bad, "not UTF-8 (at byte 1234)"),
        (&short, "perplexity needs at least 2 * n_ctx = 256"),
    ] {
        let args = ["perplexity", "-m", m, "-f", file.to_str().unwrap(), "-c", "128", "-t", "1"];
        let out = run_with_limit(&args, Duration::from_secs(60));
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {err}", file.display());
        assert!(err.contains(says), "{}: expected '{says}' in: {err}", file.display());
    }
}

/// Writes SmolLM2 with every block scale of the first row of layer 3's `ffn_down` set to NaN.
fn damaged_model(dir: &Path) -> PathBuf {
    let mut bytes = std::fs::read(model()).unwrap();
    let g = sift_gguf::Gguf::parse(&bytes).unwrap();
    let t = g.tensor("blk.3.ffn_down.weight").unwrap().clone();
    let at = (g.data_offset + t.offset) as usize;
    for b in 0..(t.row_bytes() as usize / 20) {
        bytes[at + 20 * b..at + 20 * b + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
    }
    let p = dir.join("damaged.gguf");
    std::fs::write(&p, &bytes).unwrap();
    p
}

/// NaN logits used to read as the end of text (generate, exit 0) or print PPL = nan (exit 0).
#[test]
fn a_model_computing_nan_is_an_error_naming_the_layer() {
    let dir = tempfile::tempdir().unwrap();
    let bad = damaged_model(dir.path());
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/wiki.test.head16k.raw");
    let b = bad.to_str().unwrap();
    for args in [
        vec!["generate", "-m", b, "-p", "Hello", "-n", "4", "--temp", "0"],
        vec!["perplexity", "-m", b, "-f", fixture.to_str().unwrap(), "-c", "128", "--chunks", "1"],
    ] {
        let out = run_with_limit(&args, Duration::from_secs(120));
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {err}", args[0]);
        assert!(err.contains("non-finite") && err.contains("layer 3"), "{}: {err}", args[0]);
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// An explicit output that exists is replaced only with `--force` (a typo in `-o` used to
/// replace any file silently): refused before any work, the file untouched.
#[test]
fn existing_outputs_need_force() {
    let dir = tempfile::tempdir().unwrap();
    let m = model();
    let m = m.to_str().unwrap();
    let keep = dir.path().join("notes.txt");
    std::fs::write(&keep, b"precious").unwrap();
    let k = keep.to_str().unwrap();
    let input = dir.path().join("text.txt");
    std::fs::write(&input, b"Some text.").unwrap();
    let t = input.to_str().unwrap();
    for args in [
        vec!["pack", m, "-o", k],
        vec!["calibrate", m, "-f", t, "-o", k],
        vec!["trace", "-m", m, "-p", "hi", "-n", "2", "-o", k],
        vec!["probe", "--quick", "-o", k],
        vec!["train", "prefill", "-m", m, "-f", t, "-o", k],
    ] {
        let out = run_with_limit(&args, Duration::from_secs(60));
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {err}", args[0]);
        assert!(err.contains("exists: pass --force"), "{}: {err}", args[0]);
        assert_eq!(std::fs::read(&keep).unwrap(), b"precious", "{}", args[0]);
    }
    // With --force the trace replaces it.
    let out = run_with_limit(
        &["trace", "-m", m, "-p", "hi", "-n", "2", "-t", "2", "-o", k, "--force"],
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_ne!(std::fs::read(&keep).unwrap(), b"precious");
}

/// No command writes over one of its inputs, whatever `--force` says (an adversarial probe
/// replaced a model by a predictor, a training text by its calibration, a pack's source GGUF by
/// a trace): compared by file identity, a pack's source GGUF counting as an input, the
/// autopacked column file too; every input left as it was.
#[test]
fn outputs_never_replace_inputs_even_with_force() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m.gguf");
    std::fs::copy(model(), &m).unwrap();
    let words = dir.path().join("text.txt");
    std::fs::write(&words, "The quick brown fox jumps over the lazy dog. ".repeat(200)).unwrap();
    // A hard link: the same file under another name.
    let linked = dir.path().join("linked.txt");
    std::fs::hard_link(&words, &linked).unwrap();
    let pack = dir.path().join("p.sift");
    let (m_s, t_s, l_s, p_s) =
        (m.to_str().unwrap(), words.to_str().unwrap(), linked.to_str().unwrap(), pack.to_str().unwrap());
    let out = run_with_limit(&["pack", m_s, "-o", p_s], Duration::from_secs(120));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let auto = dir.path().join("m.sift");
    let auto_s = auto.to_str().unwrap();
    let sum = |p: &Path| std::fs::read(p).map(|b| crc(&b)).unwrap_or(0);
    let before: Vec<u32> = [&m, &words, &pack].iter().map(|p| sum(p)).collect();
    for args in [
        vec!["train", "prefill", "-m", m_s, "-f", t_s, "-o", m_s, "--force"],
        vec!["train", "prefill", "-m", m_s, "-f", t_s, "-o", l_s, "--force"],
        vec!["probe", "--quick", "-m", m_s, "-o", m_s, "--force"],
        vec!["calibrate", m_s, "-f", t_s, "-o", t_s, "--force"],
        vec!["calibrate", m_s, "-f", t_s, "-o", l_s, "--force"],
        vec!["trace", "-m", p_s, "-p", "hi", "-n", "2", "-o", m_s, "--force"],
        vec!["trace", "-m", p_s, "-p", "hi", "-n", "2", "-o", p_s, "--force"],
        vec!["trace", "-m", m_s, "--memory", "60%", "-p", "hi", "-n", "2", "-o", auto_s, "--force"],
        vec!["pack", m_s, "-o", m_s, "--force"],
        vec!["export-lora", "-m", m_s, "--lora", t_s, "-o", t_s, "--force"],
    ] {
        let out = run_with_limit(&args, Duration::from_secs(120));
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {err}", args.join(" "));
        assert!(err.contains("an input of this command"), "{}: {err}", args.join(" "));
    }
    let after: Vec<u32> = [&m, &words, &pack].iter().map(|p| sum(p)).collect();
    assert_eq!(before, after, "an input changed");
    // The autopack made for the trace is a pack still.
    assert_eq!(&std::fs::read(&auto).unwrap()[..8], b"SIFTPACK");
}

/// CRC-32 (IEEE), bitwise: enough to tell a changed file in a test.
fn crc(b: &[u8]) -> u32 {
    let mut c = !0u32;
    for &x in b {
        c ^= x as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 { (c >> 1) ^ 0xEDB8_8320 } else { c >> 1 };
        }
    }
    !c
}

/// Side files and flags found accepted or ignored silently by an adversarial probe: a predictor
/// that is a device or a FIFO (read until memory ran out, or forever), flags that would change
/// the result but were not applied, a non-pack file where `--memory` builds its pack, an
/// adapter with a value of -3.6e35 — each now refused naming the file or the flag.
#[test]
fn side_files_and_flags_that_are_not_applied_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    // A copy (a symbolic link would put the column file of --memory beside its target).
    let m = dir.path().join("m.gguf");
    std::fs::copy(model(), &m).unwrap();
    let m_s = m.to_str().unwrap();
    let fifo = dir.path().join("fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let link = dir.path().join("m.gguf.prefill");
    std::os::unix::fs::symlink(&fifo, &link).unwrap();
    let f = fifo.to_str().unwrap();
    let gen = |extra: &[&str]| {
        let mut a = vec!["generate", "-m", m_s, "-p", "Hello", "-n", "2", "-t", "2"];
        a.extend_from_slice(extra);
        run_with_limit(&a, Duration::from_secs(60))
    };
    for (extra, want) in [
        (vec!["--prefill-sparsity", "0.5", "--prefill-predictor", "/dev/zero"], "/dev/zero is not a regular file"),
        (vec!["--prefill-sparsity", "0.5", "--prefill-predictor", f], "fifo is not a regular file"),
        // MODEL.prefill beside the model, a symbolic link to a FIFO.
        (vec!["--prefill-sparsity", "0.5"], "is not a regular file"),
        (vec!["--prefill-predictor", "/dev/zero"], "--prefill-predictor sets how sparse prefill runs"),
        (vec!["--prefill-masks", "oracle"], "--prefill-masks sets how sparse prefill runs"),
        (vec!["--prefill-compensator", "on"], "add --prefill-sparsity"),
        (vec!["--prefill-down", "columns"], "add --prefill-sparsity"),
        (vec!["--prefill-sparsity", "0.5", "-b", "64"], "-b 64 holds less than a block"),
        (vec!["--pack-dir", "/tmp"], "--pack-dir says where"),
        (vec!["--gpu-attention", "on"], "--gpu-attention places"),
        (vec!["--gpu-group-size", "8"], "--gpu-group-size sizes"),
    ] {
        let out = gen(&extra);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {err}");
    }
    std::fs::remove_file(&link).unwrap();
    // The compensator asked for where there is none.
    let out = gen(&["--prefill-sparsity", "0.5", "--prefill-masks", "oracle", "--prefill-compensator", "on"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--prefill-compensator on") && err.contains("sift train prefill"), "{err}");
    // A file that is not a pack where --memory builds one: refused, left alone.
    let notes = dir.path().join("m.sift");
    std::fs::write(&notes, b"my notes").unwrap();
    let out = gen(&["--memory", "60%"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("m.sift is not a sift pack") && err.contains("--pack-dir"), "{err}");
    assert_eq!(std::fs::read(&notes).unwrap(), b"my notes");
    // An adapter whose one value is -3.6e35: refused at load, naming the file and the tensor.
    let model = sift_model::Model::load(model()).unwrap();
    let mut lora = sift_engine::lora::LoraAdapters::empty(model.config.n_layer, 8.0);
    let w = &model.layers[3].w_down;
    let mut a_t = vec![0.01f32; w.cols * 2];
    a_t[7] = -3.6e35;
    lora.set(
        3,
        sift_model::layout::OpKind::Down,
        sift_engine::lora::OpAdapter { n_in: w.cols, n_out: w.rows, rank: 2, a_t, b_t: vec![0.01; 2 * w.rows] },
    );
    let bad = dir.path().join("bad.lora.gguf");
    std::fs::write(&bad, lora.to_gguf("llama")).unwrap();
    let out = gen(&["--lora", bad.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("bad.lora.gguf") && err.contains("blk.3.ffn_down.weight.lora_a") && err.contains("-3.6e35"),
        "{err}"
    );
}

/// A prompt longer than the context: a file whose size alone shows it (refused before it is
/// read: no echo, no tokenizing) and a text with more tokens than `-c` (the tokenizer stops at
/// the context size). Both exit 1 with what to do; a prompt that fits still runs.
#[test]
fn prompts_longer_than_the_context_are_refused_up_front() {
    let m = model();
    let m = m.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let wiki = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/wiki.test.head16k.raw"),
    )
    .unwrap();
    // 4 MB of real text for a context of 64: far more tokens than fit, by size alone.
    let big = dir.path().join("big.txt");
    std::fs::write(&big, wiki.repeat(4_000_000 / wiki.len() + 1)).unwrap();
    let out = run_with_limit(
        &["generate", "-m", m, "-c", "64", "-f", big.to_str().unwrap(), "-n", "1", "-t", "1"],
        Duration::from_secs(60),
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("holds at least") && err.contains("context size 64") && err.contains("raise -c"), "{err}");
    assert!(out.stdout.is_empty(), "nothing echoed: {} bytes", out.stdout.len());
    // 2 KB: within the size bound, but some 500 tokens for a context of 64.
    let mid = dir.path().join("mid.txt");
    std::fs::write(&mid, &wiki[..2000]).unwrap();
    let out = run_with_limit(
        &["generate", "-m", m, "-c", "64", "-f", mid.to_str().unwrap(), "-n", "1", "-t", "1"],
        Duration::from_secs(60),
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("more than 64 tokens") && err.contains("raise -c"), "{err}");
    assert!(out.stdout.is_empty());
    // 100 bytes fit.
    let small = dir.path().join("small.txt");
    std::fs::write(&small, &wiki[..100]).unwrap();
    let out = run_with_limit(
        &["generate", "-m", m, "-c", "64", "-f", small.to_str().unwrap(), "-n", "1", "-t", "1"],
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// Writes SmolLM2 with its chat template replaced by `template` (padded with a Jinja comment to
/// the original's length, so every offset in the file stays where it was).
fn model_with_template(dir: &Path, name: &str, template: &str) -> PathBuf {
    let mut bytes = std::fs::read(model()).unwrap();
    let g = sift_gguf::Gguf::parse(&bytes).unwrap();
    let old = g.get("tokenizer.chat_template").unwrap().as_str().unwrap().as_bytes().to_vec();
    let at = bytes.windows(old.len()).position(|w| w == old.as_slice()).unwrap();
    let pad = old.len() - template.len() - "{##}".len();
    let new = format!("{template}{{#{}#}}", " ".repeat(pad));
    assert_eq!(new.len(), old.len());
    bytes[at..at + old.len()].copy_from_slice(new.as_bytes());
    let p = dir.join(name);
    std::fs::write(&p, &bytes).unwrap();
    p
}

/// A chat template is a program in the model file. One that loops runs out of fuel; one that
/// doubles a string forty times (a terabyte in forty instructions, below any fuel) used to take
/// the machine's memory: the process now stops at 8 x the messages + 64 MiB with exit 1 and the
/// reason, in `generate` and when `serve` tries the template at start.
#[test]
fn chat_templates_that_loop_or_grow_are_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let grow = model_with_template(
        dir.path(),
        "grow.gguf",
        "{% set ns = namespace(s='x' * 1000000) %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
    );
    let spin = model_with_template(
        dir.path(),
        "spin.gguf",
        "{% for a in range(100000) %}{% for b in range(100000) %}{{ '' }}{% endfor %}{% endfor %}",
    );
    let gen = |m: &Path| {
        run_with_limit(
            &["generate", "-m", m.to_str().unwrap(), "-p", "Hello", "--chat-template", "-n", "1", "-t", "1"],
            Duration::from_secs(120),
        )
    };
    let out = gen(&grow);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("chat template took more memory") && err.contains("limit 64 MiB"), "{err}");
    let out = gen(&spin);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("fuel"), "{err}");
    // The server tries the template once at start: the growing one ends it there.
    let out =
        run_with_limit(&["serve", "-m", grow.to_str().unwrap(), "--port", "0", "-t", "1"], Duration::from_secs(120));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("chat template took more memory"), "{err}");
}
