//! The worker: ONE std thread owns the [`Engine`], the [`Tokenizer`] and the [`ChatTemplate`] and
//! runs one sequence at a time, off the async runtime. Handlers send it [`Msg`]s over a channel;
//! a generation job carries its own event channel (pieces of text with their log-probabilities)
//! and a cancel flag, which the worker checks between tokens (and between prompt chunks). Admin
//! messages (budget changes, stats) are answered between tokens, so they never wait for a long
//! generation; generation jobs that arrive meanwhile wait in order.
//!
//! Between requests the KV cache keeps the previous sequence; a request that starts with the same
//! tokens evaluates only the rest (as `sift chat` does), except when it asks for the prompt's own
//! log-probabilities (`echo` + `logprobs`), which need every position's logits.

use crate::error::ApiError;
use crate::metrics::{MemoryGauges, Metrics};
use crate::openai::{GenRequest, PromptInput, TokenLogprob};
use serde_json::{json, Value};
use sift_engine::sparsity::Phase;
use sift_engine::{Engine, Logits, Sampler};
use sift_model::chat::ChatTemplate;
use sift_model::tokenizer::{StreamDecoder, Tokenizer};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc as tmpsc, oneshot};

/// Tokens per prompt chunk: the worker checks for cancellation and admin messages between chunks.
const PROMPT_CHUNK: usize = 256;
/// Tokens per chunk when every position's logits are needed (echo): bounds the logits buffer.
const ECHO_CHUNK: usize = 64;

/// Called between tokens and after each request.
pub type StepHook = Box<dyn FnMut(&mut Engine)>;
/// The store's plan and counters as JSON.
pub type StatsFn = Box<dyn Fn(&Engine) -> Option<Value>>;
/// Parses a budget ("300MB", "60%") into bytes.
pub type BudgetParser = Box<dyn Fn(&str) -> Result<u64, String>>;

/// What the engine-building closure returns, on the worker thread.
pub struct Loaded {
    pub engine: Engine,
    /// Shared with the handlers, which tokenize for `/tokenize` without waiting for the worker.
    pub tok: Arc<Tokenizer>,
    /// The model's chat template (or a ChatML fallback); `None`: chat requests are refused.
    pub template: Option<ChatTemplate>,
    /// Called between tokens and after each request (live budget files, logging budget changes).
    pub on_step: Option<StepHook>,
    /// The store's plan and counters as JSON (`None` without `--memory`).
    pub stats: StatsFn,
    /// Parses a budget as `--memory` does ("300MB", "60%").
    pub parse_budget: BudgetParser,
}

/// Builds the engine on the worker thread (so the engine never has to cross threads).
pub type Builder = Box<dyn FnOnce() -> anyhow::Result<Loaded> + Send>;

/// What the worker sends back for a generation job, in order.
#[derive(Debug)]
pub enum Event {
    /// Choice `index`'s prompt was evaluated. `echo`: its tokens' log-probabilities when asked.
    Prompt { index: usize, n_prompt: usize, echo_text: String, echo: Vec<TokenLogprob> },
    /// New text of choice `index`, with the log-probabilities of the tokens that produced it.
    Text { index: usize, text: String, logprobs: Vec<TokenLogprob> },
    /// Choice `index` finished: "stop" (EOS or a stop string) or "length".
    Done { index: usize, finish: &'static str, n_gen: usize },
    /// The job failed (no further events).
    Error(ApiError),
}

/// A generation job.
pub struct Job {
    pub req: GenRequest,
    pub events: tmpsc::UnboundedSender<Event>,
    pub cancel: Arc<AtomicBool>,
    pub received: Instant,
}

/// Messages to the worker.
pub enum Msg {
    Generate(Job),
    /// Change the memory budget; replies with the new plan or a 400 with the refusal.
    SetBudget {
        spec: String,
        reply: oneshot::Sender<Result<Value, ApiError>>,
    },
    /// The cache and I/O stats.
    Stats {
        reply: oneshot::Sender<Value>,
    },
}

/// What the server knows about the loaded model.
#[derive(Clone)]
pub struct ModelInfo {
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub has_template: bool,
    /// The chat template's Jinja source (for `/tokenizer_info`).
    pub chat_template: Option<String>,
    pub memory: bool,
    /// The model's tokenizer (read-only; the worker holds the same one).
    pub tok: Arc<Tokenizer>,
}

/// The handlers' side of the worker.
#[derive(Clone)]
pub struct WorkerHandle {
    tx: mpsc::Sender<Msg>,
    queued: Arc<AtomicUsize>,
    max_queue: usize,
    /// Set when shutdown starts: new jobs are refused.
    closing: Arc<AtomicBool>,
    /// Set when the grace period is over: running and queued jobs are cancelled.
    abort: Arc<AtomicBool>,
    pub info: ModelInfo,
}

impl WorkerHandle {
    /// Queues a job, or refuses it with 503 when the queue is full or the server is closing.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        if self.closing.load(Ordering::SeqCst) {
            return Err(ApiError::shutting_down());
        }
        let q = self.queued.fetch_add(1, Ordering::SeqCst);
        if q >= self.max_queue {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(ApiError::queue_full(self.max_queue));
        }
        self.tx.send(Msg::Generate(job)).map_err(|_| {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            ApiError::internal("the worker thread has stopped")
        })
    }

    /// Sends an admin message.
    pub fn send(&self, msg: Msg) -> Result<(), ApiError> {
        self.tx.send(msg).map_err(|_| ApiError::internal("the worker thread has stopped"))
    }

    /// Jobs waiting (not yet started).
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    /// Refuse new jobs from now on.
    pub fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
    }

    /// Cancel the running and queued jobs.
    pub fn abort(&self) {
        self.abort.store(true, Ordering::SeqCst);
    }
}

/// Starts the worker thread, builds the engine on it and waits until it is loaded.
pub fn spawn(
    build: Builder,
    metrics: Arc<Metrics>,
    max_queue: usize,
) -> anyhow::Result<(WorkerHandle, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel::<Msg>();
    let (ready_tx, ready_rx) = mpsc::channel::<Result<ModelInfo, String>>();
    let queued = Arc::new(AtomicUsize::new(0));
    let abort = Arc::new(AtomicBool::new(false));
    let (q2, a2) = (queued.clone(), abort.clone());
    let thread = std::thread::Builder::new().name("sift-worker".into()).spawn(move || {
        let loaded = match build() {
            Ok(l) => l,
            Err(e) => {
                let msg = std::iter::once(e.to_string())
                    .chain(e.chain().skip(1).map(|c| format!("caused by: {c}")))
                    .collect::<Vec<_>>()
                    .join("\n  ");
                let _ = ready_tx.send(Err(msg));
                return;
            }
        };
        let info = ModelInfo {
            n_ctx: loaded.engine.n_ctx(),
            n_vocab: loaded.engine.config().n_vocab,
            has_template: loaded.template.is_some(),
            chat_template: loaded.template.as_ref().map(|t| t.source().to_string()),
            memory: loaded.engine.store().is_some(),
            tok: loaded.tok.clone(),
        };
        let mut w = Worker {
            l: loaded,
            rx,
            pending: VecDeque::new(),
            cached: Vec::new(),
            metrics,
            queued: q2,
            abort: a2,
            logits: Vec::new(),
        };
        w.publish();
        let _ = ready_tx.send(Ok(info));
        w.run();
    })?;
    let info = match ready_rx.recv() {
        Ok(Ok(info)) => info,
        Ok(Err(e)) => {
            let _ = thread.join();
            anyhow::bail!("{e}");
        }
        Err(_) => {
            let _ = thread.join();
            anyhow::bail!("the worker thread stopped while loading the model");
        }
    };
    let handle = WorkerHandle { tx, queued, max_queue, closing: Arc::new(AtomicBool::new(false)), abort, info };
    Ok((handle, thread))
}

struct Worker {
    l: Loaded,
    rx: mpsc::Receiver<Msg>,
    /// Jobs received while another ran.
    pending: VecDeque<Job>,
    /// The tokens in the KV cache.
    cached: Vec<u32>,
    metrics: Arc<Metrics>,
    queued: Arc<AtomicUsize>,
    abort: Arc<AtomicBool>,
    logits: Vec<f32>,
}

/// Why a job stopped early.
enum Stop {
    /// The client went away (or shutdown cancelled it).
    Cancelled,
    Failed(ApiError),
}

impl Worker {
    fn run(&mut self) {
        loop {
            let msg = match self.pending.pop_front() {
                Some(j) => Msg::Generate(j),
                None => match self.rx.recv() {
                    Ok(m) => m,
                    Err(_) => return,
                },
            };
            match msg {
                Msg::Generate(job) => {
                    self.queued.fetch_sub(1, Ordering::SeqCst);
                    Metrics::dec(&self.metrics.queued);
                    // A bug that panics inside the engine fails this request, not the server:
                    // the KV cache is dropped (its contents are unknown) and the next job runs.
                    let events = job.events.clone();
                    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.job(job)));
                    if let Err(p) = ran {
                        let what = p
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| p.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "unknown panic".into());
                        eprintln!("sift: a request failed inside the engine ({what}); the KV cache was reset");
                        self.reset();
                        self.metrics.running.store(0, Ordering::SeqCst);
                        Metrics::inc(&self.metrics.errors, 1);
                        let _ = events.send(Event::Error(ApiError::internal(format!(
                            "the engine failed on this request ({what}); the server goes on"
                        ))));
                    }
                }
                other => self.admin(other),
            }
        }
    }

    /// Handles admin messages and queues jobs that arrived meanwhile; called between tokens.
    fn poll(&mut self) {
        while let Ok(m) = self.rx.try_recv() {
            match m {
                Msg::Generate(j) => self.pending.push_back(j),
                other => self.admin(other),
            }
        }
        if let Some(f) = &mut self.l.on_step {
            f(&mut self.l.engine);
        }
    }

    fn admin(&mut self, msg: Msg) {
        match msg {
            Msg::Generate(j) => self.pending.push_back(j),
            Msg::SetBudget { spec, reply } => {
                let r = self.set_budget(&spec);
                self.publish();
                let _ = reply.send(r);
            }
            Msg::Stats { reply } => {
                self.publish();
                let _ = reply.send(self.stats());
            }
        }
    }

    fn set_budget(&mut self, spec: &str) -> Result<Value, ApiError> {
        if self.l.engine.store().is_none() {
            return Err(ApiError::invalid_param(
                "budget",
                "the memory budget can change only on a server started with --memory (on a sift pack)",
            ));
        }
        let bytes = (self.l.parse_budget)(spec).map_err(|e| ApiError::invalid_param("budget", e))?;
        let t0 = Instant::now();
        match self.l.engine.set_memory_budget(bytes) {
            Ok(plan) => {
                eprintln!("sift: budget -> {bytes} bytes (admin request), cache {} bytes", plan.cache);
                Ok(json!({
                    "budget": bytes,
                    "plan": plan,
                    "applied_secs": t0.elapsed().as_secs_f64(),
                    "rss_bytes": sift_engine::current_rss(),
                }))
            }
            Err(e) => Err(ApiError::invalid_param("budget", format!("budget {bytes} bytes refused: {e}"))),
        }
    }

    fn stats(&self) -> Value {
        let g = self.metrics.memory();
        json!({
            "memory": (self.l.stats)(&self.l.engine),
            "budget_bytes": if g.budget_bytes > 0 { Value::from(g.budget_bytes) } else { Value::Null },
            "rss_bytes": sift_engine::current_rss(),
            "n_ctx": self.l.engine.n_ctx(),
            "n_past": self.l.engine.n_past(),
            "queued": self.queued.load(Ordering::SeqCst),
        })
    }

    /// Publishes the memory gauges for /metrics.
    fn publish(&self) {
        let mut g = MemoryGauges { rss_bytes: sift_engine::current_rss().unwrap_or(0), ..Default::default() };
        if let Some(s) = self.l.engine.store() {
            g.budget_bytes = s.plan.budget;
            g.hit_rate = s.stats().hit_rate();
            g.bytes_read = s.stats().bytes_read();
        }
        self.metrics.set_memory(g);
    }

    fn cancelled(&self, job: &Job) -> bool {
        job.cancel.load(Ordering::SeqCst) || self.abort.load(Ordering::SeqCst) || job.events.is_closed()
    }

    fn job(&mut self, job: Job) {
        if self.abort.load(Ordering::SeqCst) {
            let _ = job.events.send(Event::Error(ApiError::shutting_down()));
            return;
        }
        if job.cancel.load(Ordering::SeqCst) || job.events.is_closed() {
            Metrics::inc(&self.metrics.cancelled, 1);
            return;
        }
        Metrics::inc(&self.metrics.running, 1);
        let mut result = Ok(());
        for (index, p) in job.req.prompts.iter().enumerate() {
            result = self.choice(&job, index, p);
            if result.is_err() {
                break;
            }
        }
        match result {
            Ok(()) => self.metrics.observe_duration(job.received.elapsed().as_secs_f64()),
            Err(Stop::Cancelled) => {
                Metrics::inc(&self.metrics.cancelled, 1);
                if self.abort.load(Ordering::SeqCst) {
                    let _ = job.events.send(Event::Error(ApiError::shutting_down()));
                }
            }
            Err(Stop::Failed(e)) => {
                Metrics::inc(&self.metrics.errors, 1);
                let _ = job.events.send(Event::Error(e));
            }
        }
        Metrics::dec(&self.metrics.running);
        self.poll();
        self.publish();
    }

    fn tokenize(&self, p: &PromptInput) -> Result<(Vec<u32>, String), ApiError> {
        let tok = &self.l.tok;
        let bad = |e: String| ApiError::invalid_param("prompt", e);
        let (tokens, text) = match p {
            PromptInput::Text(s) => (tok.encode(s, true, false).map_err(|e| bad(e.to_string()))?, s.clone()),
            PromptInput::Tokens(t) => {
                if let Some(&id) = t.iter().find(|&&id| id as usize >= self.l.engine.config().n_vocab) {
                    return Err(bad(format!(
                        "token id {id} is outside the vocabulary of {} tokens",
                        self.l.engine.config().n_vocab
                    )));
                }
                (t.clone(), String::from_utf8_lossy(&tok.decode_bytes(t, false)).into_owned())
            }
            PromptInput::Chat(m) => {
                let t = self
                    .l
                    .template
                    .as_ref()
                    .ok_or_else(|| ApiError::invalid("this model has no chat template: use /v1/completions"))?;
                let text = t.apply(m, true).map_err(|e| ApiError::invalid_param("messages", e.to_string()))?;
                (tok.encode(&text, true, true).map_err(|e| bad(e.to_string()))?, String::new())
            }
        };
        if tokens.is_empty() {
            return Err(bad("the prompt is empty after tokenization".into()));
        }
        Ok((tokens, text))
    }

    /// Drops the KV cache after an engine error (its contents are unknown).
    fn reset(&mut self) {
        self.l.engine.truncate(0);
        self.cached.clear();
    }

    fn engine_error(&mut self, e: sift_engine::EvalError) -> Stop {
        self.reset();
        Stop::Failed(ApiError::internal(format!("the engine failed: {e}")))
    }

    /// Evaluates the prompt; leaves the last position's logits in `self.logits`.
    fn prompt(&mut self, job: &Job, tokens: &[u32], k: Option<usize>) -> Result<Vec<TokenLogprob>, Stop> {
        let echo_lp = job.req.echo && k.is_some();
        let mut echo = Vec::new();
        if echo_lp {
            // Every position's logits: the whole sequence is evaluated again, in bounded chunks.
            self.reset();
            echo.push(TokenLogprob {
                id: tokens[0],
                bytes: self.l.tok.piece(tokens[0]).to_vec(),
                logprob: None,
                top: vec![],
            });
            let n_vocab = self.l.engine.config().n_vocab;
            let mut start = 0;
            for r in batches(tokens.len(), ECHO_CHUNK) {
                let chunk = &tokens[r];
                if self.cancelled(job) {
                    self.reset();
                    return Err(Stop::Cancelled);
                }
                let logits = match self.l.engine.eval_phase(chunk, Logits::All, Phase::Prompt) {
                    Ok(l) => l,
                    Err(e) => return Err(self.engine_error(e)),
                };
                for (r, row) in logits.chunks(n_vocab).enumerate() {
                    let p = start + r;
                    if p + 1 < tokens.len() {
                        echo.push(token_logprob(&self.l.tok, row, tokens[p + 1], k.unwrap_or(0)));
                    } else {
                        self.logits.clear();
                        self.logits.extend_from_slice(row);
                    }
                }
                self.cached.extend_from_slice(chunk);
                start += chunk.len();
                self.poll();
            }
            return Ok(echo);
        }
        // Keep the common prefix, but evaluate at least two tokens: a single token runs on the
        // decode path (the pack's column kernels under sparsity), whose rounding differs from a
        // prompt batch's, and the same request must give the same text whether or not its
        // prefix was cached.
        let common =
            self.cached.iter().zip(tokens).take_while(|(a, b)| a == b).count().min(tokens.len().saturating_sub(2));
        self.l.engine.truncate(common);
        self.cached.truncate(common);
        let rest = &tokens[common..];
        for r in batches(rest.len(), PROMPT_CHUNK) {
            let chunk = &rest[r];
            if self.cancelled(job) {
                self.reset();
                return Err(Stop::Cancelled);
            }
            match self.l.engine.eval(chunk, Logits::Last) {
                Ok(l) => {
                    self.logits.clear();
                    self.logits.extend_from_slice(l);
                }
                Err(e) => return Err(self.engine_error(e)),
            }
            self.cached.extend_from_slice(chunk);
            self.poll();
        }
        Ok(echo)
    }

    /// Runs one prompt and its generation (one choice).
    fn choice(&mut self, job: &Job, index: usize, p: &PromptInput) -> Result<(), Stop> {
        let req = &job.req;
        let (tokens, prompt_text) = self.tokenize(p).map_err(Stop::Failed)?;
        let n_ctx = self.l.engine.n_ctx();
        let need = tokens.len() + usize::from(req.max_tokens > 0);
        if need > n_ctx {
            return Err(Stop::Failed(ApiError::context_length(format!(
                "This model's maximum context length is {n_ctx} tokens; the prompt has {} tokens{}",
                tokens.len(),
                if req.max_tokens > 0 { " and at least one more is needed to generate" } else { "" }
            ))));
        }
        let k = req.logprobs;
        let echo = self.prompt(job, &tokens, k)?;
        Metrics::inc(&self.metrics.prompt_tokens, tokens.len() as u64);
        let echo_text = if req.echo { prompt_text } else { String::new() };
        if job.events.send(Event::Prompt { index, n_prompt: tokens.len(), echo_text, echo }).is_err() {
            return Err(Stop::Cancelled);
        }
        let max = req.max_tokens.min(n_ctx - tokens.len());
        let mut sampler = Sampler::new(req.sampler.clone());
        for &t in &tokens {
            sampler.accept(t);
        }
        let mut dec = StreamDecoder::new();
        let mut text = String::new();
        let mut emitted = 0usize;
        let mut pending: Vec<TokenLogprob> = Vec::new();
        let mut n_gen = 0usize;
        let mut hit_stop = false;
        let mut last = Instant::now();
        let send = |text: &str, lps: &mut Vec<TokenLogprob>| {
            job.events.send(Event::Text { index, text: text.to_string(), logprobs: std::mem::take(lps) }).is_ok()
        };
        let finish = loop {
            if n_gen >= max {
                break "length";
            }
            if self.cancelled(job) {
                return Err(Stop::Cancelled);
            }
            let next = sampler.sample(&self.logits);
            if let Some(k) = k {
                pending.push(token_logprob(&self.l.tok, &self.logits, next, k));
            }
            n_gen += 1;
            Metrics::inc(&self.metrics.generated_tokens, 1);
            let now = Instant::now();
            if n_gen == 1 {
                self.metrics.observe_ttft((now - job.received).as_secs_f64());
            } else {
                self.metrics.observe_itl((now - last).as_secs_f64());
            }
            last = now;
            if !req.ignore_eos && self.l.tok.is_eog(next) {
                // The end-of-text token adds no text but counts as generated, and its
                // log-probability is reported (as vLLM does): a client that asks for one token
                // with `echo` (lm-eval's loglikelihood) drops the last entry and must find
                // exactly the prompt's tokens before it.
                break "stop";
            }
            sampler.accept(next);
            if let Some(piece) = dec.push(&self.l.tok, next) {
                text.push_str(&piece);
            }
            if let Some(cut) = req.stop.iter().filter_map(|s| text.find(s.as_str())).min() {
                text.truncate(cut);
                if emitted < text.len() || !pending.is_empty() {
                    send(&text[emitted..], &mut pending);
                }
                emitted = text.len();
                hit_stop = true;
                break "stop";
            }
            let safe = text.len() - held_back(&text, &req.stop);
            if safe > emitted {
                if !send(&text[emitted..safe], &mut pending) {
                    return Err(Stop::Cancelled);
                }
                emitted = safe;
            }
            if self.l.engine.n_past() >= n_ctx {
                break "length";
            }
            match self.l.engine.eval(&[next], Logits::Last) {
                Ok(l) => {
                    self.logits.clear();
                    self.logits.extend_from_slice(l);
                }
                Err(e) => return Err(self.engine_error(e)),
            }
            self.cached.push(next);
            self.poll();
        };
        if emitted < text.len() || dec.has_pending() || !pending.is_empty() {
            let mut rest = text[emitted..].to_string();
            if !hit_stop {
                if let Some(r) = dec.flush() {
                    rest.push_str(&r);
                }
            }
            if (!rest.is_empty() || !pending.is_empty()) && !send(&rest, &mut pending) {
                return Err(Stop::Cancelled);
            }
        }
        if job.events.send(Event::Done { index, finish, n_gen }).is_err() {
            return Err(Stop::Cancelled);
        }
        Ok(())
    }
}

/// Splits `n` prompt tokens into batches of at most `size`, none of one token when `n > 1`: a
/// lone token would run on the decode path, whose rounding differs from a batch's.
fn batches(n: usize, size: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < n {
        let mut len = size.min(n - start);
        if n - start - len == 1 && len > 2 {
            len -= 1;
        }
        out.push(start..start + len);
        start += len;
    }
    out
}

/// Length of the longest suffix of `text` that is a proper prefix of some stop string.
fn held_back(text: &str, stops: &[String]) -> usize {
    let mut best = 0;
    for s in stops {
        for (i, _) in s.char_indices().skip(1) {
            if i > best && text.ends_with(&s[..i]) {
                best = i;
            }
        }
    }
    best
}

/// The log-probability of `id` under `logits` (log-softmax) and the `k` most likely tokens.
pub fn token_logprob(tok: &Tokenizer, logits: &[f32], id: u32, k: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let lse = max as f64 + sum.ln();
    let lp = |i: usize| (logits[i] as f64 - lse) as f32;
    // The k largest, by insertion into a short sorted list (k is at most 20).
    let mut best: Vec<(usize, f32)> = Vec::with_capacity(k + 1);
    if k > 0 {
        for (i, &l) in logits.iter().enumerate() {
            if best.len() == k && l <= best[k - 1].1 {
                continue;
            }
            let pos = best.partition_point(|&(_, b)| b >= l);
            best.insert(pos, (i, l));
            best.truncate(k);
        }
    }
    let top = best.iter().map(|&(i, _)| (tok.piece(i as u32).to_vec(), lp(i))).collect();
    TokenLogprob { id, bytes: tok.piece(id).to_vec(), logprob: Some(lp(id as usize)), top }
}

#[cfg(test)]
mod tests {
    use super::{batches, held_back};

    #[test]
    fn prompt_batches_never_leave_one_token_alone() {
        assert_eq!(batches(5, 4), vec![0..3, 3..5]);
        assert_eq!(batches(8, 4), vec![0..4, 4..8]);
        assert_eq!(batches(1, 4), vec![0..1]);
        assert!(batches(0, 4).is_empty());
        for n in 2..40 {
            let b = batches(n, 8);
            assert!(b.iter().all(|r| r.len() >= 2 && r.len() <= 8), "{n}: {b:?}");
            assert_eq!(b.last().unwrap().end, n);
        }
    }

    #[test]
    fn holds_back_partial_stop_strings() {
        let stops = vec!["</s>".to_string(), "User:".to_string()];
        assert_eq!(held_back("hello </", &stops), 2);
        assert_eq!(held_back("hello", &stops), 0);
    }
}
