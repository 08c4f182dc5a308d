//! `sift eval`'s run: a slice of a multiple-choice set ([`crate::data`]) with its few-shot
//! examples, scored on an engine ([`crate::score`]) with progress on stderr, and reported as
//! text or JSON.

use crate::{evaluate, load, load_shots, Dataset, EngineScorer, EvalOptions, Format, Item, TaskKind};
use anyhow::Context;
use sift_engine::Engine;
use sift_model::tokenizer::Tokenizer;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Items between two progress lines.
const PROGRESS_EVERY: usize = 50;

/// What to score: a file, its format and prompt style (`None`: detected), which items, and how
/// many few-shot examples from which file.
#[derive(Clone, Debug)]
pub struct EvalRequest {
    pub file: PathBuf,
    pub format: Option<String>,
    pub task: Option<String>,
    pub offset: usize,
    pub limit: Option<usize>,
    pub shots: usize,
    pub shots_file: Option<PathBuf>,
}

/// An [`EvalRequest`] loaded: the data set, the items' range and the few-shot examples.
pub struct EvalRun {
    pub request: EvalRequest,
    pub dataset: Dataset,
    pub end: usize,
    pub shots: Vec<Item>,
}

impl EvalRequest {
    /// Reads the set and checks the range (before any model is loaded).
    pub fn load(self) -> anyhow::Result<EvalRun> {
        let a = &self;
        let format = a.format.as_deref().map(str::parse::<Format>).transpose().map_err(anyhow::Error::msg)?;
        let task = match a.task.as_deref() {
            Some(t) => Some(TaskKind::parse(t, Some(&a.file)).with_context(|| {
                format!(
                    "unknown --task '{t}': expected hellaswag, arc, openbookqa, winogrande, mmlu[-SUBJECT] or generic"
                )
            })?),
            None => None,
        };
        let ds = load(&a.file, format, task)?;
        let total = ds.items.len();
        anyhow::ensure!(a.offset < total, "--offset {} skips all {total} items of '{}'", a.offset, a.file.display());
        let end = a.limit.map_or(total, |l| a.offset.saturating_add(l).min(total));
        anyhow::ensure!(a.offset < end, "--limit 0 leaves nothing to score");
        let shots = load_shots(&ds, a.shots, a.shots_file.as_deref())?;
        Ok(EvalRun { request: self, dataset: ds, end, shots })
    }
}

impl EvalRun {
    /// Scores the items on `engine` and writes the result to `out` (JSON naming `model` when
    /// `json`). `reuse_prefix`: contexts may share a cached prefix (not for selectors with
    /// sequence state, which must see each item from an empty context).
    pub fn score(
        &self,
        engine: &mut Engine,
        tok: &Tokenizer,
        reuse_prefix: bool,
        model: &Path,
        json: bool,
        out: &mut dyn Write,
    ) -> anyhow::Result<()> {
        let (a, ds) = (&self.request, &self.dataset);
        let items = &ds.items[a.offset..self.end];
        eprintln!("sparsity: {}", engine.selector().describe());
        eprintln!(
            "eval: task {}{}, {:?} format, items {}..{} of {} from '{}', n_ctx {}, {} threads",
            ds.name,
            if a.shots > 0 { format!(", {}-shot", a.shots) } else { String::new() },
            ds.format,
            a.offset,
            self.end,
            ds.items.len(),
            a.file.display(),
            engine.n_ctx(),
            engine.n_threads()
        );
        let t0 = std::time::Instant::now();
        let mut scorer = EngineScorer::new(engine);
        scorer.reuse_prefix = reuse_prefix;
        let opts = EvalOptions { max_tokens: scorer.max_tokens(), shots: self.shots.clone() };
        let rep = evaluate(&ds.task, items, tok, &mut scorer, &opts, |p| {
            if p.done.is_multiple_of(PROGRESS_EVERY) || p.done == p.total {
                let s = t0.elapsed().as_secs_f64();
                eprintln!(
                    "[{}/{}] acc = {:.4}, acc_norm = {:.4} ({:.1} s, {:.2} items/s)",
                    p.done,
                    p.total,
                    p.acc,
                    p.acc_norm,
                    s,
                    p.done as f64 / s.max(1e-9)
                );
            }
        })
        .with_context(|| format!("cannot score '{}'", a.file.display()))?;
        let secs = t0.elapsed().as_secs_f64();
        let st = scorer.stats;
        eprintln!(
            "eval: {} requests, {} context tokens run + {} reused, {} continuation tokens run, {} scored; {} contexts cut to fit, {} unclean token boundaries; {secs:.2} s",
            rep.n_requests,
            st.ctx_tokens,
            st.reused_tokens,
            st.cont_tokens,
            rep.n_cont_tokens,
            rep.n_truncated,
            rep.n_unclean
        );
        if json {
            let mut j = serde_json::json!({
                "task": ds.name,
                "file": a.file.display().to_string(),
                "model": model.display().to_string(),
                "n": rep.n,
                "offset": a.offset,
                "shots": a.shots,
                "acc": rep.acc.value,
                "acc_stderr": rep.acc.stderr,
                "acc_norm": rep.acc_norm.value,
                "acc_norm_stderr": rep.acc_norm.stderr,
                "n_truncated": rep.n_truncated,
                "seconds": secs,
            });
            if let Some(l) = rep.acc_llama_cpp {
                j["acc_llama_cpp"] = l.value.into();
                j["acc_llama_cpp_stderr"] = l.stderr.into();
            }
            writeln!(out, "{}", serde_json::to_string_pretty(&j)?)?;
        } else {
            writeln!(
                out,
                "acc = {:.4} +/- {:.4}, acc_norm = {:.4} +/- {:.4} (N = {})",
                rep.acc.value, rep.acc.stderr, rep.acc_norm.value, rep.acc_norm.stderr, rep.n
            )?;
            if let Some(l) = rep.acc_llama_cpp {
                writeln!(
                    out,
                    "llama.cpp HellaSwag score (mean log-prob per ending token after the common prefix) = {:.4} +/- {:.4}",
                    l.value, l.stderr
                )?;
            }
        }
        Ok(())
    }
}
