//! `general.file_type`: the model file's quantization as llama.cpp names it (its `llama_ftype`
//! and `llama_ftype_name`), which llama-bench and llama-cli print as the model's type.

/// The metadata key.
pub const FILE_TYPE_KEY: &str = "general.file_type";

/// llama.cpp's name for file type `id` (`15` → `Q4_K - Medium`); `None` for an id it does not
/// know. Names as in llama.cpp's `llama_ftype_name` (src/llama-model-loader.cpp).
pub fn file_type_name(id: u64) -> Option<&'static str> {
    Some(match id {
        0 => "all F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K - Medium",
        11 => "Q3_K - Small",
        12 => "Q3_K - Medium",
        13 => "Q3_K - Large",
        14 => "Q4_K - Small",
        15 => "Q4_K - Medium",
        16 => "Q5_K - Small",
        17 => "Q5_K - Medium",
        18 => "Q6_K",
        19 => "IQ2_XXS - 2.0625 bpw",
        20 => "IQ2_XS - 2.3125 bpw",
        21 => "Q2_K - Small",
        22 => "IQ3_XS - 3.3 bpw",
        23 => "IQ3_XXS - 3.0625 bpw",
        24 => "IQ1_S - 1.5625 bpw",
        25 => "IQ4_NL - 4.5 bpw",
        26 => "IQ3_S - 3.4375 bpw",
        27 => "IQ3_S mix - 3.66 bpw",
        28 => "IQ2_S - 2.5 bpw",
        29 => "IQ2_M - 2.7 bpw",
        30 => "IQ4_XS - 4.25 bpw",
        31 => "IQ1_M - 1.75 bpw",
        32 => "BF16",
        36 => "TQ1_0 - 1.69 bpw ternary",
        37 => "TQ2_0 - 2.06 bpw ternary",
        38 => "MXFP4 MoE",
        39 => "NVFP4",
        40 => "Q1_0",
        41 => "Q2_0",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_llama_cpp() {
        assert_eq!(file_type_name(3), Some("Q4_1"));
        assert_eq!(file_type_name(15), Some("Q4_K - Medium"));
        assert_eq!(file_type_name(32), Some("BF16"));
        // Removed or unknown ids.
        assert_eq!(file_type_name(4), None);
        assert_eq!(file_type_name(1024 + 15), None);
    }
}
