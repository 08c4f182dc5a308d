//! Multiple-choice accuracy by log-likelihood, the way lm-evaluation-harness (v0.4) and
//! `llama-perplexity --hellaswag` measure it: HellaSwag, ARC-Easy/Challenge, WinoGrande,
//! OpenBookQA and zero-shot MMLU.
//!
//! For each item and each option, the option becomes a (context, continuation) pair of strings
//! ([`prompt`]); the model scores the continuation's tokens given the context, and the summed
//! log-probability is the option's log-likelihood (LL) ([`score`]). Then, per item:
//! - **acc**: the option with the largest LL is the answer;
//! - **acc_norm**: the option with the largest LL divided by its length in characters (lm-eval's
//!   `len(choice)`, the choice text without the leading space; bytes for ASCII) is the answer.
//!
//! Both are reported with lm-eval's standard error, `sqrt(p (1 - p) / (n - 1))`.
//!
//! **What llama.cpp reports for HellaSwag, and how it relates.** `llama-perplexity --hellaswag`
//! tokenizes `context + " " + ending` as one string per ending, finds the token prefix all four
//! sequences share (the context plus any leading ending tokens they agree on), and picks the ending
//! with the largest *mean* log-probability per token over the tokens after that prefix. It labels
//! the result "acc_norm", but it is normalized by token count, not by characters, and it ignores
//! tokens shared by all endings. It also samples `--hellaswag-tasks` tasks at random (fixed seed)
//! rather than taking the first ones, and prints a Wilson 95 % interval rather than a standard
//! error. For HellaSwag we report lm-eval's acc and acc_norm and, additionally, llama.cpp's figure
//! computed from the same log-probabilities ([`score::Report::acc_llama_cpp`]) so the two tools
//! can be checked against each other on the same tasks (give llama-perplexity a file holding
//! exactly those tasks: with `--hellaswag-tasks` equal to the file's task count the random
//! selection takes all of them).
//!
//! The scoring loop takes any [`score::LogProbs`] (a closure from token ids to per-token
//! log-probabilities, or [`score::EngineScorer`] over a `sift_engine::Engine`). [`run`] is
//! `sift eval`'s run of it, [`plot`] the SVG charts of `sift sweep` and `sift simulate --sweep`.

#![forbid(unsafe_code)]

pub mod data;
pub mod plot;
pub mod prompt;
pub mod run;
pub mod score;

pub use data::{load, load_shots, Dataset, Format, Item, LoadError, TaskKind};
pub use score::{evaluate, Acc, EngineScorer, EvalOptions, LogProbs, Report, ScoreError};
