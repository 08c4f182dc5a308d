//! Tokenizer built from a GGUF file's `tokenizer.ggml.*` metadata, matching llama.cpp's
//! `llama_tokenize` / `llama_detokenize` token for token.
//!
//! Two vocabulary types are supported, chosen by `tokenizer.ggml.model`:
//!
//! - `"gpt2"`: byte-level BPE (SmolLM, Qwen2, Llama 3, ...). Text is split by the pre-tokenizer
//!   regexes that llama.cpp's `llama-vocab.cpp` uses for `tokenizer.ggml.pre`, mapped to bytes with
//!   the GPT-2 byte-to-unicode table and merged by rank (`tokenizer.ggml.merges`). The splitting
//!   runs on a [`tokenizers`] pre-tokenizer built programmatically (a `Split` per llama.cpp regex,
//!   then `ByteLevel`); the merging is sift's own over compact tables ([`bpe`] says why). Pre-tokenizer names llama.cpp does not know fall back to
//!   the GPT-2 regex (`'s|'t|... ?\p{L}+| ?\p{N}+|...`) instead of failing; a missing or `"default"`
//!   `pre` uses llama.cpp's default regex set.
//! - `"llama"`: SentencePiece BPE (Llama 2, TinyLlama, Mistral). A port of llama.cpp's SPM
//!   tokenizer: spaces become `▁`, a leading space is added (`tokenizer.ggml.add_space_prefix`,
//!   default true), adjacent symbols merge greedily by the vocabulary score of the merged piece, and
//!   pieces with no token fall back to `<0xXX>` byte tokens.
//!
//! Any other `tokenizer.ggml.model` is a [`TokenizerError::UnsupportedModel`] naming it.
//!
//! Special tokens follow llama.cpp: tokens of type CONTROL (3) and UNKNOWN (2) are matched in the
//! input only when `parse_special` is true; USER_DEFINED (4) tokens are always matched; longer
//! tokens are matched first. NORMAL (1), BYTE (6), UNUSED (5) and UNDEFINED (0) tokens never are.
//! End-of-generation tokens ([`Tokenizer::is_eog`]) are EOS, EOT, EOM, the FIM pad/repo/file-sep
//! tokens and every token whose text is one of llama.cpp's end markers (`<|im_end|>`,
//! `<|endoftext|>`, `<|eot_id|>`, `<end_of_turn>`, ...).
//!
//! Decoding ([`Tokenizer::decode`], [`StreamDecoder`]) returns the bytes of each token's piece:
//! byte-level BPE pieces are mapped back through the GPT-2 table, SentencePiece `▁` becomes a space,
//! `<0xXX>` tokens become their byte. Control tokens decode to nothing unless asked for.

use std::collections::HashSet;

use sift_gguf::{Gguf, MetaArray, MetaValue, StrArray};

mod bpe;
mod encode_reader;
mod piece;
mod spm;
mod stream;
mod vocab;

pub use encode_reader::{EncodeReader, EncodeReaderError, READ_PIECE};
pub use stream::StreamDecoder;

use bpe::{byte_tables, pre_spec, BpeEngine};
use piece::{clean_spaces, piece_of};
use vocab::{Packed, Vocab};

/// Errors raised while building a tokenizer from metadata or while encoding text.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer metadata is missing '{0}'; the GGUF file carries no usable tokenizer")]
    MissingKey(String),
    #[error("tokenizer metadata '{key}' is invalid: {why}")]
    BadKey { key: String, why: String },
    #[error("unsupported tokenizer model '{0}' (tokenizer.ggml.model): sift supports 'gpt2' (byte-level BPE) and 'llama' (SentencePiece)")]
    UnsupportedModel(String),
    #[error("building the BPE tokenizer failed: {0}")]
    Build(String),
    #[error("tokenizing failed: {0}")]
    Encode(String),
    #[error("the text has more than {limit} tokens")]
    TooManyTokens { limit: usize },
}

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_TYPES: &str = "tokenizer.ggml.token_type";
const KEY_SCORES: &str = "tokenizer.ggml.scores";

// Token attributes, as llama.cpp's `llama_token_attr` bits.
const ATTR_UNKNOWN: u8 = 1 << 0;
const ATTR_UNUSED: u8 = 1 << 1;
const ATTR_NORMAL: u8 = 1 << 2;
const ATTR_CONTROL: u8 = 1 << 3;
const ATTR_USER_DEFINED: u8 = 1 << 4;
const ATTR_BYTE: u8 = 1 << 5;

/// Token texts llama.cpp treats as end of generation (`special_eog_ids`).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Token texts llama.cpp picks the EOT token from when `tokenizer.ggml.eot_token_id` is absent, in
/// order of preference.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

enum Engine {
    /// Byte-level BPE: the `tokenizers` pre-tokenizer, then merges by rank.
    Bpe(Box<BpeEngine>),
    /// SentencePiece BPE: merge by score.
    Spm { byte_tokens: Box<[Option<u32>; 256]> },
}

/// A piece of input after special-token partitioning.
enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

/// Bytes of text byte-level BPE pre-tokenizes at a time ([`Tokenizer::encode_in_pieces`]).
pub const ENCODE_PIECE: usize = 64 << 10;

/// A tokenizer for one model; see the module docs for what it matches.
pub struct Tokenizer {
    engine: Engine,
    model: String,
    pre: String,
    vocab: Vocab,
    /// SentencePiece merge scores by id (empty for byte-level BPE, which merges by rank).
    scores: Vec<f32>,
    attrs: Vec<u8>,
    /// Decoded bytes of every token (control tokens included).
    pieces: Packed,
    /// Tokens matched in the input before tokenization, longest text first.
    specials: Vec<u32>,
    eog: HashSet<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    pad: Option<u32>,
    unk: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("model", &self.model)
            .field("pre", &self.pre)
            .field("vocab_size", &self.vocab.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eot", &self.eot)
            .field("add_bos", &self.add_bos)
            .finish_non_exhaustive()
    }
}

fn bad(key: &str, why: impl Into<String>) -> TokenizerError {
    TokenizerError::BadKey { key: key.to_string(), why: why.into() }
}

fn string_array<'a>(g: &'a Gguf, key: &str) -> Result<Option<&'a StrArray>, TokenizerError> {
    let Some(arr) = g.get_array(key) else {
        return Ok(None);
    };
    match arr.strings() {
        Some(s) => Ok(Some(s)),
        None if arr.is_empty() => Ok(Some(&EMPTY_STRINGS)),
        None => Err(bad(key, "the array's elements are not strings")),
    }
}

static EMPTY_STRINGS: StrArray = StrArray::new();

fn int_of(v: &MetaValue) -> Option<i64> {
    v.as_i64()
}

/// The first `n` elements of a numeric array as `T` (`of` converts one element), naming `key` in
/// the error when one is not a number. Packed `f32`/`i32` arrays are read without conversion.
fn numbers<T: Copy>(
    a: &MetaArray,
    n: usize,
    key: &str,
    of: impl Fn(&MetaValue) -> Option<T>,
) -> Result<Vec<T>, TokenizerError> {
    let all: Option<Vec<T>> = match a {
        MetaArray::F32(v) => v[..n].iter().map(|&x| of(&MetaValue::F32(x))).collect(),
        MetaArray::I32(v) => v[..n].iter().map(|&x| of(&MetaValue::I32(x))).collect(),
        MetaArray::Values(v) => v[..n].iter().map(&of).collect(),
        MetaArray::Strings(_) => None,
    };
    all.ok_or_else(|| bad(key, "an element is not a number"))
}

fn opt_bool(g: &Gguf, key: &str) -> Result<Option<bool>, TokenizerError> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => v.as_bool().map(Some).ok_or_else(|| bad(key, "expected a boolean")),
    }
}

/// A token id from `key`, or `default` when absent. Like llama.cpp, an id outside the vocabulary
/// is ignored (the default is kept) rather than fatal.
fn token_id(g: &Gguf, key: &str, default: Option<u32>, n_vocab: usize) -> Result<Option<u32>, TokenizerError> {
    let default = default.filter(|&d| (d as usize) < n_vocab);
    let Some(v) = g.get(key) else {
        return Ok(default);
    };
    let id = int_of(v).ok_or_else(|| bad(key, "expected an integer token id"))?;
    Ok(match u32::try_from(id) {
        Ok(id) if (id as usize) < n_vocab => Some(id),
        _ => default,
    })
}

impl Tokenizer {
    /// The metadata arrays a tokenizer copies its tables from. Once it is built, a process that
    /// keeps the GGUF's metadata can give these back ([`Gguf::take_metadata`]): for Qwen2.5's
    /// 152k-token vocabulary they hold about 5 MB the budget would otherwise count twice. The
    /// model's configuration reads the vocabulary's size from them, so drop them only after it.
    pub const SOURCE_TABLES: [&'static str; 4] = [KEY_TOKENS, KEY_TYPES, KEY_SCORES, bpe::KEY_MERGES];

    /// Builds the tokenizer of a GGUF model from its `tokenizer.ggml.*` metadata.
    pub fn from_gguf(g: &Gguf) -> Result<Tokenizer, TokenizerError> {
        let model = g
            .get(KEY_MODEL)
            .ok_or_else(|| TokenizerError::MissingKey(KEY_MODEL.into()))?
            .as_str()
            .ok_or_else(|| bad(KEY_MODEL, "expected a string"))?
            .to_string();
        let is_spm = match model.as_str() {
            "gpt2" => false,
            "llama" => true,
            _ => return Err(TokenizerError::UnsupportedModel(model)),
        };
        let pre = match g.get(KEY_PRE) {
            Some(v) => v.as_str().ok_or_else(|| bad(KEY_PRE, "expected a string"))?.to_string(),
            None => String::new(),
        };

        let texts = string_array(g, KEY_TOKENS)?.ok_or_else(|| TokenizerError::MissingKey(KEY_TOKENS.into()))?;
        if texts.is_empty() || texts.len() > u32::MAX as usize / 2 {
            return Err(bad(KEY_TOKENS, format!("{} tokens", texts.len())));
        }
        let n = texts.len();
        let vocab = Vocab::new(texts.iter())?;

        let scores = match g.get_array(KEY_SCORES) {
            None => Vec::new(),
            Some(_) if !is_spm => Vec::new(),
            Some(a) if a.len() < n => return Err(bad(KEY_SCORES, format!("{} scores for {n} tokens", a.len()))),
            Some(a) => numbers(a, n, KEY_SCORES, |v| v.as_f32())?,
        };

        let mut attrs = match g.get_array(KEY_TYPES) {
            None => vec![ATTR_NORMAL; n],
            Some(a) if a.len() < n => return Err(bad(KEY_TYPES, format!("{} token types for {n} tokens", a.len()))),
            Some(a) => numbers(a, n, KEY_TYPES, |v| v.as_i64())?
                .into_iter()
                .map(|t| match t {
                    1 => ATTR_NORMAL,
                    2 => ATTR_UNKNOWN,
                    3 => ATTR_CONTROL,
                    4 => ATTR_USER_DEFINED,
                    5 => ATTR_UNUSED,
                    6 => ATTR_BYTE,
                    _ => 0,
                })
                .collect(),
        };

        // Defaults as in llama.cpp's llama_vocab::impl::load.
        let (def_bos, def_eos, def_unk) = if is_spm { (Some(1), Some(2), Some(0)) } else { (Some(11), Some(11), None) };
        let bos = token_id(g, "tokenizer.ggml.bos_token_id", def_bos, n)?;
        let eos = token_id(g, "tokenizer.ggml.eos_token_id", def_eos, n)?;
        let unk = token_id(g, "tokenizer.ggml.unknown_token_id", def_unk, n)?;
        let pad = token_id(g, "tokenizer.ggml.padding_token_id", None, n)?;
        let mut eot = token_id(g, "tokenizer.ggml.eot_token_id", None, n)?;
        let mut eom = token_id(g, "tokenizer.ggml.eom_token_id", None, n)?;
        let mut fim_pad = token_id(g, "tokenizer.ggml.fim_pad_token_id", None, n)?;
        let mut fim_rep = token_id(g, "tokenizer.ggml.fim_rep_token_id", None, n)?;
        let mut fim_sep = token_id(g, "tokenizer.ggml.fim_sep_token_id", None, n)?;

        // Auto-detect the EOT/EOM/FIM tokens by their text and make them control tokens.
        for (slot, names) in [
            (&mut eot, EOT_TEXTS),
            (&mut eom, EOM_TEXTS),
            (&mut fim_pad, FIM_PAD_TEXTS),
            (&mut fim_rep, FIM_REP_TEXTS),
            (&mut fim_sep, FIM_SEP_TEXTS),
        ] {
            if slot.is_none() {
                *slot = names.iter().find_map(|t| vocab.id(t));
                if let Some(id) = *slot {
                    attrs[id as usize] |= ATTR_CONTROL;
                }
            }
        }
        let mut eog: HashSet<u32> = [fim_pad, fim_rep, fim_sep, eos, eot, eom].into_iter().flatten().collect();
        for t in EOG_TEXTS {
            if let Some(id) = vocab.id(t) {
                eog.insert(id);
                attrs[id as usize] |= ATTR_CONTROL;
            }
        }

        let pre_spec = pre_spec(&pre);
        let (mut add_bos, mut add_eos, mut add_space_prefix, clean_spaces) =
            if is_spm { (true, false, true, false) } else { (pre_spec.add_bos, false, false, pre_spec.clean_spaces) };
        if let Some(b) = opt_bool(g, "tokenizer.ggml.add_bos_token")? {
            add_bos = b;
        }
        if let Some(b) = opt_bool(g, "tokenizer.ggml.add_eos_token")? {
            add_eos = b;
        }
        if let Some(b) = opt_bool(g, "tokenizer.ggml.add_space_prefix")? {
            add_space_prefix = b;
        }
        if add_bos && bos.is_none() {
            return Err(bad("tokenizer.ggml.bos_token_id", "add_bos_token is set but there is no BOS token"));
        }
        if add_eos && eos.is_none() {
            return Err(bad("tokenizer.ggml.eos_token_id", "add_eos_token is set but there is no EOS token"));
        }

        let (b2c, c2b) = byte_tables();
        let engine = if is_spm {
            Engine::Spm { byte_tokens: Box::new(spm::byte_tokens(&vocab)) }
        } else {
            Engine::Bpe(Box::new(BpeEngine::new(g, &vocab, &pre_spec, &b2c)?))
        };

        let mut pieces = Packed::default();
        for (i, &attr) in attrs.iter().enumerate() {
            pieces.push(&piece_of(vocab.text(i as u32), attr, is_spm, &c2b), KEY_TOKENS)?;
        }
        pieces.shrink_to_fit();

        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&i| attrs[i as usize] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN) != 0)
            .collect();
        specials.sort_by_key(|&i| std::cmp::Reverse(vocab.text(i).len()));

        Ok(Tokenizer {
            engine,
            model,
            pre,
            vocab,
            scores,
            attrs,
            pieces,
            specials,
            eog,
            bos,
            eos,
            eot,
            eom,
            pad,
            unk,
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces,
        })
    }

    /// Tokenizes `text` like llama.cpp's `llama_tokenize(vocab, text, add_special, parse_special)`:
    /// `add_special` adds BOS/EOS where the model's metadata asks for them; `parse_special` lets
    /// control tokens written in the text (`<|im_start|>`) become their token instead of being
    /// tokenized as plain text.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        self.encode_in_pieces(text, add_special, parse_special, ENCODE_PIECE)
    }

    /// [`Tokenizer::encode`] with byte-level BPE's pre-tokenization done in pieces of about
    /// `piece` bytes (the same tokens for any `piece`; tests use small ones).
    #[doc(hidden)]
    pub fn encode_in_pieces(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
        piece: usize,
    ) -> Result<Vec<u32>, TokenizerError> {
        self.encode_limited(text, add_special, parse_special, piece, usize::MAX)
    }

    /// [`Tokenizer::encode`], stopping with [`TokenizerError::TooManyTokens`] as soon as the text
    /// is known to have more than `max` tokens (a prompt longer than the context: neither all its
    /// ids nor the tokenizer's work on the rest are ever held).
    pub fn encode_at_most(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
        max: usize,
    ) -> Result<Vec<u32>, TokenizerError> {
        self.encode_limited(text, add_special, parse_special, ENCODE_PIECE, max)
    }

    /// The first `n` tokens of `text` (all of them if it has fewer): the same ids as the start
    /// of [`Tokenizer::encode`]'s, the text tokenized only a piece past them.
    pub fn encode_prefix(&self, text: &str, add_special: bool, parse_special: bool, n: usize) -> Vec<u32> {
        let (mut out, _) = self.encode_bounded(text, add_special, parse_special, ENCODE_PIECE, n);
        out.truncate(n);
        out
    }

    /// The most bytes of text one token stands for: a text of `n` bytes has at least
    /// `n / max_piece_bytes()` tokens (a check on a prompt's size before it is read).
    pub fn max_piece_bytes(&self) -> usize {
        (0..self.pieces.len() as u32).map(|id| self.piece(id).len()).max().unwrap_or(1).max(1)
    }

    fn encode_limited(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
        piece: usize,
        limit: usize,
    ) -> Result<Vec<u32>, TokenizerError> {
        match self.encode_bounded(text, add_special, parse_special, piece, limit) {
            (_, Some(e)) => Err(e),
            (out, None) => Ok(out),
        }
    }

    /// The tokens, stopping once there are more than `limit` (then with the reason: the tokens
    /// so far are the start of the text's, or the tokenizer's error).
    fn encode_bounded(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
        piece: usize,
        limit: usize,
    ) -> (Vec<u32>, Option<TokenizerError>) {
        let mut out = Vec::new();
        let r = self.encode_into(text, add_special, parse_special, piece, limit, &mut out);
        (out, r.err())
    }

    fn encode_into(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
        piece: usize,
        limit: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        let fragments = self.partition(text, parse_special);
        let too_many = |out: &Vec<u32>| {
            if out.len() > limit {
                Err(TokenizerError::TooManyTokens { limit })
            } else {
                Ok(())
            }
        };
        out.reserve((text.len() / 3 + 2).min(limit.saturating_add(2)));
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        match &self.engine {
            Engine::Bpe(bpe) => {
                for f in fragments {
                    match f {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(s) => bpe.encode(s, &self.vocab, out, piece, limit)?,
                    }
                    too_many(out)?;
                }
            }
            Engine::Spm { byte_tokens } => {
                let mut prev_special = true;
                for f in fragments {
                    match f {
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                        Fragment::Text(s) => {
                            let mut t = String::with_capacity(s.len() + 4);
                            if self.add_space_prefix && prev_special {
                                t.push(' ');
                            }
                            t.push_str(s);
                            let t = t.replace(' ', "\u{2581}");
                            self.spm_tokenize(&t, byte_tokens, out);
                            prev_special = false;
                        }
                    }
                    too_many(out)?;
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        Ok(())
    }

    /// Splits `text` around special tokens (llama.cpp's `tokenizer_st_partition`).
    fn partition<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        // Each fragment: Err(id) for a special token, Ok((start, end)) for unprocessed text.
        let mut frags: Vec<Result<(usize, usize), u32>> = Vec::new();
        if text.is_empty() {
            return Vec::new();
        }
        frags.push(Ok((0, text.len())));
        for &id in &self.specials {
            if !parse_special && self.attrs[id as usize] & (ATTR_CONTROL | ATTR_UNKNOWN) != 0 {
                continue;
            }
            let needle = self.vocab.text(id);
            if !text.contains(needle) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Ok((mut start, end)) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(pos) = text[start..end].find(needle) {
                    let m = start + pos;
                    if m > start {
                        next.push(Ok((start, m)));
                    }
                    next.push(Err(id));
                    start = m + needle.len();
                }
                if start < end {
                    next.push(Ok((start, end)));
                }
            }
            frags = next;
        }
        frags
            .into_iter()
            .map(|f| match f {
                Ok((s, e)) => Fragment::Text(&text[s..e]),
                Err(id) => Fragment::Token(id),
            })
            .collect()
    }

    /// Decodes `ids` to text like llama.cpp's `llama_detokenize(..., remove_special = skip_special,
    /// unparse_special = !skip_special)`: with `skip_special`, control tokens produce no text and a
    /// leading BOS / trailing EOS that the model adds itself are dropped. Invalid UTF-8 (a sequence
    /// cut in the middle of a multi-byte character) becomes U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        let bytes = self.decode_bytes(ids, skip_special);
        match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }

    /// [`Tokenizer::decode`] without the UTF-8 conversion.
    pub fn decode_bytes(&self, mut ids: &[u32], skip_special: bool) -> Vec<u8> {
        let mut remove_space = self.add_space_prefix;
        if skip_special && self.add_bos && !ids.is_empty() && Some(ids[0]) == self.bos {
            remove_space = false;
            ids = &ids[1..];
        }
        if skip_special && self.add_eos && !ids.is_empty() && Some(ids[ids.len() - 1]) == self.eos {
            ids = &ids[..ids.len() - 1];
        }
        let mut out = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            let mut p = self.piece_opt(id, !skip_special);
            if remove_space {
                if let [b' ', rest @ ..] = p {
                    p = rest;
                }
            }
            remove_space = false;
            out.extend_from_slice(p);
        }
        if self.clean_spaces {
            clean_spaces(&mut out);
        }
        out
    }

    /// The piece of `id`, or nothing for a control/unknown token when `special` is false.
    fn piece_opt(&self, id: u32, special: bool) -> &[u8] {
        let p = self.pieces.get(id as usize);
        if !special && self.attrs.get(id as usize).is_some_and(|a| a & (ATTR_CONTROL | ATTR_UNKNOWN) != 0) {
            return &[];
        }
        p
    }

    /// The raw bytes token `id` stands for (byte-level / `▁` / `<0xXX>` decoded). Control tokens
    /// give their text (`<|im_end|>`); unused tokens and ids outside the vocabulary give nothing.
    /// A piece need not be valid UTF-8 on its own.
    pub fn token_to_piece(&self, id: u32) -> Vec<u8> {
        self.piece(id).to_vec()
    }

    /// [`Tokenizer::token_to_piece`] without the copy.
    pub fn piece(&self, id: u32) -> &[u8] {
        self.piece_opt(id, true)
    }

    /// The token's text as stored in the vocabulary (byte-level BPE tokens are in GPT-2's
    /// byte-to-unicode alphabet, e.g. `Ġthe`); "" for an id outside the vocabulary.
    pub fn token_str(&self, id: u32) -> &str {
        self.vocab.text(id)
    }

    /// The id of the token whose vocabulary text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.id(text)
    }

    /// Whether `id` is a control or unknown token: text that [`Tokenizer::decode`] drops when
    /// skipping specials and [`Tokenizer::encode`] matches only with `parse_special`.
    pub fn is_special(&self, id: u32) -> bool {
        self.attrs.get(id as usize).is_some_and(|a| a & (ATTR_CONTROL | ATTR_UNKNOWN) != 0)
    }

    /// Whether generating `id` ends the turn (llama.cpp's `llama_vocab_is_eog`).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// All end-of-generation token ids, sorted.
    pub fn eog_ids(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.eog.iter().copied().collect();
        v.sort_unstable();
        v
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// End-of-turn token (`<|im_end|>`, `<|eot_id|>`, ...), from metadata or detected by text.
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }

    /// End-of-message token (`<|eom_id|>`).
    pub fn eom(&self) -> Option<u32> {
        self.eom
    }

    pub fn pad(&self) -> Option<u32> {
        self.pad
    }

    pub fn unk(&self) -> Option<u32> {
        self.unk
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `encode(.., add_special = true, ..)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    /// `tokenizer.ggml.model` ("gpt2" or "llama").
    pub fn model_name(&self) -> &str {
        &self.model
    }

    /// `tokenizer.ggml.pre` ("" when absent).
    pub fn pre(&self) -> &str {
        &self.pre
    }
}
