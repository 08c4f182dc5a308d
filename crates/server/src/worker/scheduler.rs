//! The server's one decode loop: a scheduler over `-np` slots (llama-server's `--parallel`; one
//! by default) with continuous batching of their requests in one engine.
//!
//! Each slot is a sequence with its own KV cache (`Engine::set_slots`: the context is split as
//! llama-server splits it). A request takes a free slot (the one whose cached tokens share the
//! longest prefix with its prompt, reused as `Cached::reusable` allows) and joins the running
//! batch at the next step. Every step evaluates, in one `Engine::eval_slots` call, the next token
//! of each generating slot and the next chunk (`-ub` tokens) of each prompt being read, as many
//! as `-b` tokens allow (a long prompt does not stall the others' decoding), then samples each
//! finished row. A choice is a small state machine — its prompt read chunk by chunk, then
//! sampled from the prompt's logits, then stepped a token at a time until it finishes — that
//! owns sampling, log-probabilities, stop strings, timings and events; a request that ends,
//! fails or whose client goes away frees its slot at that step. With temperature 0 a request
//! gets exactly the text it gets alone: the engine computes each run as it would alone, and
//! prompts are cut into the same chunks whoever else runs. Between steps the worker answers
//! admin messages and polls the live budget.
//!
//! Requests asking for their prompt's log-probabilities (`echo` with `logprobs`) need every
//! position's logits: their prompt is read in one go at admission (the others wait for it).
//! With one slot under `--memory`, a choice's decode is measured against its bound
//! (`timings.decode`); with several, a tracer would change how the slots share a step.

use super::{prompt_chunks, token_logprob, Cached, Event, Job, Stop, Timings, Worker};
use crate::error::ApiError;
use crate::metrics::{Metrics, SlotGauge};
use crate::openai::TokenLogprob;
use sift_engine::generate::Generator;
use sift_engine::{GenerateOptions, Logits, SlotRun};
use sift_session::report::DecodeProbe;
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// One sequence of the engine and the request it serves.
#[derive(Default)]
pub(super) struct Slot {
    /// The tokens in this slot's KV cache.
    pub(super) cached: Cached,
    task: Option<Task>,
    /// Tokens generated here since the start (`/metrics`).
    generated: u64,
}

/// A request's current choice in a slot.
struct Task {
    job: Job,
    index: usize,
    tokens: Vec<u32>,
    /// Prompt chunks still to evaluate (ranges of `tokens`).
    chunks: VecDeque<Range<usize>>,
    /// Prompt tokens reused from the slot's cache.
    cache_n: usize,
    t_prompt: Instant,
    prompt_s: f64,
    /// The prompt's own log-probabilities (`echo` with `logprobs`), sent with the prompt event.
    echo: Vec<TokenLogprob>,
    echo_text: String,
    decode: Option<Decode>,
    /// Under `--memory` with one slot: the decode measured against its bound.
    probe: Option<DecodeProbe>,
}

struct Decode {
    g: Generator,
    /// The token sampled last, to evaluate at the next step.
    next: Option<u32>,
    pending: Vec<TokenLogprob>,
    t0: Instant,
    last: Instant,
}

/// What a run of a step was.
enum Run {
    Prompt { last: bool },
    Decode,
}

impl Worker {
    /// The worker's loop.
    pub(super) fn run(&mut self) {
        loop {
            let busy = self.slots.iter().any(|s| s.task.is_some());
            if !busy && self.pending.is_empty() {
                match self.rx.recv() {
                    Ok(m) => self.admin(m),
                    Err(_) => return,
                }
            }
            self.poll();
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.admit();
                self.step();
            }));
            if let Err(p) = ran {
                // A bug inside the engine fails the running requests, not the server: every
                // slot's cache is dropped (its contents are unknown) and the next jobs run.
                let what = super::panic_text(&p);
                eprintln!("sift: a batch failed inside the engine ({what}); every slot's KV cache was reset");
                for s in 0..self.slots.len() {
                    if let Some(t) = self.slots[s].task.take() {
                        let e = ApiError::internal(format!(
                            "the engine failed on this request ({what}); the server goes on"
                        ));
                        self.end_job(t.job, Err(Stop::Failed(e)));
                    }
                    self.reset_slot(s);
                }
            }
        }
    }

    /// Starts queued jobs in free slots.
    fn admit(&mut self) {
        while self.slots.iter().any(|s| s.task.is_none()) {
            let Some(job) = self.pending.pop_front() else { break };
            self.queued.fetch_sub(1, Ordering::SeqCst);
            Metrics::dec(&self.metrics.queued);
            if self.abort.load(Ordering::SeqCst) {
                let _ = job.events.send(Event::Error(ApiError::shutting_down()));
                continue;
            }
            if job.cancel.load(Ordering::SeqCst) || job.events.is_closed() {
                Metrics::inc(&self.metrics.cancelled, 1);
                continue;
            }
            Metrics::inc(&self.metrics.running, 1);
            self.start_choice(job, 0, None);
        }
    }

    /// Tokenizes choice `index` of `job` and puts it in `slot` (or the free slot whose cache
    /// shares most with it).
    fn start_choice(&mut self, job: Job, index: usize, slot: Option<usize>) {
        let (tokens, prompt_text) = match self.tokenize(&job.req.prompts[index]) {
            Ok(t) => t,
            Err(e) => return self.end_job(job, Err(Stop::Failed(e))),
        };
        let req = &job.req;
        let n_ctx = self.l.session.engine.n_ctx();
        let need = tokens.len() + usize::from(req.max_tokens > 0);
        if need > n_ctx {
            let e = ApiError::context_length(format!(
                "This model's maximum context length is {n_ctx} tokens{}; the prompt has {} tokens{}",
                self.per_slot(),
                tokens.len(),
                if req.max_tokens > 0 { " and at least one more is needed to generate" } else { "" }
            ));
            return self.end_job(job, Err(Stop::Failed(e)));
        }
        let sparse = self.l.session.engine.sparse_prefill();
        let shared: Vec<usize> = self.slots.iter().map(|s| s.cached.reusable(&tokens, sparse)).collect();
        let s = slot.unwrap_or_else(|| {
            (0..self.slots.len())
                .filter(|&i| self.slots[i].task.is_none())
                .max_by_key(|&i| (shared[i], std::cmp::Reverse(i)))
                .expect("admit found a free slot")
        });
        let engine = &mut self.l.session.engine;
        engine.use_slot(s);
        if let Err(e) = engine.reserve_kv(need) {
            return self.end_job(job, Err(Stop::Failed(ApiError::context_length(e.to_string()))));
        }
        let t_prompt = Instant::now();
        let echo_text = if req.echo { prompt_text } else { String::new() };
        let mut task = Task {
            job,
            index,
            chunks: VecDeque::new(),
            cache_n: 0,
            t_prompt,
            prompt_s: 0.0,
            echo: Vec::new(),
            echo_text,
            decode: None,
            probe: None,
            tokens,
        };
        if task.job.req.echo && task.job.req.logprobs.is_some() {
            // Every position's logits, read now.
            let r = self.echo_prompt(s, &task.job, &task.tokens, task.job.req.logprobs);
            match r {
                Ok(echo) => {
                    task.echo = echo;
                    let logits = std::mem::take(&mut self.logits);
                    self.prompt_done(s, task, &logits);
                    self.logits = logits;
                }
                Err(stop) => self.end_job(task.job, Err(stop)),
            }
            return;
        }
        // The common prefix stays (as with one slot: `Cached::reusable`).
        let common = shared[s];
        self.l.session.engine.truncate(common);
        self.slots[s].cached.truncate(common);
        let n = task.tokens.len();
        task.cache_n = common;
        let size = self.ubatch.min(self.l.session.engine.n_batch()).max(2);
        task.chunks = prompt_chunks(common, n, size, sparse).into();
        self.slots[s].task = Some(task);
    }

    /// One step of the batch: every generating slot's next token and the prompt chunks that fit.
    fn step(&mut self) {
        for s in 0..self.slots.len() {
            if self.slots[s].task.as_ref().is_some_and(|t| self.cancelled(&t.job)) {
                let t = self.slots[s].task.take().expect("checked");
                self.end_job(t.job, Err(Stop::Cancelled));
            }
        }
        let budget = self.l.session.engine.n_batch();
        let mut runs: Vec<(usize, Run, Vec<u32>)> = Vec::new();
        let mut used = 0;
        for (s, slot) in self.slots.iter().enumerate() {
            if let Some(t) = slot.task.as_ref().and_then(|t| t.decode.as_ref()).and_then(|d| d.next) {
                runs.push((s, Run::Decode, vec![t]));
                used += 1;
            }
        }
        let n = self.slots.len();
        for k in 0..n {
            let s = (self.next_prompt + k) % n;
            let Some(task) = self.slots[s].task.as_mut() else { continue };
            let Some(c) = task.chunks.front().cloned() else { continue };
            if used > 0 && used + c.len() > budget {
                continue;
            }
            task.chunks.pop_front();
            used += c.len();
            runs.push((s, Run::Prompt { last: task.chunks.is_empty() }, task.tokens[c].to_vec()));
        }
        self.next_prompt = (self.next_prompt + 1) % n;
        if runs.is_empty() {
            return;
        }
        let batch: Vec<SlotRun<'_>> = runs
            .iter()
            .map(|(s, r, t)| SlotRun {
                slot: *s,
                tokens: t,
                logits: if matches!(r, Run::Prompt { last: false }) { Logits::None } else { Logits::Last },
                prompt_end: match r {
                    Run::Prompt { .. } => self.slots[*s].task.as_ref().map(|t| t.tokens.len()),
                    Run::Decode => None,
                },
            })
            .collect();
        let logits = match self.l.session.engine.eval_slots(&batch) {
            Ok(l) => l.to_vec(),
            Err(e) => {
                let msg = format!("the engine failed: {e}");
                for (s, _, _) in &runs {
                    if let Some(t) = self.slots[*s].task.take() {
                        self.end_job(t.job, Err(Stop::Failed(ApiError::internal(msg.clone()))));
                    }
                    self.reset_slot(*s);
                }
                return;
            }
        };
        let n_vocab = self.l.session.engine.config().n_vocab;
        let mut rows = logits.chunks(n_vocab);
        let n_runs = runs.len();
        let sparse = self.l.session.engine.sparse_prefill();
        for (s, run, toks) in runs {
            self.slots[s].cached.tokens.extend_from_slice(&toks);
            let Some(mut task) = self.slots[s].task.take() else { continue };
            match run {
                Run::Prompt { last: false } => self.slots[s].task = Some(task),
                Run::Prompt { last: true } => {
                    self.slots[s].cached.prompt_read(task.tokens.len(), sparse);
                    let row = rows.next().expect("a row per run that asked");
                    task.prompt_s = task.t_prompt.elapsed().as_secs_f64();
                    self.prompt_done(s, task, row);
                }
                Run::Decode => {
                    let row = rows.next().expect("a row per run that asked");
                    if let Some(d) = task.decode.as_mut() {
                        d.next = None;
                    }
                    self.sample(s, task, row);
                }
            }
        }
        self.publish_slots(n_runs);
        self.poll();
    }

    /// Each slot's figures and the last step's batch for `/metrics`.
    fn publish_slots(&self, last_batch: usize) {
        let e = &self.l.session.engine;
        let gauges = (self.slots.iter().enumerate())
            .map(|(i, s)| SlotGauge { processing: s.task.is_some(), n_past: e.slot_n_past(i), generated: s.generated })
            .collect();
        self.metrics.set_slots(gauges, last_batch);
    }

    /// The prompt was read: tells the client, starts generating from `logits`.
    fn prompt_done(&mut self, s: usize, mut task: Task, logits: &[f32]) {
        if task.prompt_s == 0.0 {
            task.prompt_s = task.t_prompt.elapsed().as_secs_f64();
        }
        Metrics::inc(&self.metrics.prompt_tokens, task.tokens.len() as u64);
        let event = Event::Prompt {
            index: task.index,
            n_prompt: task.tokens.len(),
            echo_text: std::mem::take(&mut task.echo_text),
            echo: std::mem::take(&mut task.echo),
        };
        if task.job.events.send(event).is_err() {
            return self.end_job(task.job, Err(Stop::Cancelled));
        }
        let req = &task.job.req;
        let max = req.max_tokens.min(self.l.session.engine.n_ctx() - task.tokens.len());
        let opts = GenerateOptions {
            n_predict: Some(max),
            stop: req.stop.clone(),
            ignore_eos: req.ignore_eos,
            sampler: req.sampler.clone(),
        };
        // Under --memory with one slot, the decode is measured against its bound (a tracer
        // left by a cancelled request is replaced).
        if self.slots.len() == 1 && self.profile.is_some() {
            self.l.session.engine.set_tracer(None);
            match DecodeProbe::start(&mut self.l.session.engine) {
                Ok(p) => task.probe = p,
                Err(e) => return self.end_job(task.job, Err(Stop::Failed(ApiError::internal(e.to_string())))),
            }
        }
        let now = Instant::now();
        task.decode = Some(Decode {
            g: Generator::new(&opts, &task.tokens),
            next: None,
            pending: Vec::new(),
            t0: now,
            last: now,
        });
        self.sample(s, task, logits);
    }

    /// Samples the next token from `logits`, sends its text, and either keeps the task for the
    /// next step or finishes the choice.
    fn sample(&mut self, s: usize, mut task: Task, logits: &[f32]) {
        let d = task.decode.as_mut().expect("generating");
        if d.g.limit_reached() {
            return self.finish(s, task, "length", String::new());
        }
        let next = d.g.sample(logits);
        if let Some(k) = task.job.req.logprobs {
            d.pending.push(token_logprob(&self.l.session.tok, logits, next, k));
        }
        Metrics::inc(&self.metrics.generated_tokens, 1);
        self.slots[s].generated += 1;
        let now = Instant::now();
        if d.g.n_sampled() == 0 {
            self.metrics.observe_ttft((now - task.job.received).as_secs_f64());
        } else {
            self.metrics.observe_itl((now - d.last).as_secs_f64());
        }
        d.last = now;
        let step = d.g.push(&self.l.session.tok, next);
        if step.end.is_some() {
            return self.finish(s, task, "stop", step.text);
        }
        if !step.text.is_empty() {
            let lps = std::mem::take(&mut d.pending);
            if task.job.events.send(Event::Text { index: task.index, text: step.text, logprobs: lps }).is_err() {
                return self.end_job(task.job, Err(Stop::Cancelled));
            }
        }
        // The last allowed token is not evaluated (its logits would not be used).
        if d.g.limit_reached() || self.l.session.engine.slot_n_past(s) >= self.l.session.engine.n_ctx() {
            return self.finish(s, task, "length", String::new());
        }
        d.next = Some(next);
        self.slots[s].task = Some(task);
    }

    /// Ends a choice: the last text, its timings; then the job's next choice in the same slot,
    /// or the job is done.
    fn finish(&mut self, s: usize, mut task: Task, finish: &'static str, mut tail: String) {
        let d = task.decode.as_mut().expect("generating");
        tail.push_str(&d.g.finish());
        let index = task.index;
        if !tail.is_empty() || !d.pending.is_empty() {
            let lps = std::mem::take(&mut d.pending);
            if task.job.events.send(Event::Text { index, text: tail, logprobs: lps }).is_err() {
                return self.end_job(task.job, Err(Stop::Cancelled));
            }
        }
        let n_gen = d.g.n_sampled();
        let decode_s = d.t0.elapsed().as_secs_f64();
        let cache_n = task.cache_n.min(task.tokens.len());
        let mut timings = Timings::new(cache_n, task.tokens.len() - cache_n, task.prompt_s, n_gen, decode_s);
        if let (Some(p), Some(profile)) = (task.probe.take(), &self.profile) {
            match p.finish(&mut self.l.session.engine, decode_s, profile) {
                Ok(t) => {
                    self.metrics.set_decode(&t);
                    timings.decode = Some(t);
                }
                Err(e) => eprintln!("sift: the decode's bound: {e}"),
            }
        }
        if task.job.events.send(Event::Done { index, finish, n_gen, timings }).is_err() {
            return self.end_job(task.job, Err(Stop::Cancelled));
        }
        if index + 1 < task.job.req.prompts.len() {
            return self.start_choice(task.job, index + 1, Some(s));
        }
        self.end_job(task.job, Ok(()));
    }

    /// " per slot (-c divided by -np)" with several slots: what a context-length error adds.
    pub(super) fn per_slot(&self) -> &'static str {
        if self.slots.len() > 1 {
            " per slot (-c divided by -np)"
        } else {
            ""
        }
    }

    /// Drops slot `s`'s cache (after an engine error its contents are unknown).
    pub(super) fn reset_slot(&mut self, s: usize) {
        self.l.session.engine.use_slot(s);
        self.l.session.engine.truncate(0);
        self.slots[s].cached.clear();
    }

    /// How the union of the active units grew with the sequences decoded together (a sparse
    /// selection on a pack): per number of sequences, the sparse sites seen and the union's units
    /// over one token's.
    pub(super) fn batch_union_json(&self) -> Vec<serde_json::Value> {
        let stats = self.l.session.engine.sparsity_stats();
        (stats.batch_union.iter().enumerate())
            .filter(|(_, b)| b.site_visits > 0)
            .map(|(i, b)| {
                let k = i + 2;
                serde_json::json!({
                    "sequences": if k == 9 { "9+".to_string() } else { k.to_string() },
                    "site_visits": b.site_visits,
                    "union_over_one_token": b.union_over_one(k),
                })
            })
            .collect()
    }

    /// `/slots`: each slot's id, context, whether it runs a request, and its cached tokens.
    pub(super) fn slots_json(&self) -> Vec<serde_json::Value> {
        let e = &self.l.session.engine;
        (0..e.n_slots())
            .map(|i| {
                serde_json::json!({
                    "id": i,
                    "n_ctx": e.n_ctx(),
                    "is_processing": self.slots.get(i).map_or(self.metrics.running.load(Ordering::SeqCst) > 0, |s| s.task.is_some()),
                    "n_past": e.slot_n_past(i),
                })
            })
            .collect()
    }
}
