//! Value parsers for the numeric flags: every number a user types is range-checked when the
//! command line is read, with an error that names the range (clap prints it as
//! `invalid value 'X' for '--flag': ...`, exit 2), so that no value reaches an allocator, a loop
//! bound or the budget arithmetic unchecked: not 2^40 threads, not a NaN ratio, not an infinite
//! TAM margin.

/// A finite number in `lo..hi` (`hi` included when `hi_in`).
fn float_in(s: &str, lo: f64, hi: f64, hi_in: bool) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("'{s}' is not a number"))?;
    let ok = v.is_finite() && v >= lo && (v < hi || (hi_in && v == hi));
    if ok {
        Ok(v)
    } else {
        Err(format!("{s}: use a number from {lo} to {hi}{}", if hi_in { "" } else { " (excluded)" }))
    }
}

/// A share of units skipped, `0 ≤ r < 1` (`--ratio`, `--max-ratio`).
pub fn skip_ratio(s: &str) -> Result<f64, String> {
    float_in(s, 0.0, 1.0, false)
}

/// The same as `f32` (`--sparse-head`, `--prefill-sparsity`, `--tam-lambda`).
pub fn skip_ratio_f32(s: &str) -> Result<f32, String> {
    skip_ratio(s).map(|v| v as f32)
}

/// A ratio step `0 < s ≤ 1` (`calibrate --step`).
pub fn step_f32(s: &str) -> Result<f32, String> {
    match float_in(s, 0.0, 1.0, true) {
        Ok(v) if v > 0.0 => Ok(v as f32),
        _ => Err(format!("{s}: use a step above 0, up to 1")),
    }
}

/// A fraction `0 ≤ f ≤ 1` (`--cache-frac`, `--alpha`, `--tam-eps`, `--top-p`, `--min-p`).
pub fn fraction_f32(s: &str) -> Result<f32, String> {
    float_in(s, 0.0, 1.0, true).map(|v| v as f32)
}

/// A finite weight `0 ≤ w ≤ 1000` (`--gamma`, `--temp`, penalties).
pub fn weight_f32(s: &str) -> Result<f32, String> {
    float_in(s, 0.0, 1000.0, true).map(|v| v as f32)
}

/// A finite weight `0 < w ≤ 1000` (`--repeat-penalty`: logits are divided by it).
pub fn positive_weight_f32(s: &str) -> Result<f32, String> {
    match float_in(s, 0.0, 1000.0, true) {
        Ok(v) if v > 0.0 => Ok(v as f32),
        _ => Err(format!("{s}: use a number above 0, up to 1000")),
    }
}

/// A finite signed weight `−1000 ≤ w ≤ 1000` (presence and frequency penalties).
pub fn signed_weight_f32(s: &str) -> Result<f32, String> {
    float_in(s, -1000.0, 1000.0, true).map(|v| v as f32)
}

/// A learning rate `0 < lr ≤ 10` (`train --lr`, `--compensator-lr`): NaN or infinity would
/// turn every weight into NaN at the first step.
pub fn learning_rate(s: &str) -> Result<f64, String> {
    match float_in(s, 0.0, 10.0, true) {
        Ok(v) if v > 0.0 => Ok(v),
        _ => Err(format!("{s}: use a learning rate above 0, up to 10")),
    }
}

/// Seconds `0 ≤ t ≤ 86400` (`serve --shutdown-grace`): a day at most, never a `Duration` that
/// overflows.
pub fn seconds(s: &str) -> Result<f64, String> {
    float_in(s, 0.0, 86400.0, true)
}

/// A count in `LO..=HI`.
pub fn count_in<const LO: usize, const HI: usize>(s: &str) -> Result<usize, String> {
    let n: usize = s.trim().parse().map_err(|_| format!("'{s}' is not a whole number: use {LO} to {HI}"))?;
    if (LO..=HI).contains(&n) {
        Ok(n)
    } else {
        Err(format!("{n}: use {LO} to {HI}"))
    }
}

/// Tokens of context (`-c`): up to 2^24 (16,777,216; 0 = the model's own where a command says so).
pub const MAX_CTX: usize = 1 << 24;

/// `-c`.
pub fn ctx_size(s: &str) -> Result<usize, String> {
    count_in::<0, MAX_CTX>(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_numbers_are_refused_with_the_range() {
        for bad in ["nan", "inf", "-inf", "1e30", "-0.1", "1", "x", ""] {
            let e = skip_ratio(bad).unwrap_err();
            assert!(e.contains("from 0 to 1") || e.contains("not a number"), "{bad}: {e}");
        }
        assert_eq!(skip_ratio("0.5"), Ok(0.5));
        assert_eq!(fraction_f32("1"), Ok(1.0));
        assert!(fraction_f32("1.01").is_err());
        assert!(weight_f32("inf").is_err() && weight_f32("-1").is_err());
        assert_eq!(signed_weight_f32("-1.5"), Ok(-1.5));
        assert!(ctx_size("1099511627776").unwrap_err().contains("use 0 to 16777216"));
        assert_eq!(ctx_size("4096"), Ok(4096));
        assert!(count_in::<1, 4>("18446744073709551616").is_err());
        for bad in ["0", "nan", "inf", "1e30", "-1e-3"] {
            assert!(learning_rate(bad).is_err(), "{bad}");
        }
        assert_eq!(learning_rate("2e-3"), Ok(2e-3));
        assert!(seconds("1e30").is_err() && seconds("-1").is_err() && seconds("nan").is_err());
        assert_eq!(seconds("5"), Ok(5.0));
    }
}
