//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`): llama.cpp's pre-tokenizer regexes for each
//! `tokenizer.ggml.pre`, the GPT-2 byte-to-unicode tables, and the [`tokenizers`] pipeline (a
//! `Split` per regex, `ByteLevel`, `BPE`) built from the vocabulary and `tokenizer.ggml.merges`.

use std::collections::{HashMap, HashSet};

use sift_gguf::Gguf;
use tokenizers::models::bpe::{Vocab as BpeVocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::Split;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

use super::{bad, string_array, TokenizerError, KEY_TOKENS};

const KEY_MERGES: &str = "tokenizer.ggml.merges";

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

/// Builds the byte-level BPE `tokenizers` pipeline: one isolating `Split` per pre-tokenizer regex,
/// `ByteLevel` (mapping only), then `BPE` from the vocabulary and merges.
pub(super) fn build_bpe(
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
