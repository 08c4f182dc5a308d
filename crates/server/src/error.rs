//! OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the HTTP status
//! each kind of failure gets (400 invalid_request_error, 401 invalid_api_key, 404 model_not_found
//! or unknown route, 413 body too large, 503 queue full (with `Retry-After`) / shutting down, 500 internal).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error returned to a client.
#[derive(Clone, Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: invalid_request_error, authentication_error, not_found_error, server_error, ...
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, code: Option<&'static str>, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), kind, param: None, code }
    }

    /// 400: the request is malformed or asks for something impossible.
    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", None, message)
    }

    /// 400 naming the offending parameter.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        ApiError { param: Some(param.to_string()), ..ApiError::invalid(message) }
    }

    /// 400 with `code: context_length_exceeded`.
    pub fn context_length(message: impl Into<String>) -> Self {
        ApiError { code: Some("context_length_exceeded"), param: Some("messages".into()), ..ApiError::invalid(message) }
    }

    /// 401: missing or wrong API key.
    pub fn unauthorized() -> Self {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            Some("invalid_api_key"),
            "Incorrect API key provided: send it as 'Authorization: Bearer KEY'",
        )
    }

    /// 404: a model other than the one served.
    pub fn unknown_model(asked: &str, served: &str) -> Self {
        ApiError {
            param: Some("model".into()),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("model_not_found"),
                format!("The model '{asked}' does not exist; this server serves '{served}'"),
            )
        }
    }

    /// 404: no such route.
    pub fn unknown_route(method: &str, path: &str) -> Self {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("unknown_url"),
            format!("Unknown request URL: {method} {path}"),
        )
    }

    /// 405: the route exists but not with this method.
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            Some("method_not_allowed"),
            format!("{path} does not accept {method}"),
        )
    }

    /// 413: the request body is over the limit.
    /// 413 for an answer larger than the request's share of the request memory.
    pub fn too_large_answer(msg: String) -> Self {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", Some("response_too_large"), msg)
    }

    pub fn too_large(limit: usize) -> Self {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            Some("request_too_large"),
            format!("The request body is larger than the server's limit of {limit} bytes (--max-body)"),
        )
    }

    /// 408: the request took longer than the server's time limit.
    pub fn timed_out(limit: std::time::Duration) -> Self {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "server_error",
            Some("timeout"),
            format!("The request took longer than the server's limit of {:.0} s (--timeout)", limit.as_secs_f64()),
        )
    }

    /// 503: the request queue is full.
    pub fn queue_full(n: usize) -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            Some("queue_full"),
            format!("The server is busy: {n} requests are already queued (--max-queue); retry later"),
        )
    }

    /// 503: the server is shutting down.
    pub fn shutting_down() -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            Some("shutting_down"),
            "The server is shutting down",
        )
    }

    /// 500: something failed inside the server.
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", None, message)
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.status)
    }
}

/// Seconds a client told the queue is full waits before it retries (`Retry-After`).
pub const RETRY_AFTER_SECS: u32 = 1;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.code == Some("queue_full") {
            // A load balancer or client backs off, then retries (here or on another replica).
            let retry = [(axum::http::header::RETRY_AFTER, RETRY_AFTER_SECS.to_string())];
            return (self.status, retry, axum::Json(self.body())).into_response();
        }
        (self.status, axum::Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_says_when_to_retry() {
        let r = ApiError::queue_full(4).into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[axum::http::header::RETRY_AFTER], RETRY_AFTER_SECS.to_string().as_str());
        let r = ApiError::shutting_down().into_response();
        assert!(r.headers().get(axum::http::header::RETRY_AFTER).is_none());
    }
}
