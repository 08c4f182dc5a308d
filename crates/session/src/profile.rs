//! Which device profile the planner predicts with, and cache policies by name.

use crate::machine::{machine_profile, machine_profile_path, MachineProfile};
use anyhow::Context;
use sift_sim::profile::DeviceProfile;
use sift_store::cache::Policy;
use std::path::Path;

/// The builtin profile used when none is given and this machine has none cached (and none can
/// be probed): measured by `sift probe` on the 2-core development machine (see profiles/).
pub const DEFAULT_PROFILE: &str = "sift-dev-2core";

/// The profile named by `spec` (`--profile`) or `$SIFT_PROFILE`, if either is set.
fn named(spec: Option<&str>) -> anyhow::Result<Option<DeviceProfile>> {
    match spec.map(String::from).or_else(|| std::env::var("SIFT_PROFILE").ok().filter(|s| !s.is_empty())) {
        Some(s) => resolve_profile(Some(&s)).map(Some),
        None => Ok(None),
    }
}

/// The profile a budgeted run or a plan of the model at `probe_file` predicts with: `--profile`
/// (`spec`) or `$SIFT_PROFILE` when given, else this machine's cached profile, probed now if it
/// has none or it is stale ([`crate::machine`]); `work_cap` bounds the probe's buffers.
pub fn machine_or_named(
    spec: Option<&str>,
    probe_file: &Path,
    threads: usize,
    work_cap: Option<usize>,
    notice: &mut dyn FnMut(&str),
) -> anyhow::Result<MachineProfile> {
    if let Some(profile) = named(spec)? {
        return Ok(MachineProfile { profile, cached: None });
    }
    machine_profile(probe_file, threads, work_cap, notice)
}

/// A profile from `--profile` (a builtin name or a file from `sift probe -o`), else
/// `$SIFT_PROFILE`, else this machine's cached profile when it has one (with `threads`
/// threads), else [`DEFAULT_PROFILE`]. Never probes (see [`machine_or_named`]).
pub fn resolve_profile_for(spec: Option<&str>, threads: usize) -> anyhow::Result<DeviceProfile> {
    if let Some(p) = named(spec)? {
        return Ok(p);
    }
    if let Some(p) = machine_profile_path(threads).filter(|p| p.exists()).and_then(|p| DeviceProfile::load(&p).ok()) {
        return Ok(p);
    }
    resolve_profile(None)
}

/// A profile from `--profile` (a builtin name or a file from `sift probe -o`), else
/// `$SIFT_PROFILE`, else [`DEFAULT_PROFILE`].
pub fn resolve_profile(spec: Option<&str>) -> anyhow::Result<DeviceProfile> {
    let spec = spec.map(String::from).or_else(|| std::env::var("SIFT_PROFILE").ok());
    match spec {
        Some(s) => {
            if let Some(p) = DeviceProfile::builtin(&s) {
                return Ok(p);
            }
            let path = Path::new(&s);
            anyhow::ensure!(
                path.exists(),
                "no device profile '{s}': pass a file written by `sift probe -o FILE`, or one of the builtin profiles: {}",
                sift_sim::profile::list_builtin().join(", ")
            );
            Ok(DeviceProfile::load(path)?)
        }
        None => DeviceProfile::builtin(DEFAULT_PROFILE).with_context(|| format!("builtin profile {DEFAULT_PROFILE}")),
    }
}

/// A cache policy by name (`tam` takes `lambda` and `eps`; `tam-adaptive` starts at `lambda`).
pub fn parse_policy(s: &str, lambda: f32, eps: f32) -> anyhow::Result<Policy> {
    match Policy::parse(s) {
        Some(Policy::Tam { .. }) => Ok(Policy::Tam { lambda, eps }),
        Some(Policy::AdaptiveTam { .. }) => Ok(Policy::AdaptiveTam { lambda, eps }),
        Some(p) => Ok(p),
        None => anyhow::bail!("unknown policy '{s}': use lfu, lru, tam, tam-adaptive, static, belady or none"),
    }
}
