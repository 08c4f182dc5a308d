//! `sift simulate --gpu`'s report of hybrid-decode runs ([`crate::hybrid`], and the engine's own
//! decode, [`crate::hybrid_engine`]): one row per GPU budget × policy, as a markdown table or a
//! JSON array, and the adjacent-layer prediction's line.

use crate::hybrid::HybridReport;
use crate::hybrid_engine::AdjacentPrediction;
use std::fmt::Write;

/// One simulated run: the GPU budget as given and in bytes, what went on the GPU, the result.
pub struct HybridRow {
    pub gpu_memory: String,
    pub gpu_bytes: u64,
    pub placed: String,
    pub report: HybridReport,
}

/// The rows as a JSON array: each report with `gpu_memory`, `gpu_bytes` and `placed` added.
pub fn json(rows: &[HybridRow]) -> serde_json::Result<String> {
    let v: Vec<serde_json::Value> = rows
        .iter()
        .map(|row| {
            let mut v = serde_json::to_value(&row.report).unwrap_or_default();
            v["gpu_memory"] = serde_json::json!(row.gpu_memory);
            v["gpu_bytes"] = serde_json::json!(row.gpu_bytes);
            v["placed"] = serde_json::json!(row.placed);
            v
        })
        .collect();
    serde_json::to_string_pretty(&v)
}

/// The rows as a markdown table; `placed` heads the column that says what went on the GPU, and
/// `align` is its alignment mark (`---` or `---:`).
pub fn markdown(rows: &[HybridRow], placed: &str, align: &str) -> String {
    let mut s = format!(
        "| GPU memory | {placed} | policy | tok/s | p50 ms | p99 ms | reloads/token | MiB/token | CPU share | stall share |\n|---|{align}|---|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    for row in rows {
        let r = &row.report;
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.1} | {:.2} | {:.2} | {:.1} | {:.2} | {:.1}% | {:.1}% |",
            row.gpu_memory,
            row.placed,
            r.policy,
            r.tok_s,
            r.p50_ns / 1e6,
            r.p99_ns / 1e6,
            r.reloads_per_token,
            r.reload_bytes_per_token / (1 << 20) as f64,
            100.0 * r.cpu_share,
            100.0 * r.stall_share
        );
    }
    s
}

/// KAIROX's adjacent-layer prediction scored on a trace, in groups of `group_size` channels, as
/// one line.
pub fn prediction_line(pred: &AdjacentPrediction, group_size: usize) -> String {
    format!(
        "adjacent-layer prediction of the FFN input's channels (layer l's attention output for layer l + 1, {} token-layer pairs): recall {:.1}%, precision {:.1}%; of its {group_size}-channel groups: recall {:.1}%, precision {:.1}%; the token before's channels: recall {:.1}%",
        pred.pairs,
        100.0 * pred.channel_recall,
        100.0 * pred.channel_precision,
        100.0 * pred.group_recall,
        100.0 * pred.group_precision,
        100.0 * pred.previous_token_recall
    )
}
