//! Tokenizer built from a GGUF file's `tokenizer.ggml.*` metadata, matching llama.cpp's
//! `llama_tokenize` / `llama_detokenize` token for token.
//!
//! Two vocabulary types are supported, chosen by `tokenizer.ggml.model`:
//!
//! - `"gpt2"`: byte-level BPE (SmolLM, Qwen2, Llama 3, ...). Text is split by the pre-tokenizer
//!   regexes that llama.cpp's `llama-vocab.cpp` uses for `tokenizer.ggml.pre`, mapped to bytes with
//!   the GPT-2 byte-to-unicode table and merged by rank (`tokenizer.ggml.merges`). The splitting and
//!   merging run on a [`tokenizers`] pipeline built programmatically (a `Split` per llama.cpp regex,
//!   then `ByteLevel`, then a `BPE` model). Pre-tokenizer names llama.cpp does not know fall back to
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

use std::collections::{HashMap, HashSet};

use sift_gguf::{Gguf, MetaValue};
use tokenizers::models::bpe::{Vocab as BpeVocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::Split;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

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
}

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_MERGES: &str = "tokenizer.ggml.merges";
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
struct PreSpec {
    regexes: Vec<&'static str>,
    ignore_merges: bool,
    clean_spaces: bool,
    /// llama.cpp's default for `add_bos` (overridden by `tokenizer.ggml.add_bos_token`).
    add_bos: bool,
}

fn pre_spec(pre: &str) -> PreSpec {
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
fn byte_tables() -> ([char; 256], HashMap<char, u8>) {
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

enum Engine {
    /// Byte-level BPE on a `tokenizers` pipeline.
    Bpe(Box<tokenizers::Tokenizer>),
    /// SentencePiece BPE: merge by score.
    Spm { byte_tokens: Box<[Option<u32>; 256]> },
}

/// A piece of input after special-token partitioning.
enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

/// A tokenizer for one model; see the module docs for what it matches.
pub struct Tokenizer {
    engine: Engine,
    model: String,
    pre: String,
    tokens: Vec<String>,
    token_to_id: HashMap<String, u32>,
    scores: Vec<f32>,
    attrs: Vec<u8>,
    /// Decoded bytes of every token (control tokens included).
    pieces: Vec<Box<[u8]>>,
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
            .field("vocab_size", &self.tokens.len())
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

fn string_array<'a>(g: &'a Gguf, key: &str) -> Result<Option<Vec<&'a str>>, TokenizerError> {
    let Some(arr) = g.get_array(key) else {
        return Ok(None);
    };
    arr.iter()
        .enumerate()
        .map(|(i, v)| v.as_str().ok_or_else(|| bad(key, format!("element {i} is not a string"))))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn int_of(v: &MetaValue) -> Option<i64> {
    v.as_i64()
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
        let tokens: Vec<String> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| if t.is_empty() { format!("[EMPTY_{i}]") } else { t.to_string() })
            .collect();
        let mut token_to_id = HashMap::with_capacity(n);
        for (i, t) in tokens.iter().enumerate() {
            token_to_id.insert(t.clone(), i as u32);
        }

        let scores = match g.get_array(KEY_SCORES) {
            None => vec![0.0; n],
            Some(a) if a.len() < n => return Err(bad(KEY_SCORES, format!("{} scores for {n} tokens", a.len()))),
            Some(a) => a[..n]
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_f32()
                        .or_else(|| int_of(v).map(|x| x as f32))
                        .ok_or_else(|| bad(KEY_SCORES, format!("element {i} is not a number")))
                })
                .collect::<Result<Vec<f32>, _>>()?,
        };

        let mut attrs = match g.get_array(KEY_TYPES) {
            None => vec![ATTR_NORMAL; n],
            Some(a) if a.len() < n => return Err(bad(KEY_TYPES, format!("{} token types for {n} tokens", a.len()))),
            Some(a) => a[..n]
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let t = int_of(v).ok_or_else(|| bad(KEY_TYPES, format!("element {i} is not an integer")))?;
                    Ok(match t {
                        1 => ATTR_NORMAL,
                        2 => ATTR_UNKNOWN,
                        3 => ATTR_CONTROL,
                        4 => ATTR_USER_DEFINED,
                        5 => ATTR_UNUSED,
                        6 => ATTR_BYTE,
                        _ => 0,
                    })
                })
                .collect::<Result<Vec<u8>, TokenizerError>>()?,
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
                *slot = names.iter().find_map(|t| token_to_id.get(*t).copied());
                if let Some(id) = *slot {
                    attrs[id as usize] |= ATTR_CONTROL;
                }
            }
        }
        let mut eog: HashSet<u32> = [fim_pad, fim_rep, fim_sep, eos, eot, eom].into_iter().flatten().collect();
        for t in EOG_TEXTS {
            if let Some(&id) = token_to_id.get(*t) {
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
            let mut byte_tokens = [None; 256];
            for (b, slot) in byte_tokens.iter_mut().enumerate() {
                *slot = token_to_id
                    .get(&format!("<0x{b:02X}>"))
                    .or_else(|| {
                        char::from_u32(b as u32).filter(|_| b < 128).and_then(|c| token_to_id.get(&c.to_string()))
                    })
                    .copied();
            }
            Engine::Spm { byte_tokens: Box::new(byte_tokens) }
        } else {
            Engine::Bpe(Box::new(build_bpe(g, &tokens, &pre_spec, &b2c)?))
        };

        let pieces = tokens
            .iter()
            .zip(&attrs)
            .map(|(text, &attr)| piece_of(text, attr, is_spm, &c2b).into_boxed_slice())
            .collect();

        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&i| attrs[i as usize] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN) != 0)
            .collect();
        specials.sort_by_key(|&i| std::cmp::Reverse(tokens[i as usize].len()));

        Ok(Tokenizer {
            engine,
            model,
            pre,
            tokens,
            token_to_id,
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
        let fragments = self.partition(text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        match &self.engine {
            Engine::Bpe(hf) => {
                for f in fragments {
                    match f {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(s) => {
                            let enc = hf.encode_fast(s, false).map_err(|e| TokenizerError::Encode(e.to_string()))?;
                            out.extend_from_slice(enc.get_ids());
                        }
                    }
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
                            self.spm_tokenize(&t, byte_tokens, &mut out);
                            prev_special = false;
                        }
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        Ok(out)
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
            let needle = self.tokens[id as usize].as_str();
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

    /// llama.cpp's `llm_tokenizer_spm_session::tokenize` on whitespace-escaped text.
    fn spm_tokenize(&self, text: &str, byte_tokens: &[Option<u32>; 256], out: &mut Vec<u32>) {
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
            if let Some(&id) = self.token_to_id.get(s) {
                heap.push(Bigram { score: self.scores[id as usize], left: l, right: r, size: s.len() });
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
                match self.token_to_id.get(s) {
                    Some(&id) => out.push(id),
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
        let Some(p) = self.pieces.get(id as usize) else {
            return &[];
        };
        if !special && self.attrs[id as usize] & (ATTR_CONTROL | ATTR_UNKNOWN) != 0 {
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
        self.tokens.get(id as usize).map_or("", String::as_str)
    }

    /// The id of the token whose vocabulary text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
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
        self.tokens.len()
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

/// Builds the byte-level BPE `tokenizers` pipeline: one isolating `Split` per pre-tokenizer regex,
/// `ByteLevel` (mapping only), then `BPE` from the vocabulary and merges.
fn build_bpe(
    g: &Gguf,
    tokens: &[String],
    spec: &PreSpec,
    b2c: &[char; 256],
) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let merges_raw = string_array(g, KEY_MERGES)?.ok_or_else(|| TokenizerError::MissingKey(KEY_MERGES.into()))?;
    let vocab: BpeVocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let mut seen = HashSet::with_capacity(merges_raw.len());
    let mut merges = Vec::with_capacity(merges_raw.len());
    for m in merges_raw {
        // llama.cpp splits at the first space after the first byte.
        let Some(pos) = m.as_bytes().iter().skip(1).position(|&b| b == b' ').map(|p| p + 1) else {
            continue;
        };
        let (a, b) = (&m[..pos], &m[pos + 1..]);
        if b.is_empty() || !vocab.contains_key(a) || !vocab.contains_key(b) || !vocab.contains_key(&format!("{a}{b}")) {
            continue;
        }
        // llama.cpp keeps the first rank of a repeated pair.
        if seen.insert((a, b)) {
            merges.push((a.to_string(), b.to_string()));
        }
    }
    // The byte tokens must exist for byte-level BPE to cover every input.
    let missing = b2c.iter().filter(|c| !vocab.contains_key(&c.to_string())).count();
    if missing == 256 {
        return Err(bad(KEY_TOKENS, "byte-level BPE vocabulary has none of the 256 byte tokens"));
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(spec.ignore_merges)
        .build()
        .map_err(|e| TokenizerError::Build(e.to_string()))?;
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
    let mut tk = tokenizers::Tokenizer::new(bpe);
    tk.with_pre_tokenizer(Some(Sequence::new(steps)));
    Ok(tk)
}

/// What llama.cpp's `token_to_piece(.., special = true)` gives for a token.
fn piece_of(text: &str, attr: u8, is_spm: bool, c2b: &HashMap<char, u8>) -> Vec<u8> {
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
fn clean_spaces(t: &mut Vec<u8>) {
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
