//! `sift simulate`'s report of replayed runs ([`crate::replay`]): the markdown table, and for
//! `--sweep DIR` the CSV and SVG charts (hit rate, speed and reads against the cache's size; λ and
//! loads per token for adaptive TAM).

use crate::profile::DeviceProfile;
use crate::replay::SimReport;
use sift_eval::plot::{Chart, Series};
use std::fmt::Write;
use std::path::Path;

fn mib(b: f64) -> f64 {
    b / (1 << 20) as f64
}

/// The runs as a markdown table, after a line naming the profile, the decoded tokens and `trace`.
pub fn markdown(reports: &[SimReport], profile: &DeviceProfile, tokens: usize, trace: &Path) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "simulated on **{}** ({}), {} decoded tokens of `{}`\n",
        profile.name,
        profile.source,
        tokens,
        trace.display()
    );
    s.push_str("| budget | policy | preload | selector | cache | hit rate (bytes) | read/token | preload/token | must read/token | amplification | tok/s | bound tok/s | % of bound | compute s | stall s |\n");
    s.push_str("|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in reports {
        let per = |b: u64| mib(b as f64) / r.tokens.max(1) as f64;
        let t = &r.telemetry;
        let _ = writeln!(
            s,
            "| {:.0} MiB | {} | {} | {} | {:.0} MiB ({:.0}%) | {:.1}% ({:.1}%) | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.2} | {:.2} | {:.2} | {:.0}% | {:.2} | {:.2} |",
            mib(r.budget as f64),
            r.policy,
            r.preload,
            r.selector,
            mib(r.plan.cache as f64),
            r.plan.cache_fraction * 100.0,
            r.hit_rate * 100.0,
            t.hit_rate_bytes * 100.0,
            per(r.stats.bytes_read()),
            per(r.stats.bytes_preload),
            mib(t.bound.must_read_per_token),
            t.read_amplification,
            r.tok_s,
            t.bound.tok_s,
            t.pct_of_bound,
            r.compute_s,
            r.stall_s
        );
    }
    s
}

/// `--sweep DIR`'s files, by name: results.csv, hitrate.svg, tps.svg and reads.svg, and per
/// adaptive TAM run N lambda-N.svg and loads-N.svg.
pub fn sweep_files(reports: &[SimReport]) -> Vec<(String, String)> {
    let mut csv = String::from(
        "budget_bytes,policy,preload,selector,cache_bytes,cache_fraction,hit_rate,bytes_preload,bytes_ondemand,tokens,tok_s,compute_s,stall_s\n",
    );
    for r in reports {
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{:.4},{:.4},{},{},{},{:.4},{:.4},{:.4}",
            r.budget,
            r.policy,
            r.preload,
            r.selector.replace(',', ";"),
            r.plan.cache,
            r.plan.cache_fraction,
            r.hit_rate,
            r.stats.bytes_preload,
            r.stats.bytes_ondemand,
            r.tokens,
            r.tok_s,
            r.compute_s,
            r.stall_s
        );
    }
    let mut files = vec![("results.csv".to_string(), csv)];
    let mut by_policy: Vec<(String, Vec<&SimReport>)> = Vec::new();
    for r in reports {
        // The method's name keeps the legend short ("lfu / topk").
        let method = r.selector.split_whitespace().next().unwrap_or("");
        let key = format!("{} / {method}", r.policy);
        match by_policy.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(r),
            None => by_policy.push((key, vec![r])),
        }
    }
    let series = |f: &dyn Fn(&SimReport) -> f64| -> Vec<Series> {
        by_policy
            .iter()
            .map(|(k, v)| Series {
                name: k.clone(),
                points: v.iter().map(|r| (mib(r.plan.cache as f64), f(r))).collect(),
            })
            .collect()
    };
    let chart = |title: &str, y_label: &str, series: Vec<Series>| {
        Chart { title: title.into(), x_label: "cache (MiB)".into(), y_label: y_label.into(), log_y: false, series }
            .to_svg()
    };
    files.push((
        "hitrate.svg".into(),
        chart("Column-cache hit rate vs cache size (simulated)", "hit rate (%)", series(&|r| r.hit_rate * 100.0)),
    ));
    files.push(("tps.svg".into(), chart("Predicted decode speed vs cache size", "tokens/s", series(&|r| r.tok_s))));
    files.push((
        "reads.svg".into(),
        chart(
            "Bytes read per token vs cache size (simulated)",
            "MiB read per token",
            series(&|r| mib(r.telemetry.bytes_read_per_token)),
        ),
    ));
    // Adaptive TAM: λ and loads over the decode, for a few layers of each adaptive run.
    for (i, r) in reports.iter().filter(|r| !r.lambda.is_empty()).enumerate() {
        let n_layer = r.lambda.iter().map(|s| s.layer + 1).max().unwrap_or(1);
        let layers = [0, n_layer / 2, n_layer.saturating_sub(2)];
        let per_layer = |f: &dyn Fn(&sift_store::cache::LambdaStep) -> f64| -> Vec<Series> {
            layers
                .iter()
                .map(|&l| Series {
                    name: format!("layer {l}"),
                    points: r.lambda.iter().filter(|s| s.layer == l).map(|s| (f64::from(s.step), f(s))).collect(),
                })
                .collect()
        };
        let budget = mib(r.budget as f64);
        let lambda = Chart {
            title: format!("Adaptive TAM: λ per decoded token ({budget:.0} MiB budget)"),
            x_label: "decoded token".into(),
            y_label: "λ".into(),
            log_y: false,
            series: per_layer(&|s| f64::from(s.lambda)),
        };
        let loads = Chart {
            title: format!("Adaptive TAM: columns loaded into the cache per token ({budget:.0} MiB budget)"),
            x_label: "decoded token".into(),
            y_label: "columns loaded".into(),
            log_y: false,
            series: per_layer(&|s| f64::from(s.loads)),
        };
        files.push((format!("lambda-{i}.svg"), lambda.to_svg()));
        files.push((format!("loads-{i}.svg"), loads.to_svg()));
    }
    files
}
