//! `sift serve`: the OpenAI-compatible HTTP server (crates/server). The server opens the same
//! `sift_session::Session` `generate` opens, so every memory, sparsity and policy flag works here
//! too; this module only turns flags into a `ServerConfig`.

use crate::args::ModelArgs;
use clap::Args;
use sift_session::{MemoryOptions, SparsityOptions};
use std::time::Duration;

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub sparsity: SparsityOptions,
    #[command(flatten)]
    pub memory: MemoryOptions,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on (loopback by default; 0.0.0.0 exposes the server to the network)
    #[arg(long = "host", default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the listening line says which)
    #[arg(long = "port", default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// Model name clients use (default: the model file's stem)
    #[arg(long = "alias")]
    pub alias: Option<String>,
    /// Requests that may wait for the worker; more get 503
    #[arg(long = "max-queue", default_value_t = 16, value_parser = sift_session::ranges::count_in::<1, 65536>)]
    pub max_queue: usize,
    /// Most tokens one request may generate (max_tokens above it is a 400)
    #[arg(long = "max-tokens-limit", default_value_t = 2048, value_parser = sift_session::ranges::count_in::<1, { sift_session::ranges::MAX_CTX }>)]
    pub max_tokens_limit: usize,
    /// Largest request body (bytes, K/M/G suffixes); larger gets 413
    #[arg(long = "max-body", default_value = "2M")]
    pub max_body: String,
    /// Seconds in-flight requests may take to finish after SIGINT/SIGTERM before they are cancelled
    #[arg(long = "shutdown-grace", default_value_t = 5.0, value_parser = sift_session::ranges::seconds)]
    pub grace: f64,
    /// Seconds a connection may make no progress reading or writing before it is closed, and a
    /// request may take before it gets 408 (llama-server's -to / --timeout)
    #[arg(long = "timeout", default_value_t = 600, value_parser = sift_session::ranges::count_in::<1, 86400>)]
    pub timeout: usize,
    /// Requests served at once, each in its own slot with its own KV cache (the context -c is
    /// split between them, as llama-server splits it), decoded together in one batch (-np)
    #[arg(long = "parallel", default_value_t = 1, value_parser = sift_session::ranges::count_in::<1, 256>)]
    pub parallel: usize,
    /// With -np: prompt tokens a slot reads per step, beside the others' decoding (at most -b)
    #[arg(long = "ubatch-size", default_value_t = 256, value_parser = sift_session::ranges::count_in::<2, 65536>)]
    pub ubatch: usize,
}

/// The largest `--max-body`.
const MAX_BODY: u64 = 1 << 30;

pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    a.sparsity.validate()?;
    let max_body = sift_session::parse_budget(&a.max_body, 0)
        .map_err(|_| anyhow::anyhow!("bad --max-body '{}': use bytes with an optional K/M/G suffix", a.max_body))?;
    // The budget keeps 12 x --max-body for requests (`sift_server` request memory): a body limit
    // past 1 GiB would reserve more than any machine here has.
    anyhow::ensure!(
        (1..=MAX_BODY).contains(&max_body),
        "--max-body {}: use 1 byte to 1G (the server keeps 12 x --max-body of the memory budget for requests)",
        a.max_body
    );
    let path = a.model.model.clone();
    let file_name = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let alias = a
        .alias
        .clone()
        .unwrap_or_else(|| path.file_stem().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default());
    let cfg = sift_server::ServerConfig {
        host: a.host,
        port: a.port,
        api_key: a.api_key,
        alias,
        file_name,
        max_queue: a.max_queue,
        max_tokens_limit: a.max_tokens_limit,
        max_body: usize::try_from(max_body).unwrap_or(usize::MAX),
        grace: Duration::from_secs_f64(a.grace),
        timeout: Duration::from_secs(a.timeout as u64),
        parallel: a.parallel,
        ubatch: a.ubatch,
        session: sift_session::SessionOptions::from_flags(&path, a.model.engine_options(), &a.sparsity, &a.memory)?,
    };
    sift_server::run(cfg)
}
