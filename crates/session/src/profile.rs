//! Which device profile the planner predicts with, and cache policies by name.

use anyhow::Context;
use sift_sim::profile::DeviceProfile;
use sift_store::cache::Policy;
use std::path::Path;

/// The builtin profile used when none is given: measured by `sift probe` on the 2-core
/// development machine (see profiles/).
pub const DEFAULT_PROFILE: &str = "sift-dev-2core";

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
