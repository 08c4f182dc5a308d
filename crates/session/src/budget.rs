//! Budgets as users write them, and the process's own memory measured one way.
//!
//! Every place that plans a budget (`--memory` on any command, `sift plan`, `sift trace`, the
//! server) counts the process's *runtime* the same way: [`runtime_bytes`], the resident set
//! (the code, the heap with the tokenizer's tables, the allocator) less the model file's mapped
//! pages and less the model bytes the plan counts separately as resident weights, plus
//! [`RUNTIME_SLACK`]. The budget holds the whole resident set, so the code's pages count too;
//! a mapped model's pages do not (a budgeted run never maps its weights).

use std::path::{Path, PathBuf};

/// Headroom added to the measured runtime: allocations the run makes later (per-request
/// buffers, the allocator's own growth).
pub const RUNTIME_SLACK: u64 = 8 << 20;

/// The largest budget a user may write: 1 PiB (beyond any machine; larger values, such as
/// "1e30", would overflow the budget arithmetic).
pub const MAX_BUDGET: u64 = 1 << 50;

/// Parses "700M", "1.5G", "123456", "60%" (of `model_size`); at most [`MAX_BUDGET`].
pub fn parse_budget(s: &str, model_size: u64) -> anyhow::Result<u64> {
    let b = parse_budget_unchecked(s, model_size)?;
    anyhow::ensure!(b <= MAX_BUDGET, "--memory '{s}' is {b} bytes or more: budgets go up to 1 PiB (1048576G)");
    Ok(b)
}

fn parse_budget_unchecked(s: &str, model_size: u64) -> anyhow::Result<u64> {
    let t = s.trim();
    let bad = || {
        anyhow::anyhow!("bad --memory '{s}': use bytes with an optional K/M/G suffix (700M, 1.5G) or a percentage of the model size (60%)")
    };
    if let Some(p) = t.strip_suffix('%') {
        let v: f64 = p.trim().parse().map_err(|_| bad())?;
        anyhow::ensure!(v > 0.0 && v.is_finite(), bad());
        return Ok((model_size as f64 * v / 100.0) as u64);
    }
    let lower = t.to_ascii_lowercase();
    let lower = lower.trim_end_matches("ib").trim_end_matches('b');
    let (num, mult) = match lower.chars().last() {
        Some('k') => (&lower[..lower.len() - 1], 1u64 << 10),
        Some('m') => (&lower[..lower.len() - 1], 1 << 20),
        Some('g') => (&lower[..lower.len() - 1], 1 << 30),
        _ => (lower, 1),
    };
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    anyhow::ensure!(v > 0.0 && v.is_finite(), bad());
    Ok((v * mult as f64) as u64)
}

/// The process's runtime memory now (see the module docs): its resident set less the pages of
/// the model `files` it maps (a pack and its source GGUF) and less `held` (model bytes read into memory that the plan counts as
/// resident weights), plus [`RUNTIME_SLACK`].
pub fn runtime_bytes(files: &[&Path], held: u64) -> u64 {
    trim_heap();
    let skip: Vec<PathBuf> =
        files.iter().map(|f| std::fs::canonicalize(f).unwrap_or_else(|_| f.to_path_buf())).collect();
    let rss = match std::fs::read_to_string("/proc/self/smaps") {
        Ok(smaps) => rss_outside(&smaps, &skip),
        Err(_) => status_bytes("VmRSS:").unwrap_or(0),
    };
    rss.saturating_sub(held) + RUNTIME_SLACK
}

/// Gives the heap's free pages back to the OS (glibc keeps what building the tokenizer and
/// parsing the GGUF's metadata allocated and freed), so the process holds, and a budget counts,
/// only what it uses.
pub fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks and releases glibc's own free heap memory; it takes no
    // pointers from us and is safe to call at any time from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Keeps large freed blocks in the heap for reuse instead of unmapping them (glibc maps blocks
/// over 128 KiB-32 MiB afresh and returns them on free: a training step that allocates and frees
/// hundreds of tensors of megabytes spends a third of its time in page faults). For work outside
/// a memory budget (`sift train`); [`trim_heap`] gives the memory back.
pub fn keep_large_blocks() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets glibc allocator parameters; it takes no pointers and may be
    // called at any time.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

/// Returns large freed blocks to the system at once (a server under a budget): blocks of 256 KiB
/// and more are mapped afresh and unmapped when freed, and the heap's free top is trimmed past
/// 1 MiB. glibc's default raises its mapping threshold to the largest block freed (up to 32
/// MiB), after which a request's answer of megabytes stays in the heap once sent: four 2 MB
/// `/tokenize` answers left a budgeted server 17 MiB over its budget.
pub fn release_large_blocks() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets glibc allocator parameters; it takes no pointers and may be
    // called at any time.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 20);
    }
}

/// The resident bytes of every mapping in `smaps` (the text of /proc/PID/smaps) but those of
/// the files `skip`.
fn rss_outside(smaps: &str, skip: &[PathBuf]) -> u64 {
    let skip: Vec<String> = skip.iter().map(|p| p.to_string_lossy().to_string()).collect();
    let mut total = 0;
    let mut skipping = false;
    for line in smaps.lines() {
        let mut f = line.split_whitespace();
        let first = f.next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            // A mapping's header: range perms offset dev inode [path].
            let path = f.nth(4).map(|_| line.splitn(6, char::is_whitespace).last().unwrap_or("").trim());
            skipping = path.is_some_and(|p| skip.iter().any(|s| s == p));
        } else if first == "Rss:" && !skipping {
            total += f.next().and_then(|kb| kb.parse::<u64>().ok()).unwrap_or(0) * 1024;
        }
    }
    total
}

/// Peak resident memory of this process (VmHWM), in bytes, if the OS reports it.
pub fn peak_rss_bytes() -> Option<u64> {
    status_bytes("VmHWM:")
}

/// Memory the OS says it can give without swapping (`MemAvailable`), in bytes, if it says.
pub fn available_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// A `/proc/self/status` field given in kB, in bytes.
fn status_bytes(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

pub(crate) fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_parse_like_a_user_writes_them() {
        assert_eq!(parse_budget("700M", 0).unwrap(), 700 << 20);
        assert_eq!(parse_budget("700MiB", 0).unwrap(), 700 << 20);
        assert_eq!(parse_budget("1.5G", 0).unwrap(), 3 << 29);
        assert_eq!(parse_budget("4096", 0).unwrap(), 4096);
        assert_eq!(parse_budget("60%", 1000).unwrap(), 600);
        for bad in ["", "abc", "-5M", "0", "60%%", "nan", "1e30", "inf", "1e300%", "2000000G"] {
            assert!(parse_budget(bad, 1000).is_err(), "{bad}");
        }
    }

    #[test]
    fn runtime_grows_with_the_heap_and_excludes_what_is_held() {
        let exe = std::env::current_exe().unwrap();
        let before = runtime_bytes(&[&exe], 0);
        let block = std::hint::black_box(vec![1u8; 64 << 20]);
        let (all, less_held) = (runtime_bytes(&[&exe], 0), runtime_bytes(&[&exe], block.len() as u64));
        assert!(all >= before + (60 << 20), "64 MiB touched: {before} -> {all}");
        assert!((all - less_held).abs_diff(64 << 20) < (1 << 20), "held bytes are subtracted");
        drop(std::hint::black_box(block));
    }

    #[test]
    fn a_mapped_files_pages_are_not_runtime() {
        let smaps = "\
55d0c0000000-55d0c0100000 r-xp 00000000 08:01 123 /usr/bin/sift
Rss:                1024 kB
7f0000000000-7f0010000000 r--s 00000000 08:01 456 /models/my model.sift
Rss:              262144 kB
7f0020000000-7f0020100000 rw-p 00000000 00:00 0
Rss:                2048 kB
";
        assert_eq!(rss_outside(smaps, &[PathBuf::from("/models/my model.sift")]), 3072 * 1024);
        assert_eq!(rss_outside(smaps, &[PathBuf::from("/elsewhere")]), (3072 + 262144) * 1024);
    }
}
