//! The vocabulary in compact form. A 152k-token vocabulary kept as one `String` per token plus a
//! `HashMap<String, u32>` (and the `tokenizers` BPE model's own two maps) cost Qwen2.5 about
//! 45 MiB of heap; packed, it costs its bytes plus 12-20 bytes a token.
//!
//! - [`Packed`]: byte strings in one buffer with their end offsets (token texts, decoded pieces).
//! - [`Vocab`]: the token texts, and an open-addressing hash index of ids that finds a text's id.
//!   (A sorted index searched by halves cost a third of a one-token run's time at load: BPE's
//!   150k merges look up three texts each.)

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

/// The token texts of a vocabulary (valid UTF-8, as the GGUF stores them) and a hash index for
/// lookups by text: `index` (a power of two, at least twice the tokens) holds `id + 1` of each
/// distinct text at its hash's slot or the next free one after it (linear probing), 0 when free.
pub(super) struct Vocab {
    texts: Packed,
    index: Vec<u32>,
}

/// FNV-1a over `b`, its high bits folded in (the index takes the low ones).
fn text_hash(b: &[u8]) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h = (h ^ x as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h ^ (h >> 29)) as usize
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
        let n = u32::try_from(packed.len())
            .ok()
            .filter(|&n| n < u32::MAX / 4)
            .ok_or_else(|| bad(KEY_TOKENS, "more than 2^30 tokens"))?;
        let mask = (2 * n as usize).next_power_of_two().max(2) - 1;
        let mut index = vec![0u32; mask + 1];
        for id in 0..n {
            let key = packed.get(id as usize);
            let mut slot = text_hash(key) & mask;
            // A repeated text takes the later id, as llama.cpp's `token_to_id[text] = id` map
            // built in id order does.
            while index[slot] != 0 && packed.get(index[slot] as usize - 1) != key {
                slot = (slot + 1) & mask;
            }
            index[slot] = id + 1;
        }
        Ok(Vocab { texts: packed, index })
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
        let mask = self.index.len() - 1;
        let mut slot = text_hash(key) & mask;
        // At most half the slots are taken, so a free one ends every probe.
        loop {
            let id = self.index[slot].checked_sub(1)?;
            if self.texts.get(id as usize) == key {
                return Some(id);
            }
            slot = (slot + 1) & mask;
        }
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

    /// The hash index against a plain map on 20,000 texts with repeats (the later id wins) and
    /// misses, through every probe length the collisions make.
    #[test]
    fn the_hash_index_finds_what_a_map_finds() {
        let texts: Vec<String> = (0..20_000u32).map(|i| format!("t{}", (i * 7919) % 15_000)).collect();
        let v = Vocab::new(texts.iter().map(String::as_str)).unwrap();
        let mut map = std::collections::HashMap::new();
        for (i, t) in texts.iter().enumerate() {
            map.insert(t.as_str(), i as u32);
        }
        for t in &texts {
            assert_eq!(v.id(t), map.get(t.as_str()).copied(), "{t}");
        }
        for miss in ["t15000", "t", "", "x1"] {
            assert_eq!(v.id(miss), None, "{miss}");
        }
        assert_eq!(Vocab::new(std::iter::empty()).unwrap().id("a"), None);
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
