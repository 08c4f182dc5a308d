//! Loading evaluation sets: llama.cpp's HellaSwag text format and the JSON-lines multiple-choice
//! format (ARC, WinoGrande, OpenBookQA, MMLU), and working out which task a file holds.
//!
//! Files are untrusted: nothing here panics on bad input. Every structural problem is an error that
//! names the file and the 1-based line (`path:line: what is wrong`).
//!
//! - HellaSwag text (`hellaswag_val_full.txt`, made by klosax's extractor and read by
//!   `llama-perplexity --hellaswag`): 6 lines per task: context, gold index `0`-`3`, four endings.
//!   The line count must be a multiple of 6 (a trailing newline is fine), no line may be empty.
//! - JSON lines: one object per non-blank line with `centerpiece` (the question or sentence),
//!   `options` (at least 2 non-empty strings) and `correct_options_idx` (a non-empty list of
//!   indices into `options`; an answer counts as correct when it is any of them, as lm-eval does
//!   with a list of golds). Other fields are ignored.
//!
//! The format is picked by `--format`, else by extension (`.txt` → HellaSwag, `.json`/`.jsonl` →
//! JSON lines), else by content (a first non-blank character `{` → JSON lines). The task (which
//! decides the prompt, see [`crate::prompt`]) is `--task`, else the `task_name:` of a
//! `config.yaml` next to the file (the layout of /work/shared/data/mc), else a known name in the
//! path (`arc`, `openbookqa`, `winogrande`, `mmlu`, `hellaswag`), else a generic
//! "Question: .. Answer:" prompt.

use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The on-disk layout of an evaluation file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// llama.cpp's 6-lines-per-task HellaSwag text.
    HellaSwag,
    /// One JSON object per line: `centerpiece`, `options`, `correct_options_idx`.
    Mc,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Format, String> {
        match s.to_ascii_lowercase().as_str() {
            "hellaswag" => Ok(Format::HellaSwag),
            "mc" | "json" | "jsonl" => Ok(Format::Mc),
            _ => Err(format!("unknown format '{s}': expected 'hellaswag' or 'mc'")),
        }
    }
}

/// Which benchmark a file holds; decides how prompts are built ([`crate::prompt`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskKind {
    /// Context, then `" " + ending` (llama.cpp's and lm-eval's HellaSwag).
    HellaSwag,
    /// `"Question: {q}\nAnswer:"`, then `" " + option` (lm-eval `arc_easy` / `arc_challenge`).
    Arc,
    /// The question stem as is, then `" " + option` (lm-eval `openbookqa`).
    OpenBookQa,
    /// lm-eval's partial scoring: the sentence up to `_` with the option, then the rest.
    WinoGrande,
    /// lm-eval's zero-shot MMLU: a description naming the subject, the question, lettered
    /// options, `"Answer:"`, then `" A"`, `" B"`, ...
    Mmlu { subject: String },
    /// Anything else in the JSON-lines format: scored like ARC.
    Generic,
}

impl TaskKind {
    /// Parses a `--task` value or a `config.yaml` `task_name`: `hellaswag`, `arc`, `arc-easy`,
    /// `arc-challenge`, `openbookqa`, `winogrande`, `mmlu`, `mmlu-SUBJECT` (subject words joined by
    /// `-` or `_`), `generic`. `mmlu` alone takes the subject from `path` when it can.
    pub fn parse(name: &str, path: Option<&Path>) -> Option<TaskKind> {
        let n = name.trim().trim_matches(|c| c == '"' || c == '\'').to_ascii_lowercase();
        let n = n.as_str();
        if n == "hellaswag" {
            Some(TaskKind::HellaSwag)
        } else if n == "arc" || n.starts_with("arc-") || n.starts_with("arc_") {
            Some(TaskKind::Arc)
        } else if n == "openbookqa" || n == "obqa" {
            Some(TaskKind::OpenBookQa)
        } else if n == "winogrande" {
            Some(TaskKind::WinoGrande)
        } else if n == "generic" {
            Some(TaskKind::Generic)
        } else if let Some(s) = n.strip_prefix("mmlu-").or_else(|| n.strip_prefix("mmlu_")) {
            Some(TaskKind::Mmlu { subject: subject_words(s) })
        } else if n == "mmlu" {
            Some(TaskKind::Mmlu { subject: path.and_then(mmlu_subject_from_path).unwrap_or_default() })
        } else {
            None
        }
    }

    /// A short name for reports.
    pub fn name(&self) -> String {
        match self {
            TaskKind::HellaSwag => "hellaswag".into(),
            TaskKind::Arc => "arc".into(),
            TaskKind::OpenBookQa => "openbookqa".into(),
            TaskKind::WinoGrande => "winogrande".into(),
            TaskKind::Mmlu { subject } if subject.is_empty() => "mmlu".into(),
            TaskKind::Mmlu { subject } => format!("mmlu-{}", subject.replace(' ', "-")),
            TaskKind::Generic => "generic".into(),
        }
    }
}

fn subject_words(s: &str) -> String {
    s.split(['-', '_', ' ']).filter(|w| !w.is_empty()).collect::<Vec<_>>().join(" ")
}

/// `.../mmlu/SUBJECT/test.json` → "SUBJECT" (words), or `mmlu-SUBJECT.jsonl` → the same.
fn mmlu_subject_from_path(path: &Path) -> Option<String> {
    let comps: Vec<String> = path.components().map(|c| c.as_os_str().to_string_lossy().to_ascii_lowercase()).collect();
    if let Some(i) = comps.iter().position(|c| c == "mmlu") {
        if i + 2 < comps.len() {
            return Some(subject_words(&comps[i + 1]));
        }
    }
    let stem = path.file_stem()?.to_string_lossy().to_ascii_lowercase();
    stem.strip_prefix("mmlu-").or_else(|| stem.strip_prefix("mmlu_")).map(subject_words)
}

/// One multiple-choice item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    /// The context (HellaSwag), question (ARC, OpenBookQA, MMLU) or sentence with `_` (WinoGrande).
    pub question: String,
    /// The candidate answers (endings, options).
    pub options: Vec<String>,
    /// Indices of the correct options (one for every set shipped here).
    pub gold: Vec<usize>,
    /// 1-based line where the item starts, for error messages.
    pub line: usize,
}

/// A loaded evaluation file.
#[derive(Clone, Debug)]
pub struct Dataset {
    pub path: PathBuf,
    pub format: Format,
    pub task: TaskKind,
    /// The task's name for reports: `config.yaml`'s `task_name` (e.g. `arc-easy`) when it names
    /// this task, else [`TaskKind::name`].
    pub name: String,
    pub items: Vec<Item>,
}

/// Why a file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read '{}': {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}:{line}: {msg}", path.display())]
    Malformed { path: PathBuf, line: usize, msg: String },
    #[error("'{}': {msg}", path.display())]
    Invalid { path: PathBuf, msg: String },
}

fn malformed(path: &Path, line: usize, msg: impl Into<String>) -> LoadError {
    LoadError::Malformed { path: path.to_path_buf(), line, msg: msg.into() }
}

/// Loads `path`, detecting the format and task unless given (see the module docs).
pub fn load(path: &Path, format: Option<Format>, task: Option<TaskKind>) -> Result<Dataset, LoadError> {
    let bytes = std::fs::read(path).map_err(|source| LoadError::Io { path: path.to_path_buf(), source })?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let off = e.utf8_error().valid_up_to();
        let line = 1 + e.as_bytes()[..off].iter().filter(|&&b| b == b'\n').count();
        malformed(path, line, "the file is not valid UTF-8")
    })?;
    let format = format.unwrap_or_else(|| detect_format(path, &text));
    let task = match task {
        Some(t) => t,
        None => detect_task(path, format),
    };
    if format == Format::HellaSwag && task != TaskKind::HellaSwag {
        return Err(LoadError::Invalid {
            path: path.to_path_buf(),
            msg: format!("the HellaSwag text format only holds HellaSwag tasks, not '{}'", task.name()),
        });
    }
    let items = match format {
        Format::HellaSwag => parse_hellaswag(path, &text)?,
        Format::Mc => parse_mc(path, &text)?,
    };
    if items.is_empty() {
        return Err(LoadError::Invalid { path: path.to_path_buf(), msg: "the file holds no items".into() });
    }
    if let TaskKind::Mmlu { .. } = task {
        if let Some(it) = items.iter().find(|it| it.options.len() > 26) {
            return Err(malformed(
                path,
                it.line,
                format!("{} options; MMLU letters go up to Z (26)", it.options.len()),
            ));
        }
    }
    if task == TaskKind::WinoGrande {
        if let Some(it) = items.iter().find(|it| !it.question.contains('_')) {
            return Err(malformed(path, it.line, "a WinoGrande sentence needs a '_' to fill in"));
        }
    }
    let name = config_task_name(path).filter(|n| TaskKind::parse(n, Some(path)).as_ref() == Some(&task));
    let name = name.unwrap_or_else(|| task.name());
    Ok(Dataset { path: path.to_path_buf(), format, task, name, items })
}

/// The few-shot examples for `ds`: the first `n` items (lm-eval's `first_n` sampler) of `file`, by
/// default `dev.json` beside the evaluated file (MMLU's layout: `SUBJECT/dev.json` next to
/// `SUBJECT/test.json`), read as the same task. The evaluated file itself is refused (its items
/// would be their own examples).
pub fn load_shots(ds: &Dataset, n: usize, file: Option<&Path>) -> Result<Vec<Item>, LoadError> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let path = match file {
        Some(f) => f.to_path_buf(),
        None => ds.path.parent().unwrap_or(Path::new(".")).join("dev.json"),
    };
    if !path.exists() {
        return Err(LoadError::Invalid {
            path,
            msg: format!(
                "--shots {n} takes its examples from this file, which does not exist: name one with --shots-file"
            ),
        });
    }
    let same = |a: &Path, b: &Path| matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y);
    if same(&path, &ds.path) {
        return Err(LoadError::Invalid {
            path,
            msg: "the few-shot examples would come from the evaluated file itself: use the task's dev or train split"
                .into(),
        });
    }
    let shots = load(&path, Some(ds.format), Some(ds.task.clone()))?;
    if shots.items.len() < n {
        return Err(LoadError::Invalid {
            path,
            msg: format!("--shots {n} needs {n} examples, the file holds {}", shots.items.len()),
        });
    }
    let mut items = shots.items;
    items.truncate(n);
    Ok(items)
}

/// The format of a file by extension, else by its first non-blank character.
pub fn detect_format(path: &Path, text: &str) -> Format {
    match path.extension().map(|e| e.to_string_lossy().to_ascii_lowercase()).as_deref() {
        Some("txt") => Format::HellaSwag,
        Some("json") | Some("jsonl") => Format::Mc,
        _ if text.trim_start().starts_with('{') => Format::Mc,
        _ => Format::HellaSwag,
    }
}

/// The task of a file: HellaSwag for its text format; for JSON lines the `task_name` of a
/// `config.yaml` beside the file, else a known name in the path, else [`TaskKind::Generic`].
pub fn detect_task(path: &Path, format: Format) -> TaskKind {
    if format == Format::HellaSwag {
        return TaskKind::HellaSwag;
    }
    if let Some(name) = config_task_name(path) {
        if let Some(t) = TaskKind::parse(&name, Some(path)) {
            return t;
        }
    }
    let lower = path.to_string_lossy().to_ascii_lowercase();
    let comps: Vec<&str> = lower.split(['/', '\\']).collect();
    for c in comps.iter().rev() {
        let stem = c.split('.').next().unwrap_or(c);
        if let Some(t) = TaskKind::parse(stem, Some(path)) {
            return t;
        }
    }
    for key in ["winogrande", "openbookqa", "hellaswag", "mmlu"] {
        if comps.iter().any(|c| c.contains(key)) {
            if let Some(t) = TaskKind::parse(key, Some(path)) {
                return t;
            }
        }
    }
    TaskKind::Generic
}

/// The `task_name` of the `config.yaml` next to `path`, if any.
fn config_task_name(path: &Path) -> Option<String> {
    let cfg = path.parent()?.join("config.yaml");
    yaml_task_name(&std::fs::read_to_string(cfg).ok()?)
}

/// The top-level `task_name:` value of a YAML file, read line by line (no YAML parser needed).
fn yaml_task_name(s: &str) -> Option<String> {
    s.lines().find_map(|l| l.strip_prefix("task_name:")).map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

/// Parses llama.cpp's HellaSwag text: 6 lines per task (context, gold 0-3, four endings).
pub fn parse_hellaswag(path: &Path, text: &str) -> Result<Vec<Item>, LoadError> {
    let mut lines: Vec<&str> = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)).collect();
    if lines.last() == Some(&"") {
        lines.pop();
    }
    if !lines.len().is_multiple_of(6) {
        let start = lines.len() / 6 * 6 + 1;
        return Err(malformed(
            path,
            start,
            format!(
                "the file has {} lines, not a multiple of 6 (context, gold index, 4 endings per task): the task starting here has only {} of its 6 lines",
                lines.len(),
                lines.len() % 6
            ),
        ));
    }
    let mut items = Vec::with_capacity(lines.len() / 6);
    for (t, task) in lines.chunks_exact(6).enumerate() {
        let l0 = t * 6 + 1;
        for (k, l) in task.iter().enumerate() {
            if l.trim().is_empty() {
                let what = match k {
                    0 => "the context",
                    1 => "the gold index",
                    _ => "an ending",
                };
                return Err(malformed(path, l0 + k, format!("{what} line is empty")));
            }
        }
        let gold = task[1].trim();
        let gold = match gold.parse::<usize>() {
            Ok(g) if g < 4 => g,
            _ => {
                let shown: String = gold.chars().take(40).collect();
                return Err(malformed(path, l0 + 1, format!("gold index '{shown}' is not 0, 1, 2 or 3")));
            }
        };
        items.push(Item {
            question: task[0].to_string(),
            options: task[2..6].iter().map(|s| s.to_string()).collect(),
            gold: vec![gold],
            line: l0,
        });
    }
    Ok(items)
}

#[derive(Deserialize)]
struct McLine {
    centerpiece: String,
    options: Vec<String>,
    correct_options_idx: Vec<i64>,
}

/// Parses the JSON-lines multiple-choice format (blank lines are skipped).
pub fn parse_mc(path: &Path, text: &str) -> Result<Vec<Item>, LoadError> {
    let mut items = Vec::new();
    for (i, line) in text.split('\n').enumerate() {
        let n = i + 1;
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.trim().is_empty() {
            continue;
        }
        let m: McLine = serde_json::from_str(line).map_err(|e| malformed(path, n, format!("invalid JSON: {e}")))?;
        if m.centerpiece.trim().is_empty() {
            return Err(malformed(path, n, "'centerpiece' is empty"));
        }
        if m.options.len() < 2 {
            return Err(malformed(
                path,
                n,
                format!("{} option(s); a multiple-choice item needs at least 2", m.options.len()),
            ));
        }
        if let Some(k) = m.options.iter().position(|o| o.trim().is_empty()) {
            return Err(malformed(path, n, format!("option {k} is empty")));
        }
        if m.correct_options_idx.is_empty() {
            return Err(malformed(path, n, "'correct_options_idx' is empty"));
        }
        let mut gold = Vec::with_capacity(m.correct_options_idx.len());
        for &g in &m.correct_options_idx {
            match usize::try_from(g) {
                Ok(g) if g < m.options.len() => gold.push(g),
                _ => {
                    return Err(malformed(
                        path,
                        n,
                        format!("correct option index {g} is out of range for {} options", m.options.len()),
                    ))
                }
            }
        }
        items.push(Item { question: m.centerpiece, options: m.options, gold, line: n });
    }
    Ok(items)
}
