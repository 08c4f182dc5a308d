//! Prompt construction: each item becomes one (context, continuation) request per option, as
//! lm-eval (v0.4 task YAMLs) and `llama-perplexity --hellaswag` build them.
//!
//! | task | context | continuation | length for acc_norm |
//! |---|---|---|---|
//! | HellaSwag | the file's context line | `" " + ending` | ending |
//! | ARC, generic | `"Question: {q}\nAnswer:"` | `" " + option` | option |
//! | OpenBookQA | the question stem as is | `" " + option` | option |
//! | WinoGrande | sentence before `_`, then the option | `" " + (sentence after _).trim()` | continuation |
//! | MMLU | description, question, `"\nA. .."` lines, `"\nAnswer:"` | `" A"`, `" B"`, ... | letter |
//!
//! Few-shot prompts ([`requests_with_shots`], `sift eval --shots N`) are lm-eval's: each example
//! is its zero-shot context followed by its gold continuation, the examples and the question
//! joined by `"\n\n"` (lm-eval's `fewshot_delimiter`); MMLU's description comes once, first (its
//! 5-shot prompt is the description, five dev questions each ending `"Answer: B"`, then the
//! question).
//!
//! Decisions and where they differ from the brief or from lm-eval:
//! - OpenBookQA: lm-eval's `openbookqa.yaml` has `doc_to_text: question_stem`, i.e. no
//!   "Question:/Answer:" wrapper (the stems are sentence beginnings such as "There is most likely
//!   going to be fog around:"). We follow lm-eval, not the ARC wrapper.
//! - MMLU: lm-eval prepends the subject's description, "The following are multiple choice questions
//!   (with answers) about {subject}.\n\n", to the zero-shot prompt; we do too when the subject is
//!   known (from `config.yaml` or the path), with the subject's words as in lm-eval's YAMLs
//!   ("high school biology"). The question is `strip()`ped as in lm-eval's template.
//! - WinoGrande: lm-eval's `partial_context` / `partial_target`: one context per option, the same
//!   continuation for both. lm-eval reports only `acc` here; our `acc_norm` divides by the shared
//!   continuation's length, so it always equals `acc`.
//! - HellaSwag: the klosax text file is already preprocessed like lm-eval (brackets removed,
//!   `activity_label: ctx`), except that lm-eval capitalizes `ctx_b` and the file does not
//!   ("... on a roof. he"); we use the file's text as is, like llama.cpp.
//! - acc_norm length: lm-eval divides by `len(choice)`, the choice string without the leading
//!   space, counted in characters (Python `len`); that equals the byte length for ASCII text,
//!   which is nearly all of these sets. We count characters, as lm-eval's code does.

use crate::data::{Item, TaskKind};

/// One option of one item, as text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub context: String,
    pub continuation: String,
    /// What acc_norm divides the log-likelihood by (lm-eval's `len(choice)`), at least 1.
    pub norm_len: usize,
}

/// The requests of `item` under `task`, one per option, in option order.
///
/// Errors (with a message, no panic) only when a WinoGrande sentence has no `_`; the loader
/// already rejects those.
pub fn requests(task: &TaskKind, item: &Item) -> Result<Vec<Request>, String> {
    requests_with_shots(task, &[], item)
}

/// [`requests`] after the few-shot examples `shots` (see the module docs); errors as there, also
/// for an example without a gold option.
pub fn requests_with_shots(task: &TaskKind, shots: &[Item], item: &Item) -> Result<Vec<Request>, String> {
    let mut prefix = String::new();
    if let TaskKind::Mmlu { subject } = task {
        if !subject.is_empty() {
            prefix
                .push_str(&format!("The following are multiple choice questions (with answers) about {subject}.\n\n"));
        }
    }
    for shot in shots {
        let gold = *shot.gold.first().ok_or("a few-shot example has no correct option")?;
        let reqs = body(task, shot)?;
        let r = reqs.get(gold).ok_or("a few-shot example's correct option is out of range")?;
        prefix.push_str(&r.context);
        prefix.push_str(&r.continuation);
        prefix.push_str("\n\n");
    }
    let mut reqs = body(task, item)?;
    if !prefix.is_empty() {
        for r in &mut reqs {
            r.context.insert_str(0, &prefix);
        }
    }
    Ok(reqs)
}

/// The zero-shot requests without MMLU's description.
fn body(task: &TaskKind, item: &Item) -> Result<Vec<Request>, String> {
    let chars = |s: &str| s.chars().count().max(1);
    let simple = |context: String| {
        item.options
            .iter()
            .map(|o| Request { context: context.clone(), continuation: format!(" {o}"), norm_len: chars(o) })
            .collect()
    };
    Ok(match task {
        TaskKind::HellaSwag | TaskKind::OpenBookQa => simple(item.question.clone()),
        TaskKind::Arc | TaskKind::Generic => simple(format!("Question: {}\nAnswer:", item.question)),
        TaskKind::WinoGrande => {
            let at = item.question.find('_').ok_or("the sentence has no '_' to fill in")?;
            let (before, after) = (&item.question[..at], &item.question[at + 1..]);
            let continuation = format!(" {}", after.trim());
            item.options
                .iter()
                .map(|o| Request {
                    context: format!("{before}{o}"),
                    continuation: continuation.clone(),
                    norm_len: chars(after.trim()),
                })
                .collect()
        }
        TaskKind::Mmlu { .. } => {
            let mut ctx = String::new();
            ctx.push_str(item.question.trim());
            for (k, o) in item.options.iter().enumerate() {
                ctx.push_str(&format!("\n{}. {o}", letter(k)));
            }
            ctx.push_str("\nAnswer:");
            (0..item.options.len())
                .map(|k| Request { context: ctx.clone(), continuation: format!(" {}", letter(k)), norm_len: 1 })
                .collect()
        }
    })
}

/// `A`, `B`, ... for option `k` (the loader caps MMLU at 26 options).
fn letter(k: usize) -> char {
    (b'A' + (k.min(25) as u8)) as char
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(q: &str, opts: &[&str]) -> Item {
        Item { question: q.into(), options: opts.iter().map(|s| s.to_string()).collect(), gold: vec![0], line: 1 }
    }

    #[test]
    fn arc_prompt() {
        let r = requests(&TaskKind::Arc, &item("Why?", &["sun", "moon"])).unwrap();
        assert_eq!(
            r[1],
            Request { context: "Question: Why?\nAnswer:".into(), continuation: " moon".into(), norm_len: 4 }
        );
    }

    #[test]
    fn winogrande_partial() {
        let r =
            requests(&TaskKind::WinoGrande, &item("Sarah beat Maria so _ got a prize.", &["Sarah", "Maria"])).unwrap();
        assert_eq!(r[0].context, "Sarah beat Maria so Sarah");
        assert_eq!(r[1].context, "Sarah beat Maria so Maria");
        assert_eq!(r[0].continuation, " got a prize.");
        assert_eq!(r[0].continuation, r[1].continuation);
    }

    #[test]
    fn mmlu_prompt() {
        let t = TaskKind::Mmlu { subject: "high school biology".into() };
        let r = requests(&t, &item(" Q? ", &["a", "b", "c", "d"])).unwrap();
        assert_eq!(
            r[0].context,
            "The following are multiple choice questions (with answers) about high school biology.\n\nQ?\nA. a\nB. b\nC. c\nD. d\nAnswer:"
        );
        assert_eq!(r.iter().map(|r| r.continuation.as_str()).collect::<Vec<_>>(), [" A", " B", " C", " D"]);
    }

    #[test]
    fn mmlu_few_shot_prompt() {
        let t = TaskKind::Mmlu { subject: "anatomy".into() };
        let mut s1 = item("S1?", &["x", "y"]);
        s1.gold = vec![1];
        let s2 = item("S2?", &["u", "v"]);
        let r = requests_with_shots(&t, &[s1, s2], &item("Q?", &["a", "b"])).unwrap();
        assert_eq!(
            r[1].context,
            "The following are multiple choice questions (with answers) about anatomy.\n\nS1?\nA. x\nB. y\nAnswer: B\n\nS2?\nA. u\nB. v\nAnswer: A\n\nQ?\nA. a\nB. b\nAnswer:"
        );
        assert_eq!(r[1].continuation, " B");
        let mut bad = item("S?", &["x"]);
        bad.gold = vec![];
        assert!(requests_with_shots(&t, &[bad], &item("Q?", &["a"])).is_err());
    }

    #[test]
    fn arc_few_shot_prompt() {
        let r = requests_with_shots(&TaskKind::Arc, &[item("Why?", &["sun", "moon"])], &item("How?", &["a"])).unwrap();
        assert_eq!(r[0].context, "Question: Why?\nAnswer: sun\n\nQuestion: How?\nAnswer:");
    }
}
