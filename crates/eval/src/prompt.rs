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
        TaskKind::Mmlu { subject } => {
            let mut ctx = String::new();
            if !subject.is_empty() {
                ctx.push_str(&format!(
                    "The following are multiple choice questions (with answers) about {subject}.\n\n"
                ));
            }
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
}
