//! What each token decodes to: its piece of bytes (GPT-2 byte table mapped back, `▁` to a space,
//! `<0xXX>` to its byte) and llama.cpp's `clean_spaces` pass over decoded text.

use std::collections::HashMap;

use super::{ATTR_BYTE, ATTR_CONTROL, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_USER_DEFINED};

/// What llama.cpp's `token_to_piece(.., special = true)` gives for a token.
pub(super) fn piece_of(text: &str, attr: u8, is_spm: bool, c2b: &HashMap<char, u8>) -> Vec<u8> {
    if attr & (ATTR_CONTROL | ATTR_UNKNOWN | ATTR_USER_DEFINED) != 0 {
        return text.as_bytes().to_vec();
    }
    if attr & ATTR_NORMAL != 0 {
        if is_spm {
            return text.replace('\u{2581}', " ").into_bytes();
        }
        let mut out = Vec::with_capacity(text.len());
        for c in text.chars() {
            match c2b.get(&c) {
                Some(&b) => out.push(b),
                // Not in the byte alphabet: keep the character itself.
                None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
            }
        }
        return out;
    }
    if attr & ATTR_BYTE != 0 {
        if let Some(b) =
            text.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')).and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            return vec![b];
        }
        if !is_spm {
            if let Some(&b) = text.chars().next().and_then(|c| c2b.get(&c)) {
                return vec![b];
            }
        }
        return text.as_bytes().to_vec();
    }
    Vec::new()
}

/// llama.cpp's `clean_spaces` detokenizer pass: " ?" " !" " ." " ," lose the space, a lone "'"
/// between spaces loses both, and " 's" " 'm" " 're" " 've" lose the space.
pub(super) fn clean_spaces(t: &mut Vec<u8>) {
    if t.is_empty() {
        return;
    }
    let mut out = Vec::with_capacity(t.len());
    out.push(t[0]);
    for i in 1..t.len() {
        let x = t[i];
        if t[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            out.pop();
        }
        out.push(x);
    }
    *t = out;

    let mut out = Vec::with_capacity(t.len());
    out.push(t[0]);
    let mut i = 1;
    while i < t.len() {
        let x = t[i];
        if x == b'\'' && i + 1 < t.len() && t[i - 1] == b' ' && t[i + 1] == b' ' {
            out.pop();
            out.push(x);
            i += 2;
            continue;
        }
        out.push(x);
        i += 1;
    }
    *t = out;

    let mut out = Vec::with_capacity(t.len());
    out.push(t[0]);
    for i in 1..t.len() {
        let x = t[i];
        if t[i - 1] == b' ' && x == b'\'' && i + 1 < t.len() {
            let x1 = t[i + 1];
            let x2 = t.get(i + 2).copied();
            if matches!(x1, b's' | b'm')
                || (i + 2 < t.len() && matches!((x1, x2), (b'r', Some(b'e')) | (b'v', Some(b'e'))))
            {
                out.pop();
            }
        }
        out.push(x);
    }
    *t = out;
}
