//! The axum [`Router`]: routes to [`crate::handlers`], the API-key check (`Authorization: Bearer
//! KEY` on every route but `/health` when `--api-key` is set), the request-body limit, the
//! request time limit (`--timeout`: 408), and
//! OpenAI-shaped 404 / 405 for unknown routes and methods.

use crate::error::ApiError;
use crate::handlers::{self, AppState};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
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
