//! The worker: ONE std thread owns the [`Engine`], the [`Tokenizer`] and the [`ChatTemplate`],
//! off the async runtime, and runs the server's one decode loop ([`scheduler`]: `-np` slots,
//! one by default). Handlers send it [`Msg`]s over a channel; a generation job carries its own
//! event channel (pieces of text with their log-probabilities) and a cancel flag, which the
//! worker checks at every step (a prompt chunk or a token). Admin messages (budget changes,
//! stats) are answered between steps, so they never wait for a long generation; generation jobs
//! that arrive while every slot is busy wait in order.
//!
//! Between requests each slot's KV cache keeps its previous sequence; a request that starts with
//! the same tokens evaluates only the rest (as `sift chat` does), except when it asks for the
//! prompt's own log-probabilities (`echo` + `logprobs`), which need every position's logits.

use crate::error::ApiError;
use crate::metrics::{MemoryGauges, Metrics};
use crate::openai::{GenRequest, PromptInput, TokenLogprob};
use serde_json::{json, Value};
use sift_engine::prefill::PREFILL_BLOCK;
use sift_engine::Logits;
use sift_model::chat::{ChatMessage, ChatTemplate};
use sift_model::tokenizer::Tokenizer;
use sift_session::{Session, SessionOptions};
use sift_sim::bound::DecodeTelemetry;
use sift_sim::profile::DeviceProfile;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc as tmpsc, oneshot};

mod prompt;
mod scheduler;

/// Tokens per chunk when every position's logits are needed (echo): bounds the logits buffer.
const ECHO_CHUNK: usize = 64;

/// What the worker sends back for a generation job, in order.
#[derive(Debug)]
pub enum Event {
    /// Choice `index`'s prompt was evaluated. `echo`: its tokens' log-probabilities when asked.
    Prompt { index: usize, n_prompt: usize, echo_text: String, echo: Vec<TokenLogprob> },
    /// New text of choice `index`, with the log-probabilities of the tokens that produced it.
    Text { index: usize, text: String, logprobs: Vec<TokenLogprob> },
    /// Choice `index` finished: "stop" (EOS or a stop string) or "length", with its timings.
    Done { index: usize, finish: &'static str, n_gen: usize, timings: Timings },
    /// The job failed (no further events).
    Error(ApiError),
}

/// How long a choice took, as llama-server reports it (`timings` in its responses), and under
/// `--memory` its decode against the bound (see `sift_sim::bound`).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Timings {
    /// Prompt tokens reused from the previous request's KV cache, and those evaluated.
    pub cache_n: usize,
    pub prompt_n: usize,
    pub prompt_ms: f64,
    pub prompt_per_token_ms: f64,
    pub prompt_per_second: f64,
    pub predicted_n: usize,
    pub predicted_ms: f64,
    pub predicted_per_token_ms: f64,
    pub predicted_per_second: f64,
    /// Under `--memory`: tok/s against the bound, bytes read per token, read amplification, hit
    /// rates by count and bytes, stall and compute time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode: Option<DecodeTelemetry>,
}

impl Timings {
    fn new(cache_n: usize, prompt_n: usize, prompt_s: f64, predicted_n: usize, predicted_s: f64) -> Timings {
        let per = |n: usize, s: f64| (1e3 * s / n.max(1) as f64, if s > 0.0 { n as f64 / s } else { 0.0 });
        let (prompt_per_token_ms, prompt_per_second) = per(prompt_n, prompt_s);
        let (predicted_per_token_ms, predicted_per_second) = per(predicted_n, predicted_s);
        Timings {
            cache_n,
            prompt_n,
            prompt_ms: prompt_s * 1e3,
            prompt_per_token_ms,
            prompt_per_second,
            predicted_n,
            predicted_ms: predicted_s * 1e3,
            predicted_per_token_ms,
            predicted_per_second,
            decode: None,
        }
    }

    /// The timings of several choices as one: counts and times added.
    pub fn sum<'a>(all: impl IntoIterator<Item = &'a Timings>) -> Timings {
        let (mut c, mut pn, mut ps, mut gn, mut gs, mut decode) = (0, 0, 0.0, 0, 0.0, None);
        for t in all {
            c += t.cache_n;
            pn += t.prompt_n;
            ps += t.prompt_ms * 1e-3;
            gn += t.predicted_n;
            gs += t.predicted_ms * 1e-3;
            decode = t.decode.clone().or(decode);
        }
        Timings { decode, ..Timings::new(c, pn, ps, gn, gs) }
    }
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

/// The session a worker serves, with the chat template requests are rendered with.
struct Loaded {
    session: Session,
    /// The model's chat template (or a ChatML fallback); `None`: chat requests are refused.
    template: Option<ChatTemplate>,
}

/// Opens the session on the worker thread (so the engine never crosses threads).
fn open(opts: &SessionOptions, request_reserve: u64, parallel: usize) -> anyhow::Result<Loaded> {
    // Under --memory alone the planner plans the cache for the slots' union of active columns.
    let mut opts = opts.clone();
    opts.memory.sequences = parallel;
    let mut session = Session::open(&opts)?;
    if parallel > 1 {
        session.engine.set_slots(parallel).map_err(|e| anyhow::anyhow!("-np {parallel}: {e}"))?;
        eprintln!(
            "sift: {parallel} parallel slots of {} tokens of context each{}",
            session.engine.n_ctx(),
            match (session.engine.slots_mode(), session.engine.slots_batch_blocker()) {
                (sift_engine::SlotsMode::Batch, _) => ", batched".to_string(),
                (sift_engine::SlotsMode::RowByRow, _) =>
                    ", decoding together, each token on its own active columns (prompt chunks one at a time)"
                        .to_string(),
                (_, why) => format!(
                    ", one after another at each step ({}: a batch would change their results)",
                    why.unwrap_or("this engine")
                ),
            }
        );
    }
    if session.engine.memory().is_some() && request_reserve > 0 {
        // Requests' bodies, tokenizing and responses live in the budget too.
        let slots = if parallel > 1 {
            format!(", with the KV caches of {parallel} slots (each at least 256 positions)")
        } else {
            String::new()
        };
        let plan = session.engine.set_budget_reserve(request_reserve).map_err(|e| {
            anyhow::anyhow!(
                "--memory leaves no room for requests: the server keeps {} MiB of it for request bodies, tokenizing and \
                 responses (12 × --max-body), and the rest cannot hold the model{slots} ({e}); raise --memory, lower \
                 --max-body{}",
                request_reserve >> 20,
                if parallel > 1 { " or use fewer slots (-np)" } else { "" }
            )
        })?;
        eprintln!(
            "sift: {} MiB of the budget kept for requests (12 × --max-body); the engine plans with {} MiB",
            request_reserve >> 20,
            plan.budget >> 20
        );
    }
    if let Some(line) = &session.planned {
        eprintln!("{line}");
    }
    // The model's template, else ChatML; a template that does not compile leaves chat off. It
    // is tried once on a one-message conversation: a template that loops or grows without end
    // (a hostile model file) shows it here, at start, rather than in a client's request.
    let template = match ChatTemplate::from_gguf_or_chatml(&session.engine.model.file.gguf, &session.tok) {
        Ok(t) => match t.apply(&[ChatMessage::user("Hello")], true) {
            Err(e) if e.is_runaway() => {
                eprintln!("sift: chat template unusable ({e}); /v1/chat/completions is off");
                None
            }
            Err(e) => {
                eprintln!("sift: warning: the chat template fails on a one-message conversation ({e})");
                Some(t)
            }
            Ok(_) => Some(t),
        },
        Err(e) => {
            eprintln!("sift: chat template unusable ({e}); /v1/chat/completions is off");
            None
        }
    };
    Ok(Loaded { session, template })
}

/// Starts the worker thread, opens the session on it and waits until it is loaded.
pub fn spawn(
    opts: SessionOptions,
    metrics: Arc<Metrics>,
    max_queue: usize,
    request_reserve: u64,
    parallel: usize,
    ubatch: usize,
) -> anyhow::Result<(WorkerHandle, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel::<Msg>();
    let (ready_tx, ready_rx) = mpsc::channel::<Result<ModelInfo, String>>();
    let queued = Arc::new(AtomicUsize::new(0));
    let abort = Arc::new(AtomicBool::new(false));
    let (q2, a2) = (queued.clone(), abort.clone());
    let profile =
        match sift_session::profile::resolve_profile_for(opts.memory.profile.as_deref(), opts.engine.n_threads) {
            Ok(p) => Some(p),
            Err(e) if opts.memory.memory.is_some() => {
                eprintln!("sift: no device profile ({e}); responses will not report the decode's bound");
                None
            }
            Err(_) => None,
        };
    let thread = std::thread::Builder::new().name("sift-worker".into()).spawn(move || {
        let loaded = match open(&opts, request_reserve, parallel) {
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
            n_ctx: loaded.session.engine.n_ctx(),
            n_vocab: loaded.session.engine.config().n_vocab,
            has_template: loaded.template.is_some(),
            chat_template: loaded.template.as_ref().map(|t| t.source().to_string()),
            memory: loaded.session.engine.memory().is_some(),
            tok: loaded.session.tok.clone(),
        };
        let mut w = Worker {
            l: loaded,
            rx,
            pending: VecDeque::new(),
            metrics,
            queued: q2,
            abort: a2,
            logits: Vec::new(),
            profile,
            slots: (0..parallel.max(1)).map(|_| scheduler::Slot::default()).collect(),
            next_prompt: 0,
            ubatch,
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
    /// Jobs received while the slots were busy.
    pending: VecDeque<Job>,
    metrics: Arc<Metrics>,
    queued: Arc<AtomicUsize>,
    abort: Arc<AtomicBool>,
    logits: Vec<f32>,
    /// The device profile a budgeted decode's bound takes the disk's bandwidth and the compute
    /// model from (`--profile`).
    profile: Option<DeviceProfile>,
    /// The `-np` slots (one by default; see `scheduler`).
    slots: Vec<scheduler::Slot>,
    /// The slot whose prompt chunk goes first at the next step (turns, for fairness).
    next_prompt: usize,
    /// Prompt tokens a slot reads per step (`-ub`).
    ubatch: usize,
}

/// Why a job stopped early.
enum Stop {
    /// The client went away (or shutdown cancelled it).
    Cancelled,
    Failed(ApiError),
}

impl Worker {
    /// Handles admin messages and queues jobs that arrived meanwhile; called between tokens.
    fn poll(&mut self) {
        while let Ok(m) = self.rx.try_recv() {
            match m {
                Msg::Generate(j) => self.pending.push_back(j),
                other => self.admin(other),
            }
        }
        for change in self.l.session.poll() {
            eprintln!("{}", sift_session::report::describe_budget_change(&change));
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
        if self.l.session.engine.memory().is_none() {
            return Err(ApiError::invalid_param(
                "budget",
                "the memory budget can change only on a server started with --memory (on a sift pack)",
            ));
        }
        let bytes = self.l.session.parse_budget(spec).map_err(|e| ApiError::invalid_param("budget", e.to_string()))?;
        let t0 = Instant::now();
        match self.l.session.engine.set_memory_budget(bytes) {
            Ok(plan) => {
                eprintln!("sift: budget -> {bytes} bytes (admin request), cache {} bytes", plan.cache);
                Ok(json!({
                    "budget": bytes,
                    "request_reserve": self.l.session.engine.budget_reserve(),
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
            "memory": sift_session::report::stats_json(&self.l.session.engine),
            "budget_bytes": if g.budget_bytes > 0 { Value::from(g.budget_bytes) } else { Value::Null },
            "rss_bytes": sift_engine::current_rss(),
            "n_ctx": self.l.session.engine.n_ctx(),
            "n_past": self.l.session.engine.n_past(),
            "queued": self.queued.load(Ordering::SeqCst),
            "slots": self.slots_json(),
            "batch_union": self.batch_union_json(),
        })
    }

    /// Publishes the memory gauges for /metrics.
    fn publish(&self) {
        let mut g = MemoryGauges { rss_bytes: sift_engine::current_rss().unwrap_or(0), ..Default::default() };
        if let Some(s) = self.l.session.engine.memory() {
            g.budget_bytes = s.plan().budget + self.l.session.engine.budget_reserve();
            g.hit_rate = s.stats().hit_rate();
            g.bytes_read = s.stats().bytes_read();
        }
        self.metrics.set_memory(g);
    }

    fn cancelled(&self, job: &Job) -> bool {
        job.cancel.load(Ordering::SeqCst) || self.abort.load(Ordering::SeqCst) || job.events.is_closed()
    }

    /// A job is over: done, cancelled or failed; counted, and the client told why it stopped.
    fn end_job(&mut self, job: Job, result: Result<(), Stop>) {
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
        self.publish();
    }
}

/// What a caught panic said.
fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// A KV cache's tokens and how far they can be reused: the first `exact` positions were computed
/// as reading a prompt afresh computes them. With dense prefill that is all of them; with sparse
/// prefill (FastForward's blocks) the positions before the last prompt's last block — its blocks
/// 1.. ran sparse, but its last block ran dense and the tokens decoded after it one at a time,
/// where a longer prompt reads them in sparse blocks.
#[derive(Default)]
pub(super) struct Cached {
    pub(super) tokens: Vec<u32>,
    pub(super) exact: usize,
}

impl Cached {
    /// The prompt tokens a request for `tokens` keeps from this cache: the common prefix, but at
    /// least two tokens evaluated (a single token runs on the decode path, whose rounding differs
    /// from a prompt batch's); with sparse prefill, no further than the exact positions and cut
    /// to a block boundary, so the rest of the prompt is read in the blocks a fresh read gives it.
    /// The same request then gets the same text whether or not its prefix was cached.
    pub(super) fn reusable(&self, tokens: &[u32], sparse_prefill: bool) -> usize {
        let common =
            self.tokens.iter().zip(tokens).take_while(|(a, b)| a == b).count().min(tokens.len().saturating_sub(2));
        if !sparse_prefill {
            return common;
        }
        let c = common.min(self.exact);
        if c >= PREFILL_BLOCK {
            c / PREFILL_BLOCK * PREFILL_BLOCK
        } else {
            c
        }
    }

    /// Keeps the first `n` tokens.
    pub(super) fn truncate(&mut self, n: usize) {
        self.tokens.truncate(n);
        self.exact = self.exact.min(n);
    }

    /// After a prompt of `n` tokens was read (see the type's docs).
    pub(super) fn prompt_read(&mut self, n: usize, sparse_prefill: bool) {
        self.exact = if sparse_prefill { PREFILL_BLOCK * ((n.max(1) - 1) / PREFILL_BLOCK).max(1) } else { usize::MAX };
    }

    pub(super) fn clear(&mut self) {
        self.tokens.clear();
        self.exact = 0;
    }
}

/// The chunks a prompt's positions `from..n` are read in. With sparse prefill they end on
/// multiples of `size` (a multiple of the block) counted from position 0, so a block never
/// straddles two chunks and the chunks compute what one read of the prompt computes
/// ([`sift_engine::Engine::eval_prompt_part`]); else [`batches`] of `size`.
fn prompt_chunks(from: usize, n: usize, size: usize, sparse_prefill: bool) -> Vec<std::ops::Range<usize>> {
    if !sparse_prefill {
        return batches(n - from, size).into_iter().map(|r| r.start + from..r.end + from).collect();
    }
    let size = (size / PREFILL_BLOCK).max(1) * PREFILL_BLOCK;
    let mut out = Vec::new();
    let mut at = from;
    while at < n {
        let end = ((at / size + 1) * size).min(n);
        out.push(at..end);
        at = end;
    }
    out
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
    use super::batches;

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
}
