//! `sift plan`'s report of the planner's choice ([`crate::planner`]): the flags it amounts to
//! with the predicted speed, the memory split, the KV cache's growth and every candidate weighed.

use crate::planner::Plan;
use crate::profile::DeviceProfile;
use sift_engine::kv::KvType;
use std::fmt::Write;
use std::path::Path;

/// What a plan was made for, as its report names it.
pub struct PlanSetting<'a> {
    /// The model as the user named it, the budget in bytes and the device profile.
    pub model: &'a Path,
    pub budget: u64,
    pub profile: &'a DeviceProfile,
    /// Sequences decoded together.
    pub sequences: usize,
    /// The context the run will use, the KV cache's types and its bytes at that context.
    pub n_ctx: usize,
    pub cache_type_k: KvType,
    pub cache_type_v: KvType,
    pub kv_bytes: u64,
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

/// The plan as markdown.
pub fn markdown(p: &Plan, s: &PlanSetting) -> String {
    let mut out = String::new();
    let m = &p.memory;
    let _ = writeln!(
        out,
        "plan for {} under {:.0} MiB on {} ({})\n",
        s.model.display(),
        mib(s.budget),
        s.profile.name,
        s.profile.source
    );
    let _ = writeln!(
        out,
        "  --sparsity {} --ratio {:.2} --preload {} --cache-policy {}   predicted {:.2} tok/s ({})\n",
        p.sparsity,
        p.ratio,
        p.preload,
        p.cache_policy,
        p.predicted_tok_s,
        if s.sequences > 1 {
            format!("{}, {} sequences together", p.predicted_by, s.sequences)
        } else {
            p.predicted_by.clone()
        }
    );
    out.push_str("| memory | MiB |\n|---|---:|\n");
    for (k, v) in [
        ("runtime (code, tokenizer)", m.runtime),
        ("resident weights", m.resident_weights),
        ("column scales (exact columns)", m.column_scales),
        ("KV cache (first page) + activations", m.kv_and_scratch),
        ("I/O and compute buffers", m.buffers),
        ("column cache index (slots, policy state)", m.cache_index + m.cache_entries),
        ("column cache", m.cache),
    ] {
        let _ = writeln!(out, "| {k} | {:.0} |", mib(v));
    }
    let _ = writeln!(out, "| **total** | **{:.0}** of {:.0} |\n", mib(m.total()), mib(m.budget));
    let _ = writeln!(
        out,
        "The KV cache grows a page of {} tokens at a time, taking its room from the column cache: {:.0} MiB at {} tokens (-ctk {} -ctv {}).\n",
        sift_engine::kv::KV_PAGE,
        mib(s.kv_bytes),
        s.n_ctx,
        s.cache_type_k,
        s.cache_type_v
    );
    out.push_str("| preload | ratio | cache MiB | predicted tok/s |\n|---:|---:|---:|---:|\n");
    for c in &p.candidates {
        let _ = match &c.refused {
            Some(why) => writeln!(out, "| {} | - | - | refused: {why} |", c.preload),
            None => {
                writeln!(
                    out,
                    "| {} | {:.2} | {:.0} | {:.2} |",
                    c.preload,
                    c.ratio,
                    mib(c.cache_bytes),
                    c.predicted_tok_s
                )
            }
        };
    }
    out
}
