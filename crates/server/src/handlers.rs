//! One async fn per endpoint. Generation handlers validate the body, queue a job on the worker and
//! either collect its events into one JSON response or hand them to [`crate::stream`]; a
//! [`CancelGuard`] held by the handler (or the stream) cancels the job when the client goes away.

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::openai::{
    chat_logprobs, check_model, completion_logprobs, parse_body, ChatRequest, CompletionRequest, Endpoint, GenRequest,
    Limits, TokenLogprob,
};
use crate::stream::{sse, usage, CancelGuard, ResponseMeta};
use crate::worker::{Event, Job, Msg, Timings, WorkerHandle};
use crate::ServerConfig;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use sift_model::tokenizer::Tokenizer;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long an admin request waits for the worker (it answers between tokens).
const ADMIN_TIMEOUT: Duration = Duration::from_secs(60);

/// What every handler shares.
pub struct AppState {
    pub worker: WorkerHandle,
    pub metrics: Arc<Metrics>,
    pub cfg: ServerConfig,
    pub limits: Limits,
    /// When the server started (Unix seconds): `created` of the model.
    pub created: u64,
    pub next_id: AtomicU64,
    /// One tokenizer request (`/tokenize`, `/detokenize`) works at a time, as the engine's one
    /// sequence does: eight concurrent 1.8 MB texts no longer take eight times the memory.
    pub tokenizer_gate: tokio::sync::Semaphore,
    /// The request memory (KiB): each request with a body holds its share
    /// ([`crate::router`]'s `request_memory`) from before its body is read until it is answered.
    pub request_memory: Arc<tokio::sync::Semaphore>,
}

/// The bytes of the request memory a request holds ([`crate::router`] puts it in the request's
/// extensions): what its answer may take.
#[derive(Clone, Copy, Debug)]
pub struct RequestShare(pub u64);

impl AppState {
    /// The request memory's capacity in KiB (12 × `--max-body`).
    pub fn request_memory_kib(&self) -> usize {
        usize::try_from(((self.cfg.max_body as u64).saturating_mul(crate::REQUEST_RESERVE_BODIES)) >> 10)
            .unwrap_or(usize::MAX)
            .max(1)
    }
}

/// Bodies past this size give their memory back to the system after the request
/// (`malloc_trim`), so that a burst of large requests does not stay resident.
const TRIM_AFTER_BYTES: usize = 256 << 10;

type S = State<Arc<AppState>>;

/// Unix time in seconds.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Whether an error was caused by a connection's timeout ([`crate::conn::TimedIo`]).
fn timed_out(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut) {
            return true;
        }
        cur = err.source();
    }
    false
}

fn body_bytes(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(limit)
        } else if timed_out(&e) {
            ApiError::timed_out(timeout)
        } else {
            ApiError::invalid(format!("cannot read the request body: {e}"))
        }
    })
}

/// `GET /health`.
pub async fn health(State(s): S) -> Json<Value> {
    Json(json!({"status": "ok", "model": s.cfg.alias, "queued": s.worker.queued()}))
}

/// `GET /v1/models`.
pub async fn models(State(s): S) -> Json<Value> {
    let i = &s.worker.info;
    Json(json!({
        "object": "list",
        "data": [{
            "id": s.cfg.alias, "object": "model", "created": s.created, "owned_by": "sift",
            "meta": {"n_ctx": i.n_ctx, "n_vocab": i.n_vocab, "chat_template": i.has_template, "memory_budget": i.memory},
        }],
    }))
}

/// `GET /metrics` (Prometheus text).
pub async fn metrics(State(s): S) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], s.metrics.render()).into_response()
}

/// Unknown routes: 404 in OpenAI's shape.
pub async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::unknown_route(method.as_str(), uri.path())
}

/// Known route, wrong method: 405.
pub async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::method_not_allowed(method.as_str(), uri.path())
}

/// `POST /v1/completions`.
pub async fn completions(State(s): S, body: Result<Bytes, BytesRejection>) -> Response {
    let r = async {
        let body = body_bytes(body, s.cfg.max_body, s.cfg.timeout)?;
        let req: CompletionRequest = parse_body(&body)?;
        check_model(req.model.as_deref(), &s.cfg.alias, &s.cfg.file_name)?;
        let g = req.validate(&s.limits)?;
        generate(&s, g).await
    }
    .await;
    finish(&s, r)
}

/// `POST /v1/chat/completions`.
pub async fn chat(State(s): S, body: Result<Bytes, BytesRejection>) -> Response {
    let r = async {
        let body = body_bytes(body, s.cfg.max_body, s.cfg.timeout)?;
        let req: ChatRequest = parse_body(&body)?;
        check_model(req.model.as_deref(), &s.cfg.alias, &s.cfg.file_name)?;
        let g = req.validate(&s.limits)?;
        generate(&s, g).await
    }
    .await;
    finish(&s, r)
}

fn finish(s: &AppState, r: Result<Response, ApiError>) -> Response {
    match r {
        Ok(r) => r,
        Err(e) => {
            Metrics::inc(&s.metrics.errors, 1);
            e.into_response()
        }
    }
}

/// One choice's collected events.
#[derive(Default)]
struct Choice {
    n_prompt: usize,
    n_gen: usize,
    echo_text: String,
    text: String,
    logprobs: Vec<TokenLogprob>,
    finish: Option<&'static str>,
    timings: Timings,
}

async fn generate(s: &Arc<AppState>, req: GenRequest) -> Result<Response, ApiError> {
    Metrics::inc(&s.metrics.requests, 1);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let guard = CancelGuard(cancel.clone());
    let n = req.prompts.len();
    let meta = ResponseMeta {
        id: format!(
            "{}-{:x}{:04x}",
            if req.endpoint == Endpoint::Chat { "chatcmpl" } else { "cmpl" },
            now_secs(),
            s.next_id.fetch_add(1, Ordering::Relaxed)
        ),
        created: now_secs(),
        model: s.cfg.alias.clone(),
        endpoint: req.endpoint,
        logprobs: req.logprobs.is_some(),
        include_usage: req.include_usage,
    };
    let stream = req.stream;
    Metrics::inc(&s.metrics.queued, 1);
    if let Err(e) = s.worker.submit(Job { req, events: tx, cancel, received: Instant::now() }) {
        Metrics::dec(&s.metrics.queued);
        return Err(e);
    }
    if stream {
        return match rx.recv().await {
            Some(Event::Error(e)) => Err(e),
            Some(first) => Ok(sse(meta, first, rx, guard).into_response()),
            None => Err(ApiError::shutting_down()),
        };
    }
    let mut choices: Vec<Choice> = (0..n).map(|_| Choice::default()).collect();
    let mut done = 0;
    while done < n {
        match rx.recv().await {
            Some(Event::Prompt { index, n_prompt, echo_text, echo }) => {
                let c = &mut choices[index];
                c.n_prompt = n_prompt;
                c.echo_text = echo_text;
                c.logprobs = echo;
            }
            Some(Event::Text { index, text, logprobs }) => {
                let c = &mut choices[index];
                c.text.push_str(&text);
                c.logprobs.extend(logprobs);
            }
            Some(Event::Done { index, finish, n_gen, timings }) => {
                choices[index].finish = Some(finish);
                choices[index].n_gen = n_gen;
                choices[index].timings = timings;
                done += 1;
            }
            Some(Event::Error(e)) => return Err(e),
            None => return Err(ApiError::shutting_down()),
        }
    }
    drop(guard);
    let n_prompt: usize = choices.iter().map(|c| c.n_prompt).sum();
    let n_gen: usize = choices.iter().map(|c| c.n_gen).sum();
    let timings = Timings::sum(choices.iter().map(|c| &c.timings));
    let body = match meta.endpoint {
        Endpoint::Completions => json!({
            "id": meta.id, "object": "text_completion", "created": meta.created, "model": meta.model,
            "choices": choices.iter().enumerate().map(|(i, c)| json!({
                "index": i,
                "text": format!("{}{}", c.echo_text, c.text),
                "logprobs": if meta.logprobs { completion_logprobs(&c.logprobs, 0) } else { Value::Null },
                "finish_reason": c.finish,
            })).collect::<Vec<_>>(),
            "usage": usage(n_prompt, n_gen),
            "timings": timings,
        }),
        Endpoint::Chat => json!({
            "id": meta.id, "object": "chat.completion", "created": meta.created, "model": meta.model,
            "choices": choices.iter().enumerate().map(|(i, c)| json!({
                "index": i,
                "message": {"role": "assistant", "content": c.text},
                "logprobs": if meta.logprobs { json!({"content": chat_logprobs(&c.logprobs)}) } else { Value::Null },
                "finish_reason": c.finish,
            })).collect::<Vec<_>>(),
            "usage": usage(n_prompt, n_gen),
            "timings": timings,
        }),
    };
    Ok(Json(body).into_response())
}

/// `POST /admin/memory {"budget": "300MB"}`: a new budget, applied between tokens.
pub async fn admin_memory(State(s): S, body: Result<Bytes, BytesRejection>) -> Response {
    let r = async {
        let body = body_bytes(body, s.cfg.max_body, s.cfg.timeout)?;
        let v: Value = parse_body(&body)?;
        let spec = match v.get("budget") {
            Some(Value::String(b)) => b.clone(),
            Some(Value::Number(b)) => b.to_string(),
            _ => {
                return Err(ApiError::invalid_param(
                    "budget",
                    "send {\"budget\": \"300MB\"} (bytes with K/M/G, or a percentage of the model)",
                ))
            }
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        s.worker.send(Msg::SetBudget { spec, reply: tx })?;
        match tokio::time::timeout(ADMIN_TIMEOUT, rx).await {
            Ok(Ok(r)) => r.map(|v| Json(v).into_response()),
            Ok(Err(_)) => Err(ApiError::internal("the worker thread has stopped")),
            Err(_) => Err(ApiError::internal("the worker did not answer in time")),
        }
    }
    .await;
    r.unwrap_or_else(IntoResponse::into_response)
}

/// `GET /slots`: the processing slots as llama-server lists them (`id`, `n_ctx`,
/// `is_processing`), with sift's `n_past` (tokens in the slot's KV cache, reused by a prompt
/// that starts with them) and the requests queued for a free slot.
pub async fn slots(State(s): S) -> Response {
    let (tx, rx) = tokio::sync::oneshot::channel();
    if let Err(e) = s.worker.send(Msg::Stats { reply: tx }) {
        return e.into_response();
    }
    match tokio::time::timeout(ADMIN_TIMEOUT, rx).await {
        Ok(Ok(v)) => {
            let mut slots = v["slots"].as_array().cloned().unwrap_or_default();
            for slot in &mut slots {
                slot["n_queued"] = v["queued"].clone();
            }
            Json(slots).into_response()
        }
        Ok(Err(_)) => ApiError::internal("the worker thread has stopped").into_response(),
        Err(_) => ApiError::internal("the worker did not answer in time").into_response(),
    }
}

/// `GET /admin/stats`: cache and I/O counters, the plan, the budget, resident memory.
pub async fn admin_stats(State(s): S) -> Response {
    let (tx, rx) = tokio::sync::oneshot::channel();
    if let Err(e) = s.worker.send(Msg::Stats { reply: tx }) {
        return e.into_response();
    }
    match tokio::time::timeout(ADMIN_TIMEOUT, rx).await {
        Ok(Ok(mut v)) => {
            v["model"] = s.cfg.alias.clone().into();
            v["metrics"] = json!({
                "requests": s.metrics.requests.load(Ordering::Relaxed),
                "errors": s.metrics.errors.load(Ordering::Relaxed),
                "cancelled": s.metrics.cancelled.load(Ordering::Relaxed),
                "prompt_tokens": s.metrics.prompt_tokens.load(Ordering::Relaxed),
                "generated_tokens": s.metrics.generated_tokens.load(Ordering::Relaxed),
            });
            Json(v).into_response()
        }
        Ok(Err(_)) => ApiError::internal("the worker thread has stopped").into_response(),
        Err(_) => ApiError::internal("the worker did not answer in time").into_response(),
    }
}

/// Most tokens `/detokenize` takes in one request.
const MAX_DETOKENIZE: usize = 1 << 20;

/// The text of the first of `keys` present in `v` (vLLM and llama-server name fields differently).
fn field<'a>(v: &'a Value, keys: &[&str]) -> Option<&'a Value> {
    keys.iter().find_map(|k| v.get(*k))
}

/// `POST /tokenize {"prompt": "text", "add_special_tokens": false, "with_pieces": false}`: the
/// model's token ids for a text (vLLM's and llama-server's shape: `content` / `add_special` are
/// accepted too). Special-token text such as `<|im_end|>` becomes its id, as both servers do.
/// `add_special_tokens` (default false, llama-server's default) prepends BOS when the model adds
/// one. Answers `{"tokens": [...], "count": n, "max_model_len": n_ctx}`; with `with_pieces`, each
/// token is `{"id", "piece"}`.
///
/// The answer is written as text, its length known before it is made: it must fit the share of
/// the request memory the request holds (until its last byte is sent), or the request gets 413
/// naming the limit. (Built as a JSON value per token, a 2 MB text's pieces took ~490 MB.)
pub async fn tokenize(
    State(s): S,
    share: Option<axum::Extension<RequestShare>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r = async {
        // One tokenizer request at a time (the others wait with their bodies, at most
        // --max-body each): its work is the budget's request reserve.
        let _permit = s.tokenizer_gate.acquire().await.map_err(|_| ApiError::shutting_down())?;
        let body = body_bytes(body, s.cfg.max_body, s.cfg.timeout)?;
        let large = body.len() > TRIM_AFTER_BYTES;
        let v: Value = parse_body(&body)?;
        drop(body);
        let text = match field(&v, &["prompt", "content"]) {
            Some(Value::String(t)) => t.clone(),
            _ => return Err(ApiError::invalid_param("prompt", "send {\"prompt\": \"text to tokenize\"}")),
        };
        let flag = |keys: &[&str], param: &str| match field(&v, keys) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(ApiError::invalid_param(param, format!("{param} must be true or false"))),
        };
        let add_special = flag(&["add_special_tokens", "add_special"], "add_special_tokens")?;
        let with_pieces = flag(&["with_pieces"], "with_pieces")?;
        drop(v);
        let tok = s.worker.info.tok.clone();
        // Long texts take milliseconds: off the async threads.
        let ids = tokio::task::spawn_blocking(move || tok.encode(&text, add_special, true))
            .await
            .map_err(|e| ApiError::internal(format!("tokenizer task failed: {e}")))?
            .map_err(|e| ApiError::invalid_param("prompt", e.to_string()))?;
        let tok = &s.worker.info.tok;
        let n_ctx = s.worker.info.n_ctx;
        let pieces = with_pieces.then_some(&**tok);
        let len = tokens_answer_len(&ids, pieces, n_ctx);
        // The answer and the ids beside it, within the request's share (what is left of it
        // after the parsing, which is over).
        let limit = share.map_or(u64::MAX, |e| e.0 .0);
        let need = len as u64 + 4 * ids.len() as u64;
        if need > limit {
            return Err(ApiError::too_large_answer(format!(
                "the answer for these {} tokens{} would take {:.1} MB, more than this request's {:.1} MB share of the server's request memory (12 x --max-body); send the text in parts{}",
                ids.len(),
                if with_pieces { " with their pieces" } else { "" },
                need as f64 / 1e6,
                limit as f64 / 1e6,
                if with_pieces { ", or leave out with_pieces" } else { "" }
            )));
        }
        let out = tokens_answer(&ids, pieces, n_ctx, len);
        drop(ids);
        if large {
            sift_session::budget::trim_heap();
        }
        Ok(([(header::CONTENT_TYPE, "application/json")], out).into_response())
    }
    .await;
    r.unwrap_or_else(IntoResponse::into_response)
}

/// `/tokenize`'s answer, written straight into a string of exactly `len` bytes
/// ([`tokens_answer_len`]): `{"tokens":[1,2],...}`, or with pieces `{"tokens":[{"id":1,"piece":"a"},...],...}`.
fn tokens_answer(ids: &[u32], pieces: Option<&Tokenizer>, n_ctx: usize, len: usize) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(len);
    out.push_str("{\"tokens\":[");
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        match pieces {
            Some(p) => {
                let _ = write!(out, "{{\"id\":{id},\"piece\":");
                push_json_str(&mut out, &String::from_utf8_lossy(p.piece(*id)));
                out.push('}');
            }
            None => {
                let _ = write!(out, "{id}");
            }
        }
    }
    let _ = write!(out, "],\"count\":{},\"max_model_len\":{n_ctx}}}", ids.len());
    debug_assert_eq!(out.len(), len, "the answer's length was counted right");
    out
}

/// The length of [`tokens_answer`]'s string, counted without making it.
fn tokens_answer_len(ids: &[u32], pieces: Option<&Tokenizer>, n_ctx: usize) -> usize {
    let digits = |v: u64| v.checked_ilog10().map_or(1, |d| d as usize + 1);
    let mut len = "{\"tokens\":[".len() + ids.len().saturating_sub(1);
    for &id in ids {
        len += digits(id as u64);
        if let Some(p) = pieces {
            len += "{\"id\":,\"piece\":}".len() + json_str_len(&String::from_utf8_lossy(p.piece(id)));
        }
    }
    len + "],\"count\":,\"max_model_len\":}".len() + digits(ids.len() as u64) + digits(n_ctx as u64)
}

/// How JSON writes a character inside a string: its escape, if it needs one.
fn json_escape(c: char) -> Option<&'static str> {
    Some(match c {
        '"' => "\\\"",
        '\\' => "\\\\",
        '\n' => "\\n",
        '\r' => "\\r",
        '\t' => "\\t",
        '\u{08}' => "\\b",
        '\u{0c}' => "\\f",
        c if (c as u32) < 0x20 => "\\u00",
        _ => return None,
    })
}

/// Appends `s` as a JSON string (quotes and escapes).
fn push_json_str(out: &mut String, s: &str) {
    use std::fmt::Write;
    out.push('"');
    for c in s.chars() {
        match json_escape(c) {
            Some("\\u00") => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            Some(e) => out.push_str(e),
            None => out.push(c),
        }
    }
    out.push('"');
}

/// The bytes [`push_json_str`] appends for `s`.
fn json_str_len(s: &str) -> usize {
    2 + s
        .chars()
        .map(|c| match json_escape(c) {
            Some("\\u00") => 6,
            Some(e) => e.len(),
            None => c.len_utf8(),
        })
        .sum::<usize>()
}

/// `POST /detokenize {"tokens": [ids]}`: the text of token ids, special tokens included.
/// Answers `{"prompt": text}` (vLLM) with the same text under `content` (llama-server).
pub async fn detokenize(State(s): S, body: Result<Bytes, BytesRejection>) -> Response {
    let r = async {
        // One tokenizer request at a time (the others wait with their bodies, at most
        // --max-body each): its work is the budget's request reserve.
        let _permit = s.tokenizer_gate.acquire().await.map_err(|_| ApiError::shutting_down())?;
        let body = body_bytes(body, s.cfg.max_body, s.cfg.timeout)?;
        let v: Value = parse_body(&body)?;
        let bad = || ApiError::invalid_param("tokens", "send {\"tokens\": [token ids]}");
        let arr = v.get("tokens").and_then(Value::as_array).ok_or_else(bad)?;
        if arr.len() > MAX_DETOKENIZE {
            return Err(ApiError::invalid_param("tokens", format!("at most {MAX_DETOKENIZE} tokens per request")));
        }
        let n_vocab = s.worker.info.n_vocab;
        let mut ids = Vec::with_capacity(arr.len());
        for x in arr {
            let id = x.as_u64().ok_or_else(bad)?;
            if id >= n_vocab as u64 {
                return Err(ApiError::invalid_param(
                    "tokens",
                    format!("token id {id} is outside the vocabulary of {n_vocab} tokens"),
                ));
            }
            ids.push(id as u32);
        }
        let text = String::from_utf8_lossy(&s.worker.info.tok.decode_bytes(&ids, false)).into_owned();
        Ok(Json(json!({"prompt": text, "content": text})).into_response())
    }
    .await;
    r.unwrap_or_else(IntoResponse::into_response)
}

/// `GET /tokenizer_info` (vLLM's shape, which lm-eval's `tokenizer_backend=remote` reads): the
/// special tokens' text, the chat template, the context length.
pub async fn tokenizer_info(State(s): S) -> Json<Value> {
    let i = &s.worker.info;
    let tok = &i.tok;
    let text = |id: Option<u32>| id.map(|id| tok.token_str(id).to_string());
    Json(json!({
        "tokenizer_class": format!("sift-gguf-{}", tok.model_name()),
        "bos_token": text(tok.bos()),
        "eos_token": text(tok.eos()),
        "pad_token": text(tok.pad()),
        "unk_token": text(tok.unk()),
        "add_bos_token": tok.add_bos(),
        "add_eos_token": tok.add_eos(),
        "vocab_size": tok.vocab_size(),
        "model_max_length": i.n_ctx,
        "chat_template": i.chat_template,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/tokenize`'s answer, written by hand, is the JSON serde reads back — the ids, each
    /// piece as the tokenizer's bytes read lossily, the counts — and exactly as long as counted
    /// before it was made (its size is checked against the request's share with that count).
    /// Real SmolLM2 tokenizer; text with quotes, backslashes, control characters, multi-byte
    /// characters split over tokens.
    #[test]
    fn the_tokens_answer_is_json_of_the_length_counted() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
        assert!(path.exists(), "{} missing: run scripts/fetch-model.sh first", path.display());
        let model = sift_model::Model::load(&path).unwrap();
        let tok = Tokenizer::from_gguf(&model.file.gguf).unwrap();
        let text = "He said \"hi\\there\"\n\tcontrol \u{1} \u{1f} bell \u{7}; 漢字 and 🦀 crabs, é.";
        let ids = tok.encode(text, true, true).unwrap();
        for pieces in [None, Some(&tok)] {
            let len = tokens_answer_len(&ids, pieces, 8192);
            let out = tokens_answer(&ids, pieces, 8192, len);
            assert_eq!(out.len(), len);
            let v: Value = serde_json::from_str(&out).unwrap();
            assert_eq!(v["count"], ids.len());
            assert_eq!(v["max_model_len"], 8192);
            let got = v["tokens"].as_array().unwrap();
            assert_eq!(got.len(), ids.len());
            for (g, &id) in got.iter().zip(&ids) {
                match pieces {
                    None => assert_eq!(g.as_u64(), Some(id as u64)),
                    Some(t) => {
                        assert_eq!(g["id"].as_u64(), Some(id as u64));
                        assert_eq!(g["piece"].as_str().unwrap(), String::from_utf8_lossy(t.piece(id)));
                    }
                }
            }
        }
        // No tokens at all.
        let len = tokens_answer_len(&[], Some(&tok), 7);
        assert_eq!(tokens_answer(&[], Some(&tok), 7, len), "{\"tokens\":[],\"count\":0,\"max_model_len\":7}");
    }
}
