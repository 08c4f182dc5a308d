//! `sift probe`: measure this machine's memory, disk and kernels into a device profile
//! (`sift_sim::probe`), or show / list profiles (`sift_sim::profile`).

use crate::args::DEFAULT_MODEL;
use anyhow::{bail, Context};
use clap::Args;
use sift_sim::probe::{probe, ProbeOptions};
use sift_sim::profile::{gbs, list_builtin, DeviceProfile};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args)]
pub struct ProbeArgs {
    /// Weight file whose reads (O_DIRECT, random offsets) measure the disk; larger is better
    #[arg(short = 'm', long = "model", default_value = DEFAULT_MODEL)]
    pub model: PathBuf,
    /// Write the profile to this TOML file
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
    /// Threads for memory reads and kernels (default: all cores)
    #[arg(short = 't', long = "threads", value_parser = crate::args::threads_in_range)]
    pub threads: Option<usize>,
    /// A quarter of the time per measurement (about 6 s in all)
    #[arg(long)]
    pub quick: bool,
    /// The profile's name (default: the output file's stem, else "this-machine")
    #[arg(long)]
    pub name: Option<String>,
    /// Print a profile instead of measuring: a builtin name (see --list) or a TOML file
    #[arg(long, value_name = "NAME_OR_PATH", conflicts_with_all = ["output", "quick", "list"])]
    pub show: Option<String>,
    /// List the builtin profiles (taken from the papers)
    #[arg(long, conflicts_with_all = ["output", "quick"])]
    pub list: bool,
    /// Measure the GPU instead (host-to-device transfers by size, device bandwidth, a hybrid
    /// product's round trip, and with -m MODEL the engine's own costs from short decodes of its
    /// pack) and print them as JSON (written to -o when given)
    #[arg(long, conflicts_with_all = ["show", "list"])]
    pub gpu: bool,
    /// The GPU to measure (-mg)
    #[arg(long = "main-gpu", default_value_t = 0, value_name = "I")]
    pub main_gpu: usize,
    /// Replace the output file if it exists (without it, an existing file is an error)
    #[arg(long = "force")]
    pub force: bool,
}

/// `sift probe --gpu`.
fn probe_gpu(a: &ProbeArgs) -> anyhow::Result<()> {
    let mut dev = sift_gpu::GpuDevice::open(a.main_gpu).context("cannot use the GPU (--gpu)")?;
    let p = dev.probe().context("GPU probe")?;
    eprintln!(
        "sift: {}: device copies {:.0} GB/s, a product's round trip {:.1} us",
        p.name,
        p.device_bw / 1e9,
        p.round_trip_ns / 1e3
    );
    for (size, bw) in &p.h2d {
        eprintln!("sift:   host to device, {:>8} KiB per transfer: {:6.2} GB/s", size >> 10, bw / 1e9);
    }
    // The host's side, so that the file is a whole device profile for `sift simulate --gpu FILE`.
    let threads = a.threads.unwrap_or_else(sift_engine::default_threads).max(1);
    let pool = sift_engine::pool::ThreadPool::new(threads);
    let buf = vec![1u8; 512 << 20];
    let host_read_bw = sift_sim::probe::mem_read_bw(&pool, &buf, std::time::Duration::from_millis(400));
    eprintln!("sift: host memory read {:.2} GB/s ({threads} threads)", host_read_bw / 1e9);
    let mut v = serde_json::to_value(&p)?;
    v["host_read_bw"] = serde_json::json!(host_read_bw);
    v["host_threads"] = serde_json::json!(threads);
    // The engine's own costs, from short decodes of the model's pack: what lets `sift simulate
    // --gpu FILE` replay sift's hybrid decode rather than KAIROX's design. Only for a model the
    // user named (the default one would be packed and decoded unasked); a failure leaves the
    // transfer profile, with a warning.
    let named = a.model.as_path() != Path::new(DEFAULT_MODEL);
    if named && a.model.exists() {
        drop(dev);
        match engine_costs(&a.model, threads, &p) {
            Ok((pack, costs)) => {
                v["engine"] = serde_json::to_value(&costs)?;
                v["engine_model"] = serde_json::json!(pack.display().to_string());
            }
            Err(e) => eprintln!(
                "sift: warning: the engine's costs were not measured ({e:#}); the profile holds the transfers only"
            ),
        }
    } else if named {
        bail!("model file '{}' not found", a.model.display());
    } else {
        eprintln!("sift: the profile holds the transfers only (pass -m MODEL for the engine's costs, which `sift simulate --gpu FILE` replays)");
    }
    let json = serde_json::to_string_pretty(&v)?;
    match &a.output {
        Some(o) => sift_output::write(o, &[], (json + "\n").as_bytes())?,
        None => println!("{json}"),
    }
    Ok(())
}

/// The engine's costs for `model`'s pack (made if needed) on this machine.
fn engine_costs(
    model: &Path,
    threads: usize,
    p: &sift_gpu::GpuProbe,
) -> anyhow::Result<(PathBuf, sift_sim::hybrid_engine::EngineCosts)> {
    let pack = sift_session::autopack::column_file(model, None)?;
    let m = sift_store::open_model(&pack).with_context(|| format!("cannot load '{}'", pack.display()))?;
    let head_gpu_ns = sift_engine::gpu::head_bytes(&m) as f64 / p.device_bw * 1e9 + p.round_trip_ns;
    drop(m);
    let costs = crate::probe_engine::calibrate(&pack, threads, head_gpu_ns, p.round_trip_ns)?;
    eprintln!(
        "sift: engine costs ({}): attention {:.1} us a layer on the GPU, {:.1} on the CPU; a GPU share {:.1} us to queue, {:.1} us to come back; the CPU {:.3} ns per output value; a load {:.1} us to issue; dense layers {:.1} us on the GPU, {:.1} on the CPU",
        pack.display(),
        costs.attention_gpu_ns / 1e3,
        costs.attention_cpu_ns / 1e3,
        costs.gpu_queue_ns / 1e3,
        costs.gpu_result_ns / 1e3,
        costs.cpu_value_ns,
        costs.load_issue_ns / 1e3,
        costs.dense_gpu_layer_ns / 1e3,
        costs.dense_cpu_layer_ns / 1e3
    );
    Ok((pack, costs))
}

pub fn run(a: ProbeArgs) -> anyhow::Result<()> {
    if let Some(o) = &a.output {
        sift_session::outputs::check(o, a.force, &[&a.model])?;
    }
    if a.gpu {
        return probe_gpu(&a);
    }
    if a.list {
        println!("| name | taken from | mem read | disk 4 KiB qd 1 | disk 1 MiB qd 16 |");
        println!("| --- | --- | ---: | ---: | ---: |");
        for n in list_builtin() {
            let p = DeviceProfile::builtin(n).expect("listed builtin exists");
            println!(
                "| {n} | {} | {} | {} | {} |",
                p.source.split(" (").next().unwrap_or(&p.source),
                gbs(p.mem_read_bw),
                gbs(p.disk_bw(4096, 1)),
                gbs(p.disk_bw(1 << 20, 16))
            );
        }
        println!(
            "\n`sift probe --show NAME` prints one with its source; measure this machine with `sift probe -o FILE`."
        );
        return Ok(());
    }
    if let Some(s) = &a.show {
        print!("{}", resolve(s)?.to_markdown());
        return Ok(());
    }

    if !a.model.exists() {
        bail!(
            "weight file '{}' not found: pass one with -m (any large file on the disk to measure; a model's pack is ideal){}",
            a.model.display(),
            if a.model == Path::new(DEFAULT_MODEL) { ", or run scripts/fetch-model.sh" } else { "" }
        );
    }
    let name = a
        .name
        .clone()
        .or_else(|| a.output.as_ref().and_then(|o| o.file_stem()).map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "this-machine".to_string());
    let opts = ProbeOptions {
        file: a.model.clone(),
        threads: a.threads.unwrap_or_else(sift_engine::default_threads).max(1),
        quick: a.quick,
        name,
        work_cap: None,
    };
    let t0 = Instant::now();
    let mut stderr = std::io::stderr();
    let report = probe(&opts, &mut |line| {
        let _ = writeln!(stderr, "[{:5.1} s] {line}", t0.elapsed().as_secs_f64());
    })?;
    println!();
    for n in &report.notes {
        println!("note: {n}");
    }
    println!();
    print!("{}", report.profile.to_markdown());
    println!("\nprobe took {:.1} s", report.elapsed.as_secs_f64());
    if let Some(out) = &a.output {
        let mut header = vec![
            "Device profile measured by `sift probe` (method: crates/sim/src/probe.rs; model: crates/sim/src/profile.rs)."
                .to_string(),
            format!(
                "Command: sift probe -m {} -t {}{}",
                a.model.display(),
                opts.threads,
                if a.quick { " --quick" } else { "" }
            ),
        ];
        header.extend(report.notes.iter().cloned());
        header.push(
            "Units: bandwidths in bytes/s; disk lat_ns = ns from submitting a batch of qd reads to the last completion;"
                .to_string(),
        );
        header.push("kernels = bytes of weights processed per second. Show with `sift probe --show FILE`.".to_string());
        report.profile.save(out, &header).with_context(|| format!("cannot write '{}'", out.display()))?;
        println!("wrote {}", out.display());
    }
    Ok(())
}

/// A builtin profile by name, else a profile file.
fn resolve(s: &str) -> anyhow::Result<DeviceProfile> {
    if let Some(p) = DeviceProfile::builtin(s) {
        return Ok(p);
    }
    let path = Path::new(s);
    if path.exists() {
        return Ok(DeviceProfile::load(path)?);
    }
    bail!("no builtin profile or file named '{s}' (builtin: {})", list_builtin().join(", "))
}
