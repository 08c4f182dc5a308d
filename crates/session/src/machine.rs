//! This machine's device profile: probed on first use, cached, re-probed when stale, and
//! corrected by what the engine's own budgeted runs measure.
//!
//! The planner and the bound need a [`DeviceProfile`] of the machine they run on. Unless the
//! user names one (`--profile`, `$SIFT_PROFILE`), the first command that needs it runs a quick
//! `sift probe` (about 6 s: memory, kernels, and the disk holding the model's column file) and
//! keeps the result in the user's cache folder (`$XDG_CACHE_HOME/sift`, or `~/.cache/sift`) as
//! `machine-<fingerprint>.toml`; the fingerprint covers the host name, the CPU model, the
//! number of threads and the probe's format, so another machine (or a changed one) gets its
//! own probe. A probe older than [`MAX_AGE_DAYS`] is taken again. Under `--memory` the probe's
//! buffers are held within half the budget (the model is not loaded yet).
//!
//! Every budgeted run that reports its decode (`sift bench --memory`, `sift generate --memory`)
//! folds what it measured into the cached profile ([`record_run`],
//! [`DeviceProfile::observe`]): the engine's read bandwidth against the probe's table, and the
//! compute time the read path adds. The probe measures random reads back to back; the engine
//! reads sorted batches between kernels, and on the development VM's disk those run at about
//! twice the table's bandwidth: without the correction the simulator and the planner predicted
//! half the speed the runs then had. A profile given by name or file is never written to.

use anyhow::Context;
use sift_sim::bound::DecodeTelemetry;
use sift_sim::probe::{hostname, probe, ProbeOptions};
use sift_sim::profile::DeviceProfile;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// A cached probe older than this is taken again.
pub const MAX_AGE_DAYS: u64 = 30;
/// Bumped when the probe measures differently: older cached profiles are then re-probed.
const PROBE_FORMAT: u32 = 2;

/// A profile and, when it is this machine's cached one, the file it lives in (where runs record
/// what they measured).
#[derive(Clone, Debug)]
pub struct MachineProfile {
    pub profile: DeviceProfile,
    pub cached: Option<PathBuf>,
}

/// The user's cache folder (`$XDG_CACHE_HOME/sift`, else `~/.cache/sift`).
pub fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("sift"))
}

/// The CPU's model name (`/proc/cpuinfo`), or "unknown CPU".
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// The cached profile's file for this machine with `threads` threads.
pub fn machine_profile_path(threads: usize) -> Option<PathBuf> {
    let key = format!("{}\n{}\n{threads}\n{PROBE_FORMAT}", hostname(), cpu_model());
    Some(cache_dir()?.join(format!("machine-{:08x}.toml", crc32fast::hash(key.as_bytes()))))
}

/// Whether a cached profile at `path` can be used: it loads, and it is younger than
/// [`MAX_AGE_DAYS`]. `Err` says why not.
fn fresh(path: &Path) -> Result<DeviceProfile, String> {
    let age = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .map_err(|e| e.to_string())?
        .elapsed()
        .unwrap_or(Duration::ZERO);
    if age > Duration::from_secs(MAX_AGE_DAYS * 86_400) {
        return Err(format!("probed {} days ago", age.as_secs() / 86_400));
    }
    DeviceProfile::load(path).map_err(|e| e.to_string())
}

/// This machine's profile for `threads` threads: the cached one when fresh, else a quick probe
/// reading `probe_file` (the model's column file: the disk it streams from), cached for next
/// time. `work_cap` bounds the probe's buffers (a budgeted run). `notice` gets one line when a
/// probe runs and why. Without a cache folder the probe is not kept.
pub fn machine_profile(
    probe_file: &Path,
    threads: usize,
    work_cap: Option<usize>,
    notice: &mut dyn FnMut(&str),
) -> anyhow::Result<MachineProfile> {
    let path = machine_profile_path(threads);
    let why = match path.as_deref().map(fresh) {
        Some(Ok(profile)) => return Ok(MachineProfile { profile, cached: path }),
        Some(Err(why)) if path.as_deref().is_some_and(Path::exists) => format!("the cached profile is stale ({why})"),
        _ => "first use on this machine".to_string(),
    };
    notice(&format!(
        "sift: probing this machine's memory, kernels and disk ({why}; about 6 s){}",
        path.as_deref().map(|p| format!(", kept in {}", p.display())).unwrap_or_default()
    ));
    let opts =
        ProbeOptions { file: probe_file.to_path_buf(), threads, quick: true, name: "this-machine".into(), work_cap };
    let report =
        probe(&opts, &mut |_| {}).context("probing this machine (give a profile with --profile to skip it)")?;
    let profile = report.profile;
    if let Some(p) = &path {
        let mut header = vec![
            format!(
                "This machine's profile, probed by sift on first use ({}); re-probed after {MAX_AGE_DAYS} days.",
                sift_sim::probe::today()
            ),
            "The observed section is learnt from sift's own budgeted runs here (sift_session::machine).".to_string(),
        ];
        header.extend(report.notes.iter().cloned());
        if let Err(e) = save(&profile, p, &header, None) {
            notice(&format!("sift: could not keep the probe in {} ({e}); it will run again next time", p.display()));
            return Ok(MachineProfile { profile, cached: None });
        }
    }
    Ok(MachineProfile { profile, cached: path })
}

/// Writes `profile` to `path` through a temporary file renamed over it; `mtime` (the probe's
/// time) is kept when given, so recording runs does not make an old probe look new.
fn save(profile: &DeviceProfile, path: &Path, header: &[String], mtime: Option<SystemTime>) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = tempfile::Builder::new().prefix(".machine-").suffix(".toml").tempfile_in(dir)?;
    profile.save(tmp.path(), header)?;
    if let Some(t) = mtime {
        tmp.as_file().set_modified(t)?;
    }
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Folds a budgeted run's decode figures into the cached profile at `path` (see the module
/// docs). Does nothing for a run that read nothing; a profile that changed on disk meanwhile is
/// re-read first, so concurrent runs lose at most an observation.
pub fn record_run(path: &Path, telemetry: &DecodeTelemetry) -> anyhow::Result<()> {
    let mut profile = DeviceProfile::load(path)?;
    let Some(run) = telemetry.observation(&profile) else {
        return Ok(());
    };
    profile.observe(run);
    let text = std::fs::read_to_string(path)?;
    let header: Vec<String> =
        text.lines().take_while(|l| l.starts_with('#')).map(|l| l.trim_start_matches('#').trim().to_string()).collect();
    let mtime = std::fs::metadata(path)?.modified().ok();
    save(&profile, path, &header, mtime).with_context(|| format!("recording the run in {}", path.display()))
}

/// [`record_run`] into `m`'s cache file when it has one; a failure is reported on stderr and
/// otherwise ignored (the run itself succeeded).
pub fn record_run_if_cached(m: &MachineProfile, telemetry: &DecodeTelemetry) {
    if let Some(path) = &m.cached {
        if let Err(e) = record_run(path, telemetry) {
            eprintln!("sift: warning: {e:#}");
        }
    }
}
