//! Chat prompts: the model's `tokenizer.chat_template` (a Jinja template from Hugging Face)
//! rendered with minijinja the way Hugging Face transformers and llama-cpp-python render it.
//!
//! The environment matches their jinja2 setup: `trim_blocks` and `lstrip_blocks` on, Python string
//! and dict methods (`.strip()`, `.startswith()`, `.items()`, ... from `minijinja_contrib`'s
//! pycompat), a `raise_exception(msg)` function that fails the render with `msg`, a `tojson`
//! filter that writes JSON like Python's `json.dumps(x, ensure_ascii=False)` (`indent`,
//! `sort_keys`, `separators` and `ensure_ascii` keyword arguments supported), `strftime_now(fmt)`
//! (UTC), and `{% generation %}` / `{% endgeneration %}` markers ignored. The template sees
//! `messages`, `bos_token`, `eos_token`, `add_generation_prompt`, and `tools`, `functions`,
//! `tool_choice`, `function_call` set to none.
//!
//! A model without `tokenizer.chat_template` gets `None` from [`ChatTemplate::from_gguf`];
//! [`ChatTemplate::from_gguf_or_chatml`] then falls back to ChatML ([`CHATML_TEMPLATE`]:
//! `<|im_start|>{role}\n{content}<|im_end|>\n` per message, `<|im_start|>assistant\n` as the
//! generation prompt), which is what llama.cpp also uses when a model has no template.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use sift_gguf::Gguf;

use crate::tokenizer::Tokenizer;

/// The metadata key holding the template.
pub const TEMPLATE_KEY: &str = "tokenizer.chat_template";

/// ChatML, used when a model carries no template.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Errors from loading or rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("chat template metadata '{key}' is invalid: {why}")]
    BadKey { key: String, why: String },
    #[error("chat template does not compile: {0:#}")]
    Compile(Error),
    #[error("chat template failed to render: {0:#}")]
    Render(Error),
    #[error("chat template output passed {limit} bytes for {input} bytes of messages (a template that loops or grows without end); check the model's template or pass another")]
    TooLong { limit: usize, input: usize },
}

impl ChatError {
    /// A template that runs out of fuel or writes past its output limit (loops or grows without
    /// end): unusable, whatever the messages.
    pub fn is_runaway(&self) -> bool {
        match self {
            ChatError::TooLong { .. } => true,
            ChatError::Render(e) => e.kind() == ErrorKind::OutOfFuel,
            _ => false,
        }
    }
}

/// Template instructions one rendering may run (minijinja's fuel): real templates use a few
/// hundred per message; a template that loops without end stops here with an error.
pub const TEMPLATE_FUEL: u64 = 20_000_000;

/// The most a rendering may write: 4 × the messages' bytes + 1 MiB (real templates add tens of
/// bytes per message).
fn output_limit(input: usize) -> usize {
    input.saturating_mul(4).saturating_add(1 << 20)
}

/// The most a rendering may allocate, net, on its thread: 8 × the messages' bytes + 64 MiB
/// (the messages are copied once into the template's values, the output is bounded by
/// [`output_limit`], and real templates hold a message's worth of temporaries). Past it the
/// process ends with [`MEMORY_MESSAGE`] (`sift_alloc`: a failed allocation cannot be recovered).
pub fn memory_limit(input: usize) -> usize {
    input.saturating_mul(8).saturating_add(64 << 20)
}

/// What the user reads when a rendering passes [`memory_limit`].
pub const MEMORY_MESSAGE: &str = "the chat template took more memory than 8 x its messages + 64 MiB while rendering \
     (a template that grows a value without end); check the model's tokenizer.chat_template or use another model";

/// A writer that fails past a limit (the template's output is bounded while it is written).
struct Bounded {
    out: Vec<u8>,
    limit: usize,
    overflow: bool,
}

impl std::io::Write for Bounded {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.out.len() + b.len() > self.limit {
            self.overflow = true;
            return Err(std::io::Error::other("chat template output too long"));
        }
        self.out.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One turn of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    /// "system", "user", "assistant" (or whatever roles the template knows).
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage { role: role.into(), content: content.into() }
    }

    pub fn system(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("system", content)
    }

    pub fn user(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("user", content)
    }

    pub fn assistant(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("assistant", content)
    }
}

/// A compiled chat template with the BOS/EOS strings it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source` (Jinja) with the given BOS/EOS strings.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate, ChatError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned("chat", strip_generation_tags(source)).map_err(ChatError::Compile)?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// The model's template from `tokenizer.chat_template`, rendered with the tokenizer's BOS/EOS
    /// token texts; `None` when the model has none.
    pub fn from_gguf(g: &Gguf, tok: &Tokenizer) -> Result<Option<ChatTemplate>, ChatError> {
        let Some(v) = g.get(TEMPLATE_KEY) else {
            return Ok(None);
        };
        let src = v.as_str().ok_or_else(|| ChatError::BadKey {
            key: TEMPLATE_KEY.into(),
            why: format!("expected a string, found {}", v.type_name()),
        })?;
        let (bos, eos) = token_texts(tok);
        ChatTemplate::new(src, bos, eos).map(Some)
    }

    /// [`ChatTemplate::from_gguf`], falling back to ChatML when the model has no template.
    pub fn from_gguf_or_chatml(g: &Gguf, tok: &Tokenizer) -> Result<ChatTemplate, ChatError> {
        match ChatTemplate::from_gguf(g, tok)? {
            Some(t) => Ok(t),
            None => ChatTemplate::chatml(tok),
        }
    }

    /// The ChatML template ([`CHATML_TEMPLATE`]).
    pub fn chatml(tok: &Tokenizer) -> Result<ChatTemplate, ChatError> {
        let (bos, eos) = token_texts(tok);
        ChatTemplate::new(CHATML_TEMPLATE, bos, eos)
    }

    /// Renders the conversation; with `add_generation_prompt` the text ends with the opening of
    /// the assistant's turn.
    pub fn apply(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, ChatError> {
        let tmpl = self.env.get_template("chat").map_err(ChatError::Render)?;
        let input: usize = messages.iter().map(|m| m.role.len() + m.content.len()).sum();
        let mut out = Bounded { out: Vec::new(), limit: output_limit(input), overflow: false };
        let r = sift_alloc::limited(memory_limit(input), MEMORY_MESSAGE, || {
            tmpl.render_captured_to(
                minijinja::context! {
                    messages => Value::from_serialize(messages),
                    bos_token => &self.bos_token,
                    eos_token => &self.eos_token,
                    add_generation_prompt => add_generation_prompt,
                    tools => Value::from(()),
                    functions => Value::from(()),
                    tool_choice => Value::from(()),
                    function_call => Value::from(()),
                },
                &mut out,
            )
        });
        match r {
            Ok(_) => String::from_utf8(out.out)
                .map_err(|_| ChatError::Render(Error::new(ErrorKind::InvalidOperation, "the output is not UTF-8"))),
            Err(_) if out.overflow => Err(ChatError::TooLong { limit: out.limit, input }),
            Err(e) => Err(ChatError::Render(e)),
        }
    }

    /// The template source as found in the model.
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }
}

fn token_texts(tok: &Tokenizer) -> (&str, &str) {
    (tok.bos().map_or("", |id| tok.token_str(id)), tok.eos().map_or("", |id| tok.token_str(id)))
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// Drops `{% generation %}` and `{% endgeneration %}` tags (a transformers extension that only
/// marks assistant text), keeping what they enclose.
fn strip_generation_tags(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(start) = rest.find("{%") {
        let Some(len) = rest[start..].find("%}") else {
            break;
        };
        let tag = &rest[start + 2..start + len];
        let name = tag.trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        out.push_str(&rest[..start]);
        if name != "generation" && name != "endgeneration" {
            out.push_str(&rest[start..start + len + 2]);
        }
        rest = &rest[start + len + 2..];
    }
    out.push_str(rest);
    out
}

/// `strftime_now(fmt)`: the current UTC time; supports %Y %m %d %e %H %M %S %b %B %a %A %y %j %p
/// %I %%.
fn strftime_now(fmt: String) -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    strftime(&fmt, secs)
}

fn strftime(fmt: &str, secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let d = doy_mar - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(m - 1) as usize] + d + i64::from(leap && m > 2);
    let wday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let (hh, mm, ss) = (tod / 3600, tod % 3600 / 60, tod % 60);
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y % 100)),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('H') => out.push_str(&format!("{hh:02}")),
            Some('I') => out.push_str(&format!("{:02}", if hh % 12 == 0 { 12 } else { hh % 12 })),
            Some('p') => out.push_str(if hh < 12 { "AM" } else { "PM" }),
            Some('M') => out.push_str(&format!("{mm:02}")),
            Some('S') => out.push_str(&format!("{ss:02}")),
            Some('b') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('a') => out.push_str(&DAYS[wday][..3]),
            Some('A') => out.push_str(DAYS[wday]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Python `json.dumps` options.
struct JsonStyle {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

/// `tojson` like transformers' / llama-cpp-python's: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.kind() {
            ValueKind::Number => Some(" ".repeat(i64::try_from(v)?.max(0) as usize)),
            ValueKind::String => Some(v.as_str().unwrap_or_default().to_string()),
            _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: indent must be an integer or a string")),
        },
    };
    let separators: Option<Value> = kwargs.get("separators")?;
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() && !v.is_undefined() => {
            let a = v.get_item_by_index(0)?;
            let b = v.get_item_by_index(1)?;
            match (a.as_str(), b.as_str()) {
                (Some(a), Some(b)) => (a.to_string(), b.to_string()),
                _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings")),
            }
        }
        _ => (if indent.is_some() { "," } else { ", " }.to_string(), ": ".to_string()),
    };
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let style = JsonStyle {
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    let mut out = String::new();
    write_json(&value, &style, 0, &mut out)?;
    Ok(Value::from(out))
}

fn write_json_str(s: &str, ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ascii && (c as u32) > 0x7e) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn newline(style: &JsonStyle, depth: usize, out: &mut String) {
    if let Some(ind) = &style.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(ind);
        }
    }
}

fn write_json(v: &Value, style: &JsonStyle, depth: usize, out: &mut String) -> Result<(), Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
                return Ok(());
            }
            let f = f64::try_from(v.clone())?;
            if f.is_nan() {
                out.push_str("NaN");
            } else if f.is_infinite() {
                out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
            } else if f.fract() == 0.0 && f.abs() < 1e16 {
                out.push_str(&format!("{f:.1}"));
            } else {
                out.push_str(&format!("{f}"));
            }
        }
        ValueKind::String => write_json_str(v.as_str().unwrap_or_default(), style.ensure_ascii, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(style, depth + 1, out);
                write_json(item, style, depth + 1, out)?;
            }
            newline(style, depth, out);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries: Vec<(String, Value)> = Vec::new();
            for key in v.try_iter()? {
                let item = v.get_item(&key)?;
                let key = match key.kind() {
                    ValueKind::String => key.as_str().unwrap_or_default().to_string(),
                    ValueKind::None | ValueKind::Undefined => "null".to_string(),
                    ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_string(),
                    _ => key.to_string(),
                };
                entries.push((key, item));
            }
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (k, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(style, depth + 1, out);
                write_json_str(k, style.ensure_ascii, out);
                out.push_str(&style.key_sep);
                write_json(item, style, depth + 1, out)?;
            }
            newline(style, depth, out);
            out.push('}');
        }
        _ => write_json_str(&v.to_string(), style.ensure_ascii, out),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_known_dates() {
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", 0), "1970-01-01 00:00:00");
        assert_eq!(strftime("%d %b %Y %A", 1_709_251_200), "01 Mar 2024 Friday");
        assert_eq!(strftime("%j %B %%", 1_735_603_200), "366 December %");
    }

    #[test]
    fn tojson_matches_python() {
        let t = ChatTemplate::new(
            "{% set x = {'a': 's', 'b': [1, true, none]} %}{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ 'é\"\\n' | tojson }}|{{ 1.5 | tojson }}|{{ 2.0 | tojson }}",
            "",
            "",
        )
        .unwrap();
        assert_eq!(
            t.apply(&[], false).unwrap(),
            "{\"a\": \"s\", \"b\": [1, true, null]}|{\n  \"a\": \"s\",\n  \"b\": [\n    1,\n    true,\n    null\n  ]\n}|\"é\\\"\\n\"|1.5|2.0"
        );
    }

    /// A hostile template (issue 22): loops without end run out of fuel; output that grows past
    /// 4 × the messages + 1 MiB is cut off with an error, before it takes the memory.
    #[test]
    fn runaway_templates_stop_with_an_error() {
        let msgs = [ChatMessage::user("hi")];
        let t = ChatTemplate::new(
            "{% for a in range(100000) %}{% for b in range(100000) %}{{ '' }}{% endfor %}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let err = t.apply(&msgs, true).unwrap_err().to_string();
        assert!(err.contains("fuel"), "{err}");
        let t = ChatTemplate::new("{% for i in range(1000) %}{{ 'x' * 10000000 }}{% endfor %}", "", "").unwrap();
        let err = t.apply(&msgs, true).unwrap_err();
        assert!(matches!(err, ChatError::TooLong { .. }), "{err}");
        assert!(err.to_string().contains("passed 1048600 bytes"), "{err}");
        // An ordinary template with long messages is not affected.
        let long = ChatMessage::user("word ".repeat(400_000));
        let t = ChatTemplate::new(CHATML_TEMPLATE, "", "").unwrap();
        assert!(t.apply(&[long], true).unwrap().len() > 2_000_000);
    }

    #[test]
    fn generation_tags_and_raise_exception() {
        let t = ChatTemplate::new("a{% generation %}b{%- endgeneration %}c", "", "").unwrap();
        assert_eq!(t.apply(&[], false).unwrap(), "abc");
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", "", "").unwrap();
        let err = t.apply(&[], false).unwrap_err().to_string();
        assert!(err.contains("no system role"), "{err}");
    }

    #[test]
    fn pycompat_methods() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{{ m.content.strip() }}{{ m['role'].startswith('us') }}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        assert_eq!(t.apply(&[ChatMessage::user("  hi \n")], false).unwrap(), "hiTrue");
    }
}
