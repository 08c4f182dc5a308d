//! Server-sent events for `"stream": true`: one `data:` chunk per piece of text (OpenAI's
//! `text_completion` / `chat.completion.chunk` shapes), a final chunk with `finish_reason`, an
//! optional usage chunk, then `data: [DONE]`. An error inside a stream is sent as a JSON `data:`
//! event (`{"error": {...}}`), then `[DONE]`. Dropping the stream (the client went away) drops the
//! [`CancelGuard`], which tells the worker to stop between tokens.

use crate::openai::{chat_logprobs, completion_logprobs, Endpoint};
use crate::worker::Event;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::Stream;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedReceiver;

/// Sets the job's cancel flag when dropped: the handler or the stream that owned it is gone.
pub struct CancelGuard(pub Arc<AtomicBool>);

impl Drop for CancelGuard {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// What every chunk of one response repeats.
#[derive(Clone, Debug)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub endpoint: Endpoint,
    pub logprobs: bool,
    pub include_usage: bool,
}

impl ResponseMeta {
    /// A chunk of a streamed completion or chat completion.
    pub fn chunk(&self, text: Option<&str>, role: bool, logprobs: Option<Value>, finish: Option<&str>) -> Value {
        match self.endpoint {
            Endpoint::Completions => json!({
                "id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "text": text.unwrap_or(""), "logprobs": logprobs, "finish_reason": finish}],
            }),
            Endpoint::Chat => {
                let mut delta = serde_json::Map::new();
                if role {
                    delta.insert("role".into(), "assistant".into());
                }
                if let Some(t) = text {
                    delta.insert("content".into(), t.into());
                }
                json!({
                    "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                    "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
                })
            }
        }
    }
}

/// Usage numbers in OpenAI's shape.
pub fn usage(n_prompt: usize, n_gen: usize) -> Value {
    json!({"prompt_tokens": n_prompt, "completion_tokens": n_gen, "total_tokens": n_prompt + n_gen})
}

struct State {
    meta: ResponseMeta,
    first: Option<Event>,
    rx: UnboundedReceiver<Event>,
    out: VecDeque<SseEvent>,
    finished: bool,
    n_prompt: usize,
    /// Bytes of text sent so far (for `text_offset`).
    offset: usize,
    _guard: CancelGuard,
}

fn data(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

impl State {
    fn logprobs(&mut self, toks: &[crate::openai::TokenLogprob]) -> Option<Value> {
        if !self.meta.logprobs {
            return None;
        }
        Some(match self.meta.endpoint {
            Endpoint::Completions => completion_logprobs(toks, self.offset),
            Endpoint::Chat => json!({"content": chat_logprobs(toks)}),
        })
    }

    fn on(&mut self, ev: Option<Event>) {
        match ev {
            Some(Event::Prompt { n_prompt, echo_text, echo, .. }) => {
                self.n_prompt = n_prompt;
                match self.meta.endpoint {
                    Endpoint::Chat => {
                        let c = self.meta.chunk(Some(""), true, None, None);
                        self.out.push_back(data(&c));
                    }
                    Endpoint::Completions if !echo_text.is_empty() || !echo.is_empty() => {
                        let lp = self.logprobs(&echo);
                        let c = self.meta.chunk(Some(&echo_text), false, lp, None);
                        self.offset += echo_text.len();
                        self.out.push_back(data(&c));
                    }
                    Endpoint::Completions => {}
                }
            }
            Some(Event::Text { text, logprobs, .. }) => {
                let lp = self.logprobs(&logprobs);
                let c = self.meta.chunk(Some(&text), false, lp, None);
                self.offset += text.len();
                self.out.push_back(data(&c));
            }
            Some(Event::Done { finish, n_gen, timings, .. }) => {
                let text = (self.meta.endpoint == Endpoint::Completions).then_some("");
                let mut c = self.meta.chunk(text, false, None, Some(finish));
                // As llama-server: the last chunk carries the timings.
                c["timings"] = serde_json::to_value(&timings).unwrap_or_default();
                self.out.push_back(data(&c));
                if self.meta.include_usage {
                    let u = json!({
                        "id": self.meta.id, "created": self.meta.created, "model": self.meta.model,
                        "object": if self.meta.endpoint == Endpoint::Chat { "chat.completion.chunk" } else { "text_completion" },
                        "choices": [], "usage": usage(self.n_prompt, n_gen),
                    });
                    self.out.push_back(data(&u));
                }
                self.done();
            }
            Some(Event::Error(e)) => {
                self.out.push_back(data(&e.body()));
                self.done();
            }
            None => {
                // The worker dropped the job without finishing it (cancelled).
                let e = crate::error::ApiError::internal("the request was cancelled before it finished");
                self.out.push_back(data(&e.body()));
                self.done();
            }
        }
    }

    fn done(&mut self) {
        self.out.push_back(SseEvent::default().data("[DONE]"));
        self.finished = true;
    }
}

/// The SSE response for a job whose first event (`first`, not an error) already arrived.
pub fn sse(
    meta: ResponseMeta,
    first: Event,
    rx: UnboundedReceiver<Event>,
    guard: CancelGuard,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let st = State {
        meta,
        first: Some(first),
        rx,
        out: VecDeque::new(),
        finished: false,
        n_prompt: 0,
        offset: 0,
        _guard: guard,
    };
    let stream = futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(e) = st.out.pop_front() {
                return Some((Ok(e), st));
            }
            if st.finished {
                return None;
            }
            let ev = match st.first.take() {
                Some(e) => Some(e),
                None => st.rx.recv().await,
            };
            st.on(ev);
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}
