//! `sift probe`: this machine's memory, disk and kernels measured into a device profile
//! (`sift_sim::probe`) and saved with a header saying how; the builtin profiles listed or one
//! shown (`sift_sim::profile`); or with `--gpu` the GPU's transfers and, for a named model, the
//! engine's own costs on it (`engine_costs`) as JSON.

use anyhow::{bail, Context};
use sift_sim::probe::{probe, ProbeOptions};
use sift_sim::profile::{gbs, list_builtin, DeviceProfile};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What `sift probe` measures or shows.
#[derive(Clone, Debug)]
pub struct DeviceProbe {
    /// The weight file whose reads measure the disk (and with `gpu`, the model whose engine
    /// costs are measured, unless it is the default one, `default_model`).
    pub model: PathBuf,
    pub default_model: bool,
    /// The profile file written, and whether it may replace an existing one.
    pub output: Option<PathBuf>,
    pub force: bool,
    pub threads: usize,
    /// A quarter of the time per measurement.
    pub quick: bool,
    /// The profile's name (default: the output file's stem, else "this-machine").
    pub name: Option<String>,
    /// Print this profile (a builtin name or a file), or list the builtin ones, instead.
    pub show: Option<String>,
    pub list: bool,
    /// Measure the GPU (this one) instead.
    pub gpu: bool,
    pub main_gpu: usize,
}

impl DeviceProbe {
    /// Measures (or lists, or shows), writing the report to `out` and progress to stderr.
    pub fn run(&self, out: &mut dyn Write) -> anyhow::Result<()> {
        let a = self;
        if let Some(o) = &a.output {
            crate::outputs::check(o, a.force, &[&a.model])?;
        }
        if a.gpu {
            return self.gpu(out);
        }
        if a.list {
            writeln!(out, "| name | taken from | mem read | disk 4 KiB qd 1 | disk 1 MiB qd 16 |")?;
            writeln!(out, "| --- | --- | ---: | ---: | ---: |")?;
            for n in list_builtin() {
                let p = DeviceProfile::builtin(n).expect("listed builtin exists");
                writeln!(
                    out,
                    "| {n} | {} | {} | {} | {} |",
                    p.source.split(" (").next().unwrap_or(&p.source),
                    gbs(p.mem_read_bw),
                    gbs(p.disk_bw(4096, 1)),
                    gbs(p.disk_bw(1 << 20, 16))
                )?;
            }
            writeln!(
                out,
                "\n`sift probe --show NAME` prints one with its source; measure this machine with `sift probe -o FILE`."
            )?;
            return Ok(());
        }
        if let Some(s) = &a.show {
            write!(out, "{}", resolve(s)?.to_markdown())?;
            return Ok(());
        }
        if !a.model.exists() {
            bail!(
                "weight file '{}' not found: pass one with -m (any large file on the disk to measure; a model's pack is ideal){}",
                a.model.display(),
                if a.default_model { ", or run scripts/fetch-model.sh" } else { "" }
            );
        }
        let name = a
            .name
            .clone()
            .or_else(|| a.output.as_ref().and_then(|o| o.file_stem()).map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "this-machine".to_string());
        let opts = ProbeOptions { file: a.model.clone(), threads: a.threads, quick: a.quick, name, work_cap: None };
        let t0 = Instant::now();
        let mut stderr = std::io::stderr();
        let report = probe(&opts, &mut |line| {
            let _ = writeln!(stderr, "[{:5.1} s] {line}", t0.elapsed().as_secs_f64());
        })?;
        writeln!(out)?;
        for n in &report.notes {
            writeln!(out, "note: {n}")?;
        }
        writeln!(out)?;
        write!(out, "{}", report.profile.to_markdown())?;
        writeln!(out, "\nprobe took {:.1} s", report.elapsed.as_secs_f64())?;
        if let Some(path) = &a.output {
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
            header.push(
                "kernels = bytes of weights processed per second. Show with `sift probe --show FILE`.".to_string(),
            );
            report.profile.save(path, &header).with_context(|| format!("cannot write '{}'", path.display()))?;
            writeln!(out, "wrote {}", path.display())?;
        }
        Ok(())
    }

    /// `--gpu`: the GPU's transfers, device bandwidth and a product's round trip, the host's
    /// memory bandwidth, and for a named model the engine's costs, as JSON (to `-o` when given).
    fn gpu(&self, out: &mut dyn Write) -> anyhow::Result<()> {
        let a = self;
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
        // The host's side, so that the file is a whole device profile for `sift simulate --gpu
        // FILE`.
        let threads = a.threads;
        let pool = sift_engine::pool::ThreadPool::new(threads);
        let buf = vec![1u8; 512 << 20];
        let host_read_bw = sift_sim::probe::mem_read_bw(&pool, &buf, std::time::Duration::from_millis(400));
        eprintln!("sift: host memory read {:.2} GB/s ({threads} threads)", host_read_bw / 1e9);
        let mut v = serde_json::to_value(&p)?;
        v["host_read_bw"] = serde_json::json!(host_read_bw);
        v["host_threads"] = serde_json::json!(threads);
        // The engine's own costs, from short decodes of the model's pack: what lets `sift
        // simulate --gpu FILE` replay sift's hybrid decode rather than KAIROX's design. Only for a
        // model the user named (the default one would be packed and decoded unasked); a failure
        // leaves the transfer profile, with a warning.
        let named = !a.default_model;
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
            None => writeln!(out, "{json}")?,
        }
        Ok(())
    }
}

/// The engine's costs for `model`'s pack (made if needed) on this machine.
fn engine_costs(
    model: &Path,
    threads: usize,
    p: &sift_gpu::GpuProbe,
) -> anyhow::Result<(PathBuf, sift_sim::hybrid_engine::EngineCosts)> {
    let pack = crate::autopack::column_file(model, None)?;
    let m = sift_store::open_model(&pack).with_context(|| format!("cannot load '{}'", pack.display()))?;
    let head_gpu_ns = sift_engine::gpu::head_bytes(&m) as f64 / p.device_bw * 1e9 + p.round_trip_ns;
    drop(m);
    let costs = crate::engine_costs::calibrate(&pack, threads, head_gpu_ns, p.round_trip_ns)?;
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
