//! The axum [`Router`]: routes to [`crate::handlers`], the API-key check (`Authorization: Bearer
//! KEY` on every route but `/health` when `--api-key` is set), the request-body limit, the
//! request time limit (`--timeout`: 408), the request memory (a request's body, parsing,
//! tokenizing and response held to a share of the budget's request reserve), and OpenAI-shaped
//! 404 / 405 for unknown routes and methods.

use crate::error::ApiError;
use crate::handlers::{self, AppState, RequestShare};
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_LENGTH};
use axum::http::Method;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http_body_util::BodyExt;
use std::sync::Arc;

/// Compares without stopping at the first different byte.
fn same_key(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn auth(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &s.cfg.api_key {
        let given = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if !given.is_some_and(|g| same_key(g.as_bytes(), key.as_bytes())) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// Working memory per body byte: `/tokenize` measured ~9 × its body (the text, the parsed JSON,
/// the tokenizer's pieces, the ids and their JSON); the other routes parse and keep the body.
const TOKENIZE_BYTES_PER_BODY_BYTE: u64 = 10;
const OTHER_BYTES_PER_BODY_BYTE: u64 = 4;
/// The least a request with a body holds (KiB): its headers, the response.
const MIN_REQUEST_KIB: u64 = 64;

/// A request with a body waits, before the body is read, until its share of the request memory
/// is free: its declared length (at most `--max-body`) times what its route makes of each byte.
/// The share is held until the response head is sent — for the tokenizer's routes, whose answers
/// are as large as their texts, until the answer's last byte is sent — so concurrent requests
/// never take more than the reserve kept in the budget for them (`sift serve --memory`). The
/// handler finds the share's size in the request's extensions ([`RequestShare`]): what its
/// answer may take.
async fn request_memory(State(s): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    if req.method() == Method::GET {
        return next.run(req).await;
    }
    let max_body = s.cfg.max_body as u64;
    let declared = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    let body = declared.unwrap_or(max_body).min(max_body);
    let tokenizer = req.uri().path().ends_with("tokenize");
    let per_byte = if tokenizer { TOKENIZE_BYTES_PER_BODY_BYTE } else { OTHER_BYTES_PER_BODY_BYTE };
    let capacity = s.request_memory_kib();
    let kib = ((body * per_byte) >> 10).max(MIN_REQUEST_KIB).min(capacity as u64) as u32;
    let Ok(share) = s.request_memory.clone().acquire_many_owned(kib).await else {
        return ApiError::shutting_down().into_response();
    };
    req.extensions_mut().insert(RequestShare(u64::from(kib) << 10));
    let resp = next.run(req).await;
    if !tokenizer {
        return resp;
    }
    // The share goes with the body: released when it is sent (or dropped with the connection),
    // and the heap trimmed then.
    let held = HeldShare(Some(share));
    resp.map(|body| {
        Body::new(body.map_frame(move |frame| {
            let _held = &held;
            frame
        }))
    })
}

/// A tokenizer request's share of the request memory, held by its answer's body: given back,
/// and the heap trimmed of the answer, when the body is dropped.
struct HeldShare(Option<tokio::sync::OwnedSemaphorePermit>);

impl Drop for HeldShare {
    fn drop(&mut self) {
        // The body (and the answer it held) goes first, then the share.
        sift_session::budget::trim_heap();
        self.0.take();
    }
}

/// The request time limit (`--timeout`): the request's handling, body included, up to the
/// response head; a streamed body goes on after it (bounded by `max_tokens`).
async fn time_limit(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let limit = s.cfg.timeout;
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(r) => r,
        Err(_) => ApiError::timed_out(limit).into_response(),
    }
}

/// The server's routes.
pub fn build(state: Arc<AppState>) -> Router {
    let max_body = state.cfg.max_body;
    let api = Router::new()
        .route("/v1/completions", post(handlers::completions))
        .route("/completions", post(handlers::completions))
        .route("/v1/chat/completions", post(handlers::chat))
        .route("/chat/completions", post(handlers::chat))
        .route("/v1/models", get(handlers::models))
        .route("/models", get(handlers::models))
        .route("/tokenize", post(handlers::tokenize))
        .route("/detokenize", post(handlers::detokenize))
        .route("/tokenizer_info", get(handlers::tokenizer_info))
        .route("/metrics", get(handlers::metrics))
        .route("/admin/memory", post(handlers::admin_memory))
        .route("/admin/stats", get(handlers::admin_stats))
        .route("/slots", get(handlers::slots))
        .route_layer(middleware::from_fn_with_state(state.clone(), request_memory))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    Router::new()
        .route("/health", get(handlers::health))
        .merge(api)
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(middleware::from_fn_with_state(state.clone(), time_limit))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_compare_exactly() {
        assert!(super::same_key(b"abc", b"abc"));
        assert!(!super::same_key(b"abc", b"abd"));
        assert!(!super::same_key(b"abc", b"abcd"));
    }
}
