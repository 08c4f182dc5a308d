//! OpenAI request and response shapes (legacy completions and chat completions), and the
//! validation that turns a request into the worker's [`GenRequest`]. Unknown fields are ignored,
//! as OpenAI-compatible servers do; wrong types and out-of-range values are 400 errors that name
//! the parameter.

use crate::error::ApiError;
use serde::Deserialize;
use serde_json::Value;
use sift_engine::SamplerOptions;
use sift_model::chat::ChatMessage;

/// Most prompts one completions request may carry (an array prompt is answered as one choice each).
pub const MAX_PROMPTS: usize = 64;
/// Most `logprobs` / `top_logprobs` alternatives per token.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// `stop`: one string or a list.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Deserialize, Debug, Clone, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The sampling fields both endpoints share (OpenAI's names, `presence_penalty` and
/// `frequency_penalty` applied as llama.cpp does over the last 64 tokens; `top_k`, `min_p`,
/// `repeat_penalty` as llama-server accepts them).
#[derive(Deserialize, Debug, Default)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub n: Option<i64>,
    /// Keep generating after the end-of-text token (llama-server's extension).
    #[serde(default)]
    pub ignore_eos: bool,
}

/// `POST /v1/completions`.
#[derive(Deserialize, Debug)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: Option<Value>,
    pub max_tokens: Option<i64>,
    pub logprobs: Option<i64>,
    #[serde(default)]
    pub echo: bool,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// A chat message as clients send it: `content` a string, null, or a list of text parts.
#[derive(Deserialize, Debug)]
pub struct InMessage {
    pub role: String,
    #[serde(default)]
    pub content: Value,
}

/// `POST /v1/chat/completions`.
#[derive(Deserialize, Debug)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<InMessage>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<i64>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// What the worker tokenizes.
#[derive(Clone, Debug)]
pub enum PromptInput {
    /// Completions text: encoded with BOS if the model adds one, special tokens not parsed.
    Text(String),
    /// Token ids, used as given.
    Tokens(Vec<u32>),
    /// A conversation: rendered with the chat template, special tokens parsed.
    Chat(Vec<ChatMessage>),
}

/// Which endpoint a request came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

/// A validated request, as the worker runs it.
#[derive(Clone, Debug)]
pub struct GenRequest {
    pub endpoint: Endpoint,
    /// One per choice (completions may send several prompts; chat sends one conversation).
    pub prompts: Vec<PromptInput>,
    /// Tokens to generate at most per prompt (0: evaluate the prompt only).
    pub max_tokens: usize,
    pub sampler: SamplerOptions,
    pub stop: Vec<String>,
    /// `Some(k)`: return each token's log-probability and the `k` most likely alternatives.
    pub logprobs: Option<usize>,
    /// Completions: return the prompt with the text, and its tokens' log-probabilities.
    pub echo: bool,
    pub stream: bool,
    pub include_usage: bool,
    pub ignore_eos: bool,
}

/// Limits the server enforces on every request.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Most tokens a request may ask to generate (`--max-tokens-limit`).
    pub max_tokens: usize,
}

/// Checks the model name: absent, the served alias, or the served file's name are accepted.
pub fn check_model(asked: Option<&str>, served: &str, file_name: &str) -> Result<(), ApiError> {
    match asked {
        None => Ok(()),
        Some(m) if m.is_empty() || m == served || m == file_name => Ok(()),
        Some(m) => Err(ApiError::unknown_model(m, served)),
    }
}

/// Parses a JSON body into `T`, with 400 errors that say what is wrong.
pub fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("We could not parse the JSON body of your request: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::invalid("The request body must be a JSON object"));
    }
    serde_json::from_value(v).map_err(|e| ApiError::invalid(format!("Invalid request: {e}")))
}

fn sampler(s: &Sampling) -> Result<(SamplerOptions, Vec<String>), ApiError> {
    if let Some(n) = s.n {
        if n != 1 {
            return Err(ApiError::invalid_param("n", format!("n must be 1 (one sequence at a time), got {n}")));
        }
    }
    let temp = s.temperature.unwrap_or(1.0);
    if !temp.is_finite() || !(0.0..=2.0).contains(&temp) {
        return Err(ApiError::invalid_param("temperature", format!("temperature must be between 0 and 2, got {temp}")));
    }
    let top_p = s.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid_param("top_p", format!("top_p must be in (0, 1], got {top_p}")));
    }
    let top_k = s.top_k.unwrap_or(0);
    if top_k < 0 {
        return Err(ApiError::invalid_param("top_k", format!("top_k must be at least 0, got {top_k}")));
    }
    let min_p = s.min_p.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&min_p) {
        return Err(ApiError::invalid_param("min_p", format!("min_p must be between 0 and 1, got {min_p}")));
    }
    let repeat_penalty = s.repeat_penalty.unwrap_or(1.0);
    if !(repeat_penalty.is_finite() && repeat_penalty > 0.0) {
        return Err(ApiError::invalid_param(
            "repeat_penalty",
            format!("repeat_penalty must be positive, got {repeat_penalty}"),
        ));
    }
    let penalty = |v: Option<f32>, param: &str| match v.unwrap_or(0.0) {
        x if x.is_finite() && (-2.0..=2.0).contains(&x) => Ok(x),
        x => Err(ApiError::invalid_param(param, format!("{param} must be between -2 and 2, got {x}"))),
    };
    let presence_penalty = penalty(s.presence_penalty, "presence_penalty")?;
    let frequency_penalty = penalty(s.frequency_penalty, "frequency_penalty")?;
    let stop = match &s.stop {
        None => Vec::new(),
        Some(Stop::One(x)) => vec![x.clone()],
        Some(Stop::Many(v)) => v.clone(),
    };
    if stop.len() > 16 {
        return Err(ApiError::invalid_param("stop", "at most 16 stop sequences"));
    }
    let stop = stop.into_iter().filter(|x| !x.is_empty()).collect();
    Ok((
        SamplerOptions {
            temp,
            top_k: top_k as usize,
            top_p,
            min_p,
            repeat_penalty,
            presence_penalty,
            frequency_penalty,
            repeat_last_n: 64,
            seed: s.seed.map(|x| x as u64),
        },
        stop,
    ))
}

fn max_tokens(v: Option<i64>, default: usize, limits: &Limits, param: &str) -> Result<usize, ApiError> {
    match v {
        None => Ok(default.min(limits.max_tokens)),
        Some(n) if n < 0 => Err(ApiError::invalid_param(param, format!("{param} must be at least 0, got {n}"))),
        Some(n) if n as u64 > limits.max_tokens as u64 => Err(ApiError::invalid_param(
            param,
            format!("{param} is {n}, over this server's limit of {} (--max-tokens-limit)", limits.max_tokens),
        )),
        Some(n) => Ok(n as usize),
    }
}

fn prompts(v: Option<&Value>) -> Result<Vec<PromptInput>, ApiError> {
    let bad = || {
        ApiError::invalid_param(
            "prompt",
            "prompt must be a string, an array of strings, an array of token ids or an array of arrays of token ids",
        )
    };
    let token = |x: &Value| x.as_u64().and_then(|t| u32::try_from(t).ok());
    let tokens = |a: &[Value]| a.iter().map(token).collect::<Option<Vec<u32>>>();
    let out = match v {
        None => return Err(ApiError::invalid_param("prompt", "prompt is required")),
        Some(Value::String(s)) => vec![PromptInput::Text(s.clone())],
        Some(Value::Array(a)) if a.is_empty() => return Err(ApiError::invalid_param("prompt", "prompt is empty")),
        Some(Value::Array(a)) if a[0].is_number() => vec![PromptInput::Tokens(tokens(a).ok_or_else(bad)?)],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| match x {
                Value::String(s) => Ok(PromptInput::Text(s.clone())),
                Value::Array(t) => tokens(t).map(PromptInput::Tokens).ok_or_else(bad),
                _ => Err(bad()),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err(bad()),
    };
    if out.len() > MAX_PROMPTS {
        return Err(ApiError::invalid_param("prompt", format!("at most {MAX_PROMPTS} prompts per request")));
    }
    Ok(out)
}

impl CompletionRequest {
    /// Validates into a [`GenRequest`].
    pub fn validate(&self, limits: &Limits) -> Result<GenRequest, ApiError> {
        let (sampler, stop) = sampler(&self.sampling)?;
        let prompts = prompts(self.prompt.as_ref())?;
        let logprobs = match self.logprobs {
            None => None,
            Some(k) if k < 0 || k as usize > MAX_TOP_LOGPROBS => {
                return Err(ApiError::invalid_param(
                    "logprobs",
                    format!("logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {k}"),
                ))
            }
            Some(k) => Some(k as usize),
        };
        if self.stream && prompts.len() > 1 {
            return Err(ApiError::invalid_param("prompt", "streaming takes one prompt per request"));
        }
        Ok(GenRequest {
            endpoint: Endpoint::Completions,
            prompts,
            max_tokens: max_tokens(self.max_tokens, 16, limits, "max_tokens")?,
            sampler,
            stop,
            logprobs,
            echo: self.echo,
            stream: self.stream,
            include_usage: self.stream_options.as_ref().is_some_and(|o| o.include_usage),
            ignore_eos: self.sampling.ignore_eos,
        })
    }
}

/// The text of a chat message's `content`: a string, null, or `[{"type": "text", "text": ...}]`.
fn content_text(v: &Value) -> Result<String, ApiError> {
    match v {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    _ => {
                        return Err(ApiError::invalid_param(
                            "messages",
                            "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported",
                        ))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(ApiError::invalid_param("messages", "message content must be a string or an array of text parts")),
    }
}

impl ChatRequest {
    /// Validates into a [`GenRequest`].
    pub fn validate(&self, limits: &Limits) -> Result<GenRequest, ApiError> {
        let (sampler, stop) = sampler(&self.sampling)?;
        if self.messages.is_empty() {
            return Err(ApiError::invalid_param("messages", "messages must not be empty"));
        }
        let mut msgs = Vec::with_capacity(self.messages.len());
        for m in &self.messages {
            if m.role.is_empty() {
                return Err(ApiError::invalid_param("messages", "every message needs a role"));
            }
            msgs.push(ChatMessage::new(m.role.clone(), content_text(&m.content)?));
        }
        let logprobs = match (self.logprobs, self.top_logprobs) {
            (_, Some(k)) if k < 0 || k as usize > MAX_TOP_LOGPROBS => {
                return Err(ApiError::invalid_param(
                    "top_logprobs",
                    format!("top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {k}"),
                ))
            }
            (false, Some(_)) => {
                return Err(ApiError::invalid_param("top_logprobs", "top_logprobs needs logprobs: true"));
            }
            (true, k) => Some(k.unwrap_or(0) as usize),
            (false, None) => None,
        };
        let (mt, param) = match self.max_completion_tokens {
            Some(v) => (Some(v), "max_completion_tokens"),
            None => (self.max_tokens, "max_tokens"),
        };
        Ok(GenRequest {
            endpoint: Endpoint::Chat,
            prompts: vec![PromptInput::Chat(msgs)],
            max_tokens: max_tokens(mt, limits.max_tokens, limits, param)?,
            sampler,
            stop,
            logprobs,
            echo: false,
            stream: self.stream,
            include_usage: self.stream_options.as_ref().is_some_and(|o| o.include_usage),
            ignore_eos: self.sampling.ignore_eos,
        })
    }
}

/// One token's log-probability and its most likely alternatives, as the worker computes them.
#[derive(Clone, Debug)]
pub struct TokenLogprob {
    pub id: u32,
    /// The token's bytes (need not be valid UTF-8 alone).
    pub bytes: Vec<u8>,
    /// `None` for the first token of a prompt (nothing predicts it).
    pub logprob: Option<f32>,
    /// The alternatives: (bytes, log-probability), most likely first.
    pub top: Vec<(Vec<u8>, f32)>,
}

impl TokenLogprob {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

fn lp_value(lp: Option<f32>) -> Value {
    match lp {
        Some(x) if x.is_finite() => Value::from(x as f64),
        Some(_) => Value::from(-9999.0),
        None => Value::Null,
    }
}

/// Legacy completions `logprobs`: `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`;
/// `top_logprobs` holds the k most likely tokens and the chosen one; offsets count bytes of the
/// text from `start`.
pub fn completion_logprobs(toks: &[TokenLogprob], start: usize) -> Value {
    let mut offset = start;
    let mut offsets = Vec::with_capacity(toks.len());
    for t in toks {
        offsets.push(offset);
        offset += t.text().len();
    }
    serde_json::json!({
        "tokens": toks.iter().map(TokenLogprob::text).collect::<Vec<_>>(),
        "token_logprobs": toks.iter().map(|t| lp_value(t.logprob)).collect::<Vec<_>>(),
        "top_logprobs": toks.iter().map(|t| {
            if t.logprob.is_none() {
                return Value::Null;
            }
            let mut m = serde_json::Map::new();
            for (b, lp) in &t.top {
                m.entry(String::from_utf8_lossy(b).into_owned()).or_insert(lp_value(Some(*lp)));
            }
            // OpenAI's legacy shape: the chosen token is always there too (up to k + 1 entries).
            m.entry(t.text()).or_insert(lp_value(t.logprob));
            Value::Object(m)
        }).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

/// Chat `logprobs.content`: `[{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]`.
pub fn chat_logprobs(toks: &[TokenLogprob]) -> Value {
    Value::Array(
        toks.iter()
            .map(|t| {
                serde_json::json!({
                    "token": t.text(),
                    "logprob": lp_value(t.logprob),
                    "bytes": t.bytes,
                    "top_logprobs": t.top.iter().map(|(b, lp)| serde_json::json!({
                        "token": String::from_utf8_lossy(b),
                        "logprob": lp_value(Some(*lp)),
                        "bytes": b,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits { max_tokens: 100 }
    }

    #[test]
    fn completion_requests_validate() {
        let r: CompletionRequest =
            parse_body(br#"{"model":"m","prompt":"hi","max_tokens":5,"temperature":0,"stop":"\n","extra":1}"#).unwrap();
        let g = r.validate(&limits()).unwrap();
        assert_eq!(g.max_tokens, 5);
        assert_eq!(g.stop, vec!["\n".to_string()]);
        assert_eq!(g.sampler.temp, 0.0);
        let r: CompletionRequest = parse_body(br#"{"prompt":[[1,2,3],[4]],"max_tokens":0,"echo":true}"#).unwrap();
        assert_eq!(r.validate(&limits()).unwrap().prompts.len(), 2);
        for bad in [
            &br#"{"prompt":"x","max_tokens":-1}"#[..],
            br#"{"prompt":"x","max_tokens":101}"#,
            br#"{"prompt":"x","n":2}"#,
            br#"{"prompt":"x","temperature":3}"#,
            br#"{"prompt":"x","presence_penalty":2.5}"#,
            br#"{"prompt":"x","frequency_penalty":-3}"#,
            br#"{"prompt":"x","logprobs":50}"#,
            br#"{"prompt":{"a":1}}"#,
            br#"{"prompt":[-1]}"#,
            br#"{"max_tokens":3}"#,
        ] {
            let r: CompletionRequest = parse_body(bad).unwrap();
            let e = r.validate(&limits()).unwrap_err();
            assert_eq!(e.status, 400, "{}", String::from_utf8_lossy(bad));
        }
        assert!(parse_body::<CompletionRequest>(b"{not json").is_err());
        assert!(parse_body::<CompletionRequest>(b"[1]").is_err());
        assert!(parse_body::<CompletionRequest>(br#"{"prompt":"x","max_tokens":"many"}"#).is_err());
    }

    #[test]
    fn chat_requests_validate() {
        let r: ChatRequest = parse_body(
            br#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"logprobs":true,"top_logprobs":2}"#,
        )
        .unwrap();
        let g = r.validate(&limits()).unwrap();
        assert_eq!(g.logprobs, Some(2));
        assert_eq!(g.max_tokens, 100);
        let r: ChatRequest = parse_body(br#"{"messages":[]}"#).unwrap();
        assert!(r.validate(&limits()).is_err());
        assert!(check_model(Some("other"), "m", "m.gguf").is_err());
        assert!(check_model(Some("m.gguf"), "m", "m.gguf").is_ok());
    }

    #[test]
    fn logprob_shapes() {
        let t = |id, s: &str, lp| TokenLogprob { id, bytes: s.as_bytes().to_vec(), logprob: lp, top: vec![] };
        let v = completion_logprobs(&[t(1, "Hello", None), t(2, " world", Some(-1.5))], 0);
        assert_eq!(v["text_offset"], serde_json::json!([0, 5]));
        assert_eq!(v["token_logprobs"][0], Value::Null);
        assert_eq!(v["top_logprobs"][0], Value::Null);
        assert_eq!(v["token_logprobs"][1], serde_json::json!(-1.5));
        // The chosen token joins the top alternatives when it is not among them.
        let chosen = TokenLogprob { top: vec![(b" a".to_vec(), -0.5)], ..t(3, " b", Some(-2.0)) };
        let v = completion_logprobs(&[chosen], 0);
        assert_eq!(v["top_logprobs"][0], serde_json::json!({" a": -0.5, " b": -2.0}));
    }
}
