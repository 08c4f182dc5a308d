//! `sift serve`: an OpenAI-compatible HTTP server over one sift engine.
//!
//! Endpoints: `POST /v1/completions` and `/v1/chat/completions` (streaming over SSE or not, with
//! log-probabilities and `echo` for lm-eval), `GET /v1/models`, `POST /tokenize`,
//! `POST /detokenize` and `GET /tokenizer_info` (vLLM's and llama-server's shapes; lm-eval's
//! remote tokenizer), `GET /health`, `GET /metrics` (Prometheus), `POST /admin/memory` (change
//! the memory budget live) and `GET /admin/stats`.
//!
//! Layout: [`router`] (routes, API key, body and time limits), [`conn`] (connections that time
//! out when idle or stalled, `--timeout`), [`handlers`] (one fn per endpoint),
//! [`stream`] (SSE), [`openai`] (request/response types and validation), [`worker`] (the one
//! thread that owns the engine and runs one sequence at a time; the tokenizer is shared
//! read-only with the handlers), [`metrics`] (Prometheus text), [`error`] (OpenAI-shaped
//! errors). The engine never runs on the async runtime: handlers talk to the worker thread
//! through channels.

#![forbid(unsafe_code)]

pub mod conn;
pub mod error;
pub mod handlers;
pub mod metrics;
pub mod openai;
pub mod router;
pub mod stream;
pub mod worker;

use anyhow::Context;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

/// Server settings (the CLI's `sift serve` flags).
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub host: String,
    /// 0 picks a free port (the listening line says which).
    pub port: u16,
    /// Required as `Authorization: Bearer KEY` when set.
    pub api_key: Option<String>,
    /// The model name clients use.
    pub alias: String,
    /// The model file's name (also accepted as the model name).
    pub file_name: String,
    /// Requests waiting for the worker at most; more get 503.
    pub max_queue: usize,
    /// Most tokens one request may generate.
    pub max_tokens_limit: usize,
    /// Largest request body, in bytes; larger gets 413.
    pub max_body: usize,
    /// After SIGINT/SIGTERM, how long in-flight requests may finish before they are cancelled.
    pub grace: Duration,
    /// llama-server's `--timeout`: a connection that makes no progress reading or writing for
    /// this long is closed, and a request whose handling takes longer gets 408 ([`conn`]).
    pub timeout: Duration,
    /// llama-server's `-np`: sequences served at once (continuous batching; 1: one at a time).
    pub parallel: usize,
    /// llama-server's `-ub`: prompt tokens a slot reads per step beside the others' decoding.
    pub ubatch: usize,
    /// The model and how to run it: opened on the worker thread exactly as `sift generate`
    /// opens it (every sparsity, memory and policy flag applies).
    pub session: sift_session::SessionOptions,
}

/// Bodies' worth of the budget kept for requests under `--memory` (see [`run`]).
pub const REQUEST_RESERVE_BODIES: u64 = 12;

/// Opens the session on the worker thread, listens, and serves until SIGINT or SIGTERM.
/// Prints `sift: listening on http://HOST:PORT (model NAME)` on stderr when ready.
pub fn run(cfg: ServerConfig) -> anyhow::Result<()> {
    let metrics = Arc::new(metrics::Metrics::default());
    // Under --memory, a request's working memory (its body, the parsed JSON, the tokenizer's work,
    // the response: about 10 × its body, measured on /tokenize) comes from the budget: 12 ×
    // --max-body is kept for it, and requests hold their share of it from before their body is
    // read until they are answered (`router`'s `request_memory`).
    let reserve = (cfg.max_body as u64).saturating_mul(REQUEST_RESERVE_BODIES);
    // Requests' large blocks (bodies, answers) go back to the system when freed, not to a heap
    // that stays resident beside the budget.
    sift_session::budget::release_large_blocks();
    let (worker, thread) =
        worker::spawn(cfg.session.clone(), metrics.clone(), cfg.max_queue, reserve, cfg.parallel, cfg.ubatch)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("sift-http")
        .build()
        .context("cannot start the async runtime")?;
    let grace = cfg.grace;
    let state = Arc::new(handlers::AppState {
        worker: worker.clone(),
        metrics,
        limits: openai::Limits { max_tokens: cfg.max_tokens_limit },
        created: handlers::now_secs(),
        next_id: AtomicU64::new(1),
        tokenizer_gate: tokio::sync::Semaphore::new(1),
        request_memory: Arc::new(tokio::sync::Semaphore::new(
            usize::try_from(reserve >> 10).unwrap_or(usize::MAX).max(1),
        )),
        cfg,
    });
    let result = rt.block_on(async move {
        let addr = format!("{}:{}", state.cfg.host, state.cfg.port);
        let inner = tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("cannot listen on {addr}"))?;
        let listener = conn::TimedListener { inner, timeout: state.cfg.timeout };
        let local = listener.inner.local_addr()?;
        eprintln!("sift: listening on http://{local} (model {})", state.cfg.alias);
        let app = router::build(state.clone());
        let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
        let w = state.worker.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            eprintln!("sift: shutting down: finishing in-flight requests (at most {:.0} s)", grace.as_secs_f64());
            w.close();
            let _ = stop_tx.send(true);
            tokio::time::sleep(grace).await;
            eprintln!("sift: grace period over: cancelling what still runs");
            w.abort();
        });
        let mut stop2 = stop_rx.clone();
        let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
            let _ = stop2.wait_for(|&s| s).await;
        });
        tokio::select! {
            r = serve => r.context("the HTTP server failed"),
            _ = async {
                let _ = stop_rx.wait_for(|&s| s).await;
                tokio::time::sleep(grace + Duration::from_secs(5)).await;
            } => {
                eprintln!("sift: connections still open after the grace period; closing them");
                Ok(())
            }
        }
    });
    worker.abort();
    drop(worker);
    rt.shutdown_timeout(Duration::from_secs(1));
    // The runtime dropped the handlers' channel ends, so the worker's queue is closed.
    let _ = thread.join();
    eprintln!("sift: server stopped");
    result
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {},
                    _ = term.recv() => {},
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
