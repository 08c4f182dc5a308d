//! `sift inspect`: a GGUF file's header, metadata and tensor table, like gguf-dump.

use crate::args::InspectArgs;
use anyhow::Context;
use sift_gguf::{GgufFile, MetaValue};

pub fn run(a: InspectArgs) -> anyhow::Result<()> {
    let f = GgufFile::open(&a.model).with_context(|| format!("cannot read '{}'", a.model.display()))?;
    let g = &f.gguf;
    println!("* File: {} ({} bytes)", a.model.display(), g.file_size);
    println!("* GGUF version {}, alignment {}, data offset {}", g.version, g.alignment, g.data_offset);
    println!("* {} key/value pairs:", g.metadata.len());
    println!("  {:>5}: {:<14} | {:<8} | {:<42} = value", "#", "type", "n", "key");
    for (i, (k, v)) in g.metadata.iter().enumerate() {
        let n = v.as_array().map(|a| a.len()).unwrap_or(1);
        let shown = match v {
            MetaValue::Array(items) if a.full => items.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", "),
            MetaValue::String(s) if !a.full && s.len() > 80 => {
                format!("{:?}...", s.chars().take(60).collect::<String>())
            }
            MetaValue::String(s) => format!("{s:?}"),
            other => other.to_string(),
        };
        println!("  {:>5}: {:<14} | {n:<8} | {k:<42} = {shown}", i + 1, v.type_name());
    }
    println!("* {} tensors:", g.tensors.len());
    println!("  {:>5}: {:>12} | {:<22} | {:<8} | {:>12} | name", "#", "elements", "shape", "type", "offset");
    for (i, t) in g.tensors.iter().enumerate() {
        let shape = t.dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(" x ");
        println!(
            "  {:>5}: {:>12} | {shape:<22} | {:<8} | {:>12} | {}",
            i + 1,
            t.n_elements(),
            t.ty.name(),
            t.offset,
            t.name
        );
    }
    Ok(())
}
