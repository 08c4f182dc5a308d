//! The vocabulary in compact form. A 152k-token vocabulary kept as one `String` per token plus a
//! `HashMap<String, u32>` (and the `tokenizers` BPE model's own two maps) cost Qwen2.5 about
//! 45 MiB of heap; packed, it costs its bytes plus 8 bytes a token.
//!
//! - [`Packed`]: byte strings in one buffer with their end offsets (token texts, decoded pieces).
//! - [`Vocab`]: the token texts, and a sorted index that finds a text's id by binary search.

use std::cmp::Ordering;

use super::{bad, TokenizerError, KEY_TOKENS};

/// Byte strings packed one after another in one buffer; string `i` is
/// `bytes[ends[i - 1]..ends[i]]`.
#[derive(Default)]
pub(super) struct Packed {
    bytes: Vec<u8>,
    ends: Vec<u32>,
}

impl Packed {
    /// Appends `item`; fails (naming `key`) past 4 GiB in all.
    pub(super) fn push(&mut self, item: &[u8], key: &str) -> Result<(), TokenizerError> {
        self.bytes.extend_from_slice(item);
        let end = u32::try_from(self.bytes.len()).map_err(|_| bad(key, "more than 4 GiB of token text"))?;
        self.ends.push(end);
        Ok(())
    }

    /// Gives back the growth room of the buffers once every string is in.
    pub(super) fn shrink_to_fit(&mut self) {
        self.bytes.shrink_to_fit();
        self.ends.shrink_to_fit();
    }

    pub(super) fn len(&self) -> usize {
        self.ends.len()
    }

    /// String `i`, or nothing for an index past the end.
    pub(super) fn get(&self, i: usize) -> &[u8] {
        let Some(&end) = self.ends.get(i) else {
            return &[];
        };
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start as usize..end as usize]
    }
}

/// The token texts of a vocabulary (valid UTF-8, as the GGUF stores them) and the ids sorted by
/// text, for lookups by text.
pub(super) struct Vocab {
    texts: Packed,
    by_text: Vec<u32>,
}

impl Vocab {
    /// The vocabulary of `texts`, in id order. An empty text becomes `[EMPTY_<id>]`, as in
    /// llama.cpp, so that no two tokens share the empty string.
    pub(super) fn new<'a>(texts: impl Iterator<Item = &'a str>) -> Result<Vocab, TokenizerError> {
        let mut packed = Packed::default();
        for (i, t) in texts.enumerate() {
            if t.is_empty() {
                packed.push(format!("[EMPTY_{i}]").as_bytes(), KEY_TOKENS)?;
            } else {
                packed.push(t.as_bytes(), KEY_TOKENS)?;
            }
        }
        packed.shrink_to_fit();
        let n = u32::try_from(packed.len()).map_err(|_| bad(KEY_TOKENS, "more than 2^32 tokens"))?;
        let mut by_text: Vec<u32> = (0..n).collect();
        // Equal texts sort highest id first, so a lookup finds the last of them, as llama.cpp's
        // `token_to_id[text] = id` map built in id order does.
        by_text.sort_by(|&a, &b| packed.get(a as usize).cmp(packed.get(b as usize)).then(b.cmp(&a)));
        Ok(Vocab { texts: packed, by_text })
    }

    pub(super) fn len(&self) -> usize {
        self.texts.len()
    }

    /// The text of token `id`; "" for an id outside the vocabulary.
    pub(super) fn text(&self, id: u32) -> &str {
        // Every stored text came from a `&str`, so it is valid UTF-8.
        std::str::from_utf8(self.texts.get(id as usize)).unwrap_or("")
    }

    /// The id of the token whose text is `text` (the highest such id).
    pub(super) fn id(&self, text: &str) -> Option<u32> {
        let key = text.as_bytes();
        let first = self.by_text.partition_point(|&id| self.texts.get(id as usize).cmp(key) == Ordering::Less);
        let &id = self.by_text.get(first)?;
        (self.texts.get(id as usize) == key).then_some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_found_by_id_and_by_text() {
        let v = Vocab::new(["b", "a", "", "ab", "a"].into_iter()).unwrap();
        assert_eq!(v.len(), 5);
        assert_eq!((v.text(0), v.text(2), v.text(3), v.text(9)), ("b", "[EMPTY_2]", "ab", ""));
        assert_eq!(v.id("a"), Some(4), "a repeated text finds its last id, as llama.cpp");
        assert_eq!((v.id("ab"), v.id("b"), v.id("[EMPTY_2]")), (Some(3), Some(0), Some(2)));
        assert_eq!((v.id(""), v.id("abc"), v.id("0")), (None, None, None));
    }

    #[test]
    fn packed_strings_round_trip() {
        let items: [&[u8]; 4] = [b"x", b"", b"\xff\x00", b"yz"];
        let mut p = Packed::default();
        for item in items {
            p.push(item, "k").unwrap();
        }
        assert_eq!(p.len(), 4);
        for (i, want) in items.iter().enumerate() {
            assert_eq!(p.get(i), *want);
        }
        assert_eq!(p.get(4), b"");
    }
}
