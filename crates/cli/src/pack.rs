//! `sift pack MODEL.gguf -o MODEL.sift`: write sift's pack file (the GGUF plus its weights as
//! exact columns and FFN neuron bundles for activation sparsity).

use crate::args::PackArgs;
use anyhow::Context;
use sift_store::{pack_model, ColPolicy, PackOptions};

pub fn run(a: PackArgs) -> anyhow::Result<()> {
    let cols = ColPolicy::parse(&a.col_type)
        .with_context(|| format!("--col-type '{}' is not one of auto, wide, Q4_1, Q5_0, Q8_0", a.col_type))?;
    anyhow::ensure!(a.model.exists(), "model file '{}' not found", a.model.display());
    let out = a.out.clone().unwrap_or_else(|| a.model.with_extension("sift"));
    let order = a.unit_order.clone().unwrap_or_default();
    sift_session::outputs::check(&out, a.force, &[&a.model, &order])?;
    let t0 = std::time::Instant::now();
    let unit_orders = match &a.unit_order {
        Some(path) => {
            let trace = sift_sim::trace::Trace::read(path)?;
            anyhow::ensure!(
                trace.n_tokens() > 0,
                "the trace '{}' has no decoded tokens to order units by; record one with `sift trace -n N`",
                path.display()
            );
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            sift_sim::grouping::orders_by(&trace, &a.grouping, threads, a.group_units as usize).context(
                "this sift was built without METIS: build it with `cargo build --release --features sift-cli/metis` for \
                 --grouping metis, or use --grouping coactivation",
            )?
        }
        None => Vec::new(),
    };
    let opts = PackOptions { cols, group: a.group, unit_orders, bundles: a.bundles };
    let n = pack_model(&a.model, &out, &opts, |m| eprint!("\rpacking {m}   "))
        .with_context(|| format!("cannot pack '{}'", a.model.display()))?;
    eprintln!();
    eprintln!(
        "wrote {} ({:.1} MiB) in {:.1} s",
        out.display(),
        n as f64 / (1 << 20) as f64,
        t0.elapsed().as_secs_f64()
    );
    if cols == ColPolicy::Auto && sift_quant::exact::wide_is_faster() {
        eprintln!(
            "note: this CPU has no AVX-512 VNNI; for sparse decoding from memory (no --memory), \
             `--col-type wide` stores 5- and 6-bit tensors (Q5_0, Q5_K, Q6_K) one byte per value: \
             ~1.4x faster column products for 1.33-1.6x their bytes"
        );
    }
    Ok(())
}
