//! `sift train` end to end: the expert predictor sparse prefill finds beside the model, and the
//! distilled adapters `--lora` loads.

use super::*;

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
    // The adapters were trained quantization-aware (the default): continuing them as plain ones
    // is refused, naming the flag that continues them.
    let o = sift(&[&train[..], &more[..], &["--steps", "1", "--resume", "--no-qat"]].concat());
    assert!(!o.status.success() && text(&o.stderr).contains("with --qat"), "{}", text(&o.stderr));
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
    // Beside the weights such adapters do not compute what was trained: said once, at load.
    assert!(text(&o.stderr).contains("trained quantization-aware"), "{}", text(&o.stderr));
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
