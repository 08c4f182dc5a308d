//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`): llama.cpp's pre-tokenizer regexes for each
//! `tokenizer.ggml.pre`, the GPT-2 byte-to-unicode tables, the [`tokenizers`] pre-tokenizer (a
//! `Split` per regex, then `ByteLevel`) and the merges of `tokenizer.ggml.merges` by rank.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use sift_gguf::Gguf;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::Split;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer, SplitDelimiterBehavior};

use super::vocab::Vocab;
use super::{bad, string_array, TokenizerError, KEY_TOKENS};

pub(super) const KEY_MERGES: &str = "tokenizer.ggml.merges";

/// The GPT-2 regex (`LLAMA_VOCAB_PRE_TYPE_GPT2`), also the fallback for unknown pre-tokenizers.
const RE_GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const RE_LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizer regexes for a `tokenizer.ggml.pre` value, applied in sequence as in
/// llama.cpp's `llm_tokenizer_bpe` (each regex splits every piece left by the previous one; text
/// between matches stays a piece of its own). Also whether llama.cpp sets `ignore_merges` (a word
/// that is already a token is not merged) and `clean_spaces` (decode drops spaces before
/// punctuation).
pub(super) struct PreSpec {
    pub(super) regexes: Vec<&'static str>,
    pub(super) ignore_merges: bool,
    pub(super) clean_spaces: bool,
    /// llama.cpp's default for `add_bos` (overridden by `tokenizer.ggml.add_bos_token`).
    pub(super) add_bos: bool,
}

pub(super) fn pre_spec(pre: &str) -> PreSpec {
    let spec = |regexes: Vec<&'static str>, ignore_merges: bool, clean_spaces: bool| PreSpec {
        regexes,
        ignore_merges,
        clean_spaces,
        add_bos: false,
    };
    let with_bos = |s: PreSpec| PreSpec { add_bos: true, ..s };
    match pre {
        "" | "default" => spec(vec![r"[\p{P}\$\+<=>\^~\|]+", RE_GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"], false, true),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2"
        | "jina-v5-nano" => with_bos(spec(vec![RE_LLAMA3], true, true)),
        "dbrx" | "smaug-bpe" => spec(vec![RE_LLAMA3], false, true),
        "chatglm-bpe" => spec(vec![RE_LLAMA3], false, true),
        "glm4" | "glm5" => spec(vec![RE_LLAMA3], true, true),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open" => {
            spec(vec![RE_QWEN2], false, false)
        }
        "megrez" | "stablelm2" => spec(vec![RE_QWEN2], false, true),
        "qwen35" => spec(vec![RE_QWEN35], false, false),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            spec(vec![r"\p{N}", RE_GPT2], false, true)
        }
        "smollm" | "command-r" => spec(vec![r"\p{N}", RE_GPT2], false, false),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0" | "mellum"
        | "modern-bert" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" | "mpt" | "olmo" | "jais" | "exaone4" => {
            spec(vec![RE_GPT2], false, true)
        }
        "trillion" | "granite-docling" => spec(vec![RE_GPT2], false, false),
        "falcon" => spec(
            vec![
                r"[\p{P}\$\+<=>\^~\|`]+",
                r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
                r"[0-9][0-9][0-9]",
            ],
            false,
            true,
        ),
        "deepseek-llm" => spec(
            vec![
                r"[\r\n]",
                r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
                r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
                r"\s+$",
                r"[一-龥ࠀ-一가-퟿]+",
                r"\p{N}+",
            ],
            false,
            false,
        ),
        "deepseek-coder" => {
            spec(vec![r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"], false, false)
        }
        "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => spec(
            vec![
                r"\p{N}{1,3}",
                r"[一-龥぀-ゟ゠-ヿ]+",
                r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
            ],
            false,
            false,
        ),
        "poro-chat" => spec(vec![r" ?[^(\s|.,!?…。，、।۔،)]+"], false, false),
        "bloom" | "gpt3-finnish" => spec(vec![r" ?[^(\s|.,!?…。，、।۔،)]+"], false, true),
        "viking" => spec(vec![r" ?[^(\s|.,!?…。，、।۔،)]+", r"\p{N}"], false, false),
        "tekken" => with_bos(spec(vec![RE_TEKKEN], true, false)),
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => spec(vec![RE_GPT4O], false, false),
        "seed-coder" => spec(
            vec![
                r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",
            ],
            false,
            false,
        ),
        "bailingmoe" | "bailingmoe2" | "llada-moe" => spec(
            vec![
                r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
            ],
            false,
            false,
        ),
        "grok-2" => spec(vec![RE_QWEN2], false, false),
        // Unknown to llama.cpp (which refuses the model): use the plain GPT-2 split.
        _ => spec(vec![RE_GPT2], false, true),
    }
}

/// The GPT-2 byte-to-unicode table: printable bytes map to themselves, the others to U+0100.. in
/// order. Returns (byte -> char, char -> byte).
pub(super) fn byte_tables() -> ([char; 256], HashMap<char, u8>) {
    let mut b2c = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable = (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        b2c[b as usize] = if printable {
            char::from(b)
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap_or('\u{FFFD}')
        };
    }
    let c2b = b2c.iter().enumerate().map(|(b, &c)| (c, b as u8)).collect();
    (b2c, c2b)
}

/// Byte-level BPE: the pre-tokenizer (a [`tokenizers`] `Sequence` of one isolating `Split` per
/// regex, then `ByteLevel`, which maps bytes to the GPT-2 alphabet) and the merges by rank.
///
/// The splitting stays on the `tokenizers` library (its regex engine gives llama.cpp's pieces);
/// the merging is sift's own, because the library's `BPE` model keeps the vocabulary twice in
/// `String`-keyed hash maps plus a merge map and a word cache (about 25 MiB for Qwen2.5's 152k
/// tokens) and cannot borrow compact tables. The merge loop is the same as the library's and
/// llama.cpp's: lowest rank first, leftmost first among equal ranks.
pub(super) struct BpeEngine {
    pre: Sequence,
    /// (left id, right id) -> (rank, merged id), sorted by the pair.
    merges: Vec<(u64, u32, u32)>,
    /// The token of each character of the GPT-2 byte alphabet (U+0021..U+0143), by code point.
    char_ids: Vec<Option<u32>>,
    ignore_merges: bool,
}

/// A symbol of a word being merged: a token id and its neighbours (`usize::MAX`: none).
#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    prev: usize,
    next: usize,
    merged_away: bool,
}

const NONE: usize = usize::MAX;

fn pair_key(a: u32, b: u32) -> u64 {
    (u64::from(a) << 32) | u64::from(b)
}

impl BpeEngine {
    /// Builds the engine from the vocabulary and `tokenizer.ggml.merges`.
    pub(super) fn new(g: &Gguf, vocab: &Vocab, spec: &PreSpec, b2c: &[char; 256]) -> Result<BpeEngine, TokenizerError> {
        let merges_raw = string_array(g, KEY_MERGES)?.ok_or_else(|| TokenizerError::MissingKey(KEY_MERGES.into()))?;
        let mut merges: Vec<(u64, u32, u32)> = Vec::with_capacity(merges_raw.len());
        let mut joined = String::new();
        for m in merges_raw.iter() {
            // llama.cpp splits at the first space after the first byte.
            let Some(pos) = m.as_bytes().iter().skip(1).position(|&b| b == b' ').map(|p| p + 1) else {
                continue;
            };
            let (a, b) = (&m[..pos], &m[pos + 1..]);
            joined.clear();
            joined.push_str(a);
            joined.push_str(b);
            let (Some(ia), Some(ib), Some(ab)) = (vocab.id(a), vocab.id(b), vocab.id(&joined)) else {
                continue;
            };
            if b.is_empty() {
                continue;
            }
            merges.push((pair_key(ia, ib), merges.len() as u32, ab));
        }
        // llama.cpp keeps the first rank of a repeated pair: a stable sort keeps equal pairs in
        // rank order, and `dedup_by_key` keeps the first.
        merges.sort_by_key(|m| m.0);
        merges.dedup_by_key(|m| m.0);
        merges.shrink_to_fit();

        let max = b2c.iter().map(|&c| c as usize).max().unwrap_or(0);
        let mut char_ids = vec![None; max + 1];
        for &c in b2c {
            char_ids[c as usize] = vocab.id(c.encode_utf8(&mut [0; 4]));
        }
        // The byte tokens must exist for byte-level BPE to cover every input.
        if char_ids.iter().all(Option::is_none) {
            return Err(bad(KEY_TOKENS, "byte-level BPE vocabulary has none of the 256 byte tokens"));
        }

        let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(spec.regexes.len() + 1);
        for re in &spec.regexes {
            let split = Split::new(
                tokenizers::pre_tokenizers::split::SplitPattern::Regex(re.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| TokenizerError::Build(format!("pre-tokenizer regex {re:?}: {e}")))?;
            steps.push(split.into());
        }
        steps.push(ByteLevel::new(false, false, false).into());
        Ok(BpeEngine { pre: Sequence::new(steps), merges, char_ids, ignore_merges: spec.ignore_merges })
    }

    /// Appends the tokens of `text` (plain text, no special tokens) to `out`, pre-tokenizing it
    /// in pieces of about `piece` bytes ([`pieces`]): the pre-tokenizer keeps ~100 bytes of
    /// alignment data per input byte, so a 2 MB text took 200+ MB at once (issue 22).
    pub(super) fn encode(
        &self,
        text: &str,
        vocab: &Vocab,
        out: &mut Vec<u32>,
        piece: usize,
        limit: usize,
    ) -> Result<(), TokenizerError> {
        for p in pieces(text, piece) {
            self.encode_piece(p, vocab, out)?;
            if out.len() > limit {
                return Err(TokenizerError::TooManyTokens { limit });
            }
        }
        Ok(())
    }

    fn encode_piece(&self, text: &str, vocab: &Vocab, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        let mut pre = PreTokenizedString::from(text);
        self.pre.pre_tokenize(&mut pre).map_err(|e| TokenizerError::Encode(e.to_string()))?;
        let mut symbols = Vec::new();
        for (word, _, _) in pre.get_splits(OffsetReferential::Original, OffsetType::Byte) {
            if self.ignore_merges {
                if let Some(id) = vocab.id(word) {
                    out.push(id);
                    continue;
                }
            }
            self.merge_word(word, vocab, &mut symbols);
            let mut i = if symbols.is_empty() { NONE } else { 0 };
            while i != NONE {
                out.push(symbols[i].id);
                i = symbols[i].next;
            }
        }
        Ok(())
    }

    /// The merge of (rank, merged id) for the pair `a b`, if there is one.
    fn merge_of(&self, a: u32, b: u32) -> Option<(u32, u32)> {
        let key = pair_key(a, b);
        let i = self.merges.binary_search_by_key(&key, |m| m.0).ok()?;
        Some((self.merges[i].1, self.merges[i].2))
    }

    /// Merges the characters of one pre-tokenized `word` into `symbols` (linked from index 0;
    /// characters without a token are dropped, as the `tokenizers` library does without an
    /// unknown token).
    fn merge_word(&self, word: &str, vocab: &Vocab, symbols: &mut Vec<Symbol>) {
        symbols.clear();
        for c in word.chars() {
            let id = match self.char_ids.get(c as usize) {
                Some(&id) => id,
                None => vocab.id(c.encode_utf8(&mut [0; 4])),
            };
            let Some(id) = id else { continue };
            let at = symbols.len();
            if let Some(last) = symbols.last_mut() {
                last.next = at;
            }
            let prev = if at == 0 { NONE } else { at - 1 };
            symbols.push(Symbol { id, prev, next: NONE, merged_away: false });
        }
        // Candidates ordered lowest rank first, then leftmost: (rank, left position, merged id).
        let mut queue = BinaryHeap::new();
        for i in 1..symbols.len() {
            if let Some((rank, id)) = self.merge_of(symbols[i - 1].id, symbols[i].id) {
                queue.push(Reverse((rank, i - 1, id)));
            }
        }
        while let Some(Reverse((_, pos, new_id))) = queue.pop() {
            let left = symbols[pos];
            if left.merged_away || left.next == NONE {
                continue;
            }
            let right = symbols[left.next];
            // A stale candidate: one of its symbols has merged since it was queued.
            if self.merge_of(left.id, right.id).is_none_or(|(_, id)| id != new_id) {
                continue;
            }
            symbols[pos].id = new_id;
            symbols[pos].next = right.next;
            symbols[left.next].merged_away = true;
            if right.next != NONE {
                symbols[right.next].prev = pos;
            }
            let cur = symbols[pos];
            if cur.prev != NONE {
                if let Some((rank, id)) = self.merge_of(symbols[cur.prev].id, cur.id) {
                    queue.push(Reverse((rank, cur.prev, id)));
                }
            }
            if cur.next != NONE {
                if let Some((rank, id)) = self.merge_of(cur.id, symbols[cur.next].id) {
                    queue.push(Reverse((rank, pos, id)));
                }
            }
        }
    }
}

/// `text` cut into pieces of at least `min` bytes where the pre-tokenizers always split: after an
/// ASCII letter and before a space or a newline. A match holding a letter is a letter run (with at most one
/// non-letter, non-newline prefix, or a contraction ending in a letter), which ends at the last
/// letter, and the next match starts at the newline afresh (the regexes have no lookbehind), so
/// the pieces' tokens are the whole text's. (Cutting after a newline is not safe: `\s+(?!\S)`
/// splits a newline run by what follows it.) A text without such a place stays whole.
pub(super) fn pieces(text: &str, min: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let b = rest.as_bytes();
        let mut cut = rest.len();
        let mut i = min.max(1);
        while i < b.len() {
            if b[i - 1].is_ascii_alphabetic() && (b[i] == b'\n' || b[i] == b' ') {
                cut = i;
                break;
            }
            i += 1;
        }
        let (head, tail) = rest.split_at(cut);
        rest = tail;
        Some(head)
    })
}
