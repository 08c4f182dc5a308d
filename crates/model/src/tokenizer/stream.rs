//! [`StreamDecoder`]: UTF-8-safe streaming detokenization of generated tokens, holding back the
//! leading bytes of a character until the token that completes it arrives.

use super::Tokenizer;

/// Streaming detokenizer: turns generated ids into text as soon as it is complete UTF-8, holding
/// back the first bytes of a character whose remaining bytes come in a later token.
///
/// By default control tokens (`<|im_end|>`) produce no text, as in llama.cpp without `--special`;
/// [`StreamDecoder::with_special`] prints them.
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    special: bool,
}

impl StreamDecoder {
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// A decoder that also prints control tokens' text.
    pub fn with_special(special: bool) -> StreamDecoder {
        StreamDecoder { pending: Vec::new(), special }
    }

    /// Adds one token; returns the text that became complete, if any. Bytes that can never form
    /// valid UTF-8 are emitted as U+FFFD rather than held.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Option<String> {
        self.pending.extend_from_slice(tok.piece_opt(id, self.special));
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&rest[..valid]).unwrap_or_default());
                    match e.error_len() {
                        None => {
                            rest = &rest[valid..];
                            break;
                        }
                        Some(n) => {
                            out.push('\u{FFFD}');
                            rest = &rest[valid + n..];
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let drop = self.pending.len() - keep;
        self.pending.drain(..drop);
        (!out.is_empty()).then_some(out)
    }

    /// Returns whatever is still held (an incomplete character becomes U+FFFD) and resets.
    pub fn flush(&mut self) -> Option<String> {
        if self.pending.is_empty() {
            return None;
        }
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        Some(s)
    }

    /// Whether bytes are being held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }
}
