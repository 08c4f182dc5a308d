//! SentencePiece BPE (`tokenizer.ggml.model = "llama"`): a port of llama.cpp's SPM tokenizer.
//! Adjacent symbols of the `▁`-escaped text merge greedily by the vocabulary score of the merged
//! piece; symbols left without a token fall back to `<0xXX>` byte tokens (or UNK).

use super::vocab::Vocab;
use super::Tokenizer;

/// The `<0xXX>` token of every byte (for ASCII, the one-character token when there is no
/// `<0xXX>` token), or `None` where the vocabulary has neither.
pub(super) fn byte_tokens(vocab: &Vocab) -> [Option<u32>; 256] {
    let mut byte_tokens = [None; 256];
    for (b, slot) in byte_tokens.iter_mut().enumerate() {
        *slot = vocab
            .id(&format!("<0x{b:02X}>"))
            .or_else(|| char::from_u32(b as u32).filter(|_| b < 128).and_then(|c| vocab.id(&c.to_string())));
    }
    byte_tokens
}

impl Tokenizer {
    /// llama.cpp's `llm_tokenizer_spm_session::tokenize` on whitespace-escaped text.
    pub(super) fn spm_tokenize(&self, text: &str, byte_tokens: &[Option<u32>; 256], out: &mut Vec<u32>) {
        struct Sym {
            start: usize,
            len: usize,
            prev: isize,
            next: isize,
        }
        #[derive(PartialEq)]
        struct Bigram {
            score: f32,
            left: usize,
            right: usize,
            size: usize,
        }
        impl Eq for Bigram {}
        impl Ord for Bigram {
            fn cmp(&self, o: &Self) -> std::cmp::Ordering {
                // Highest score first, then leftmost.
                self.score.total_cmp(&o.score).then_with(|| o.left.cmp(&self.left))
            }
        }
        impl PartialOrd for Bigram {
            fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(o))
            }
        }

        let mut syms: Vec<Sym> = Vec::with_capacity(text.len());
        for (i, (start, ch)) in text.char_indices().enumerate() {
            let len = ch.len_utf8();
            syms.push(Sym {
                start,
                len,
                prev: i as isize - 1,
                next: if start + len == text.len() { -1 } else { i as isize + 1 },
            });
        }
        let mut heap = std::collections::BinaryHeap::new();
        let try_add = |syms: &[Sym], left: isize, right: isize, heap: &mut std::collections::BinaryHeap<Bigram>| {
            if left < 0 || right < 0 {
                return;
            }
            let (l, r) = (left as usize, right as usize);
            let s = &text[syms[l].start..syms[l].start + syms[l].len + syms[r].len];
            if let Some(id) = self.vocab.id(s) {
                let score = self.scores.get(id as usize).copied().unwrap_or(0.0);
                heap.push(Bigram { score, left: l, right: r, size: s.len() });
            }
        };
        for i in 1..syms.len() {
            try_add(&syms, i as isize - 1, i as isize, &mut heap);
        }
        while let Some(b) = heap.pop() {
            let (ll, rl) = (syms[b.left].len, syms[b.right].len);
            if ll == 0 || rl == 0 || ll + rl != b.size {
                continue;
            }
            syms[b.left].len += rl;
            syms[b.right].len = 0;
            let rnext = syms[b.right].next;
            syms[b.left].next = rnext;
            if rnext >= 0 {
                syms[rnext as usize].prev = b.left as isize;
            }
            let lprev = syms[b.left].prev;
            try_add(&syms, lprev, b.left as isize, &mut heap);
            try_add(&syms, b.left as isize, rnext, &mut heap);
        }

        // Every merge produced a token, so a final symbol is either a token or a single character
        // without one (llama.cpp's `resegment` never reaches its reverse-merge branch): the latter
        // becomes byte tokens, or UNK where the vocabulary lacks them.
        let mut i = if syms.is_empty() { -1 } else { 0isize };
        while i >= 0 {
            let sym = &syms[i as usize];
            if sym.len > 0 {
                let s = &text[sym.start..sym.start + sym.len];
                match self.vocab.id(s) {
                    Some(id) => out.push(id),
                    None => {
                        for &b in s.as_bytes() {
                            out.extend(byte_tokens[b as usize].or(self.unk));
                        }
                    }
                }
            }
            i = sym.next;
        }
    }
}
