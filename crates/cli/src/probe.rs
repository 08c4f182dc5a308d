//! `sift probe`'s flags: measure this machine (or with `--gpu` the GPU) into a device profile, or
//! show / list profiles (`sift_session::device_probe`).

use crate::args::DEFAULT_MODEL;
use clap::Args;
use std::path::{Path, PathBuf};

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

pub fn run(a: ProbeArgs) -> anyhow::Result<()> {
    sift_session::device_probe::DeviceProbe {
        default_model: a.model == Path::new(DEFAULT_MODEL),
        model: a.model,
        output: a.output,
        force: a.force,
        threads: a.threads.unwrap_or_else(sift_engine::default_threads).max(1),
        quick: a.quick,
        name: a.name,
        show: a.show,
        list: a.list,
        gpu: a.gpu,
        main_gpu: a.main_gpu,
    }
    .run(&mut std::io::stdout().lock())
}
