//! Memory pressure for live budget control (`--follow-pressure`): Linux PSI read from the
//! process's own cgroup v2 or from `/proc/pressure/memory`, and [`PressureFollower`], the pure
//! rule that shrinks the budget under pressure and grows it back after calm (see the parent
//! module's docs for how the watcher uses it).

use std::fs;
use std::io;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Pressure: `some avg10` (percent of the last 10 s some task stalled on memory) at or above this.
pub const PRESSURE_SOME: f64 = 10.0;
/// Pressure: `full avg10` (percent of the last 10 s all tasks stalled on memory) at or above this.
pub const PRESSURE_FULL: f64 = 2.0;
/// Calm: `some avg10` below this.
pub const CALM_SOME: f64 = 1.0;
/// Under pressure, the budget shrinks by this percentage of the current budget per step.
pub const SHRINK_PERCENT: u64 = 10;
/// At most one shrink step per this interval.
pub const SHRINK_EVERY: Duration = Duration::from_secs(2);
/// Calm for this long before the budget grows back.
pub const CALM_FOR: Duration = Duration::from_secs(10);
/// Growing back, by this percentage of the target per step.
pub const GROW_PERCENT: u64 = 10;
/// At most one growth step per this interval.
pub const GROW_EVERY: Duration = Duration::from_secs(5);
/// The system-wide PSI memory file.
pub const PROC_PSI_MEMORY: &str = "/proc/pressure/memory";

/// The two numbers of a PSI file that [`PressureFollower`] uses (percentages, 0–100).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Psi {
    /// `some avg10`: share of the last 10 s in which at least one task stalled on memory.
    pub some_avg10: f64,
    /// `full avg10`: share in which all non-idle tasks stalled at once (0 when the file has no
    /// `full` line, as on older kernels).
    pub full_avg10: f64,
}

/// Parses a PSI file (`some avg10=0.00 avg60=0.00 avg300=0.00 total=0` and a `full` line).
/// Errors (never panics) on a missing `some` line, a line without `avg10`, or a value that is
/// not a finite number in 0–100.
pub fn parse_psi(text: &str) -> Result<Psi, String> {
    let mut some = None;
    let mut full = None;
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let slot = match fields.next() {
            Some("some") => &mut some,
            Some("full") => &mut full,
            _ => continue,
        };
        let v = fields
            .find_map(|f| f.strip_prefix("avg10="))
            .ok_or_else(|| format!("no avg10 in '{}'", line.escape_debug()))?;
        let x: f64 = v.parse().map_err(|_| format!("bad avg10 '{}'", v.escape_debug()))?;
        if !(0.0..=100.0).contains(&x) {
            return Err(format!("avg10 {v} outside 0–100"));
        }
        *slot = Some(x);
    }
    let some_avg10 = some.ok_or("no 'some' line")?;
    Ok(Psi { some_avg10, full_avg10: full.unwrap_or(0.0) })
}

/// The cgroup v2 path of the process from `/proc/self/cgroup` (the `0::PATH` line), if any.
pub fn cgroup_v2_path(proc_self_cgroup: &str) -> Option<&str> {
    proc_self_cgroup.lines().find_map(|l| l.strip_prefix("0::")).map(str::trim_end)
}

/// The mount point of the cgroup v2 hierarchy from `/proc/self/mountinfo`, if mounted
/// (`/sys/fs/cgroup` on a unified system, `/sys/fs/cgroup/unified` on a hybrid one).
pub fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    // "ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [TAGS…] - FSTYPE SOURCE SUPER_OPTIONS"
    mountinfo.lines().find_map(|l| {
        let (mount, rest) = l.split_once(" - ")?;
        if rest.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        mount.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// Where to read memory pressure, best first: the process's own cgroup's `memory.pressure`
/// (when it is in a non-root cgroup v2; the root's equals the system-wide file), then
/// [`PROC_PSI_MEMORY`].
pub fn psi_candidates(proc_self_cgroup: Option<&str>, mountinfo: Option<&str>) -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(rel) = proc_self_cgroup.and_then(cgroup_v2_path) {
        let rel = rel.trim_start_matches('/');
        if !rel.is_empty() {
            let mount = mountinfo.and_then(cgroup2_mount).unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup"));
            v.push(mount.join(rel).join("memory.pressure"));
        }
    }
    v.push(PathBuf::from(PROC_PSI_MEMORY));
    v
}

/// The first readable PSI memory file of this process ([`psi_candidates`]), or an
/// [`io::ErrorKind::Unsupported`] error saying PSI is not available.
pub fn psi_memory_path() -> io::Result<PathBuf> {
    let cgroup = fs::read_to_string("/proc/self/cgroup").ok();
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok();
    first_readable(&psi_candidates(cgroup.as_deref(), mountinfo.as_deref()))
}

fn first_readable(paths: &[PathBuf]) -> io::Result<PathBuf> {
    for p in paths {
        if fs::read_to_string(p).is_ok() {
            return Ok(p.clone());
        }
    }
    let tried: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        format!(
            "memory pressure information (PSI) is not available: cannot read {} (the kernel needs CONFIG_PSI=y, \
             and psi=1 on its command line when built with CONFIG_PSI_DEFAULT_DISABLED)",
            tried.join(" or ")
        ),
    ))
}

/// The pressure-following rule, pure (time is passed in). See the module docs and the
/// constants for the thresholds.
#[derive(Clone, Debug)]
pub struct PressureFollower {
    /// The target: the budget to grow back to (never exceeded).
    pub initial: u64,
    /// Never below this.
    pub floor: u64,
    /// The budget now.
    pub current: u64,
    last_shrink: Option<Instant>,
    last_grow: Option<Instant>,
    /// Since when `some avg10` has stayed below [`CALM_SOME`].
    calm_since: Option<Instant>,
}

impl PressureFollower {
    /// Starts at `initial` (raised to `floor` if below).
    pub fn new(initial: u64, floor: u64) -> PressureFollower {
        let initial = initial.max(floor);
        PressureFollower { initial, floor, current: initial, last_shrink: None, last_grow: None, calm_since: None }
    }

    /// A new target (the control file changed): the budget jumps to it (raised to the floor).
    /// The rate limits keep running.
    pub fn set_target(&mut self, target: u64) {
        self.initial = target.max(self.floor);
        self.current = self.initial;
    }

    /// One PSI sample at `now`; returns the new budget when it changes. Under pressure
    /// (`some ≥ PRESSURE_SOME` or `full ≥ PRESSURE_FULL`): shrink by [`SHRINK_PERCENT`]% of the
    /// current budget, not below the floor, at most once per [`SHRINK_EVERY`]. Calm
    /// (`some < CALM_SOME`) for [`CALM_FOR`] and below the target: grow by [`GROW_PERCENT`]% of
    /// the target, not above it, at most once per [`GROW_EVERY`]. In between: no change, and the
    /// calm period starts again.
    pub fn step(&mut self, some_avg10: f64, full_avg10: f64, now: Instant) -> Option<u64> {
        if some_avg10 >= PRESSURE_SOME || full_avg10 >= PRESSURE_FULL {
            self.calm_since = None;
            if self.last_shrink.is_some_and(|t| now.saturating_duration_since(t) < SHRINK_EVERY) {
                return None;
            }
            let step = percent_of(self.current, SHRINK_PERCENT).max(1);
            let new = self.current.saturating_sub(step).max(self.floor);
            if new >= self.current {
                return None;
            }
            self.current = new;
            self.last_shrink = Some(now);
            return Some(new);
        }
        if some_avg10.is_nan() || some_avg10 >= CALM_SOME {
            self.calm_since = None;
            return None;
        }
        let since = *self.calm_since.get_or_insert(now);
        if self.current >= self.initial
            || now.saturating_duration_since(since) < CALM_FOR
            || self.last_grow.is_some_and(|t| now.saturating_duration_since(t) < GROW_EVERY)
        {
            return None;
        }
        let step = percent_of(self.initial, GROW_PERCENT).max(1);
        let new = self.current.saturating_add(step).min(self.initial);
        self.current = new;
        self.last_grow = Some(now);
        Some(new)
    }
}

/// `p`% of `x`, rounded down, without overflow.
fn percent_of(x: u64, p: u64) -> u64 {
    (u128::from(x) * u128::from(p) / 100) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psi_parses_this_machines_files() {
        let Ok(text) = fs::read_to_string(PROC_PSI_MEMORY) else {
            eprintln!("skipped: {PROC_PSI_MEMORY} not readable here");
            return;
        };
        let p = parse_psi(&text).unwrap();
        assert!((0.0..=100.0).contains(&p.some_avg10) && (0.0..=100.0).contains(&p.full_avg10));
        // Whatever file this process would follow parses too.
        let path = psi_memory_path().unwrap();
        parse_psi(&fs::read_to_string(&path).unwrap()).unwrap();
    }

    #[test]
    fn psi_parses_fixed_strings_and_rejects_malformed_ones() {
        let text = "some avg10=12.50 avg60=3.10 avg300=0.70 total=123456\n\
                    full avg10=2.25 avg60=1.00 avg300=0.20 total=65432\n";
        assert_eq!(parse_psi(text), Ok(Psi { some_avg10: 12.5, full_avg10: 2.25 }));
        // No `full` line (older kernels): 0.
        assert_eq!(
            parse_psi("some avg10=0.00 avg60=0.00 avg300=0.00 total=0"),
            Ok(Psi { some_avg10: 0.0, full_avg10: 0.0 })
        );
        // Field order does not matter; other lines are ignored.
        assert_eq!(parse_psi("junk\nsome total=1 avg10=99.99\n"), Ok(Psi { some_avg10: 99.99, full_avg10: 0.0 }));
        for bad in [
            "",
            "garbage",
            "full avg10=1.00 avg60=0 avg300=0 total=0",
            "some avg60=1.00 avg300=0.00 total=0",
            "some avg10=abc avg60=0",
            "some avg10= avg60=0",
            "some avg10=-1.0",
            "some avg10=NaN",
            "some avg10=inf",
            "some avg10=101",
            "some avg10=1.0\nfull avg10=x",
            "\u{0}\u{ff}some",
        ] {
            assert!(parse_psi(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn psi_path_prefers_the_processs_cgroup() {
        let unified = "29 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";
        let hybrid = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
                      35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
                      41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        let v2 = "0::/user.slice/user-1000.slice/session-3.scope\n";
        let v1 = "4:memory:/process_api/4fa1\n1:cpu:/\n";
        assert_eq!(cgroup_v2_path(v2), Some("/user.slice/user-1000.slice/session-3.scope"));
        assert_eq!(cgroup_v2_path(v1), None);
        assert_eq!(cgroup_v2_path("4:memory:/x\n0::/\n"), Some("/"));
        assert_eq!(cgroup2_mount(unified), Some(PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(cgroup2_mount(hybrid), Some(PathBuf::from("/sys/fs/cgroup/unified")));
        assert_eq!(cgroup2_mount("garbage\n - \n"), None);
        let proc = PathBuf::from(PROC_PSI_MEMORY);
        assert_eq!(
            psi_candidates(Some(v2), Some(unified)),
            vec![
                PathBuf::from("/sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope/memory.pressure"),
                proc.clone()
            ]
        );
        assert_eq!(
            psi_candidates(Some("0::/job\n"), Some(hybrid)),
            vec![PathBuf::from("/sys/fs/cgroup/unified/job/memory.pressure"), proc.clone()]
        );
        // Root cgroup, v1 only, or nothing readable: the system-wide file.
        assert_eq!(psi_candidates(Some("0::/\n"), Some(unified)), vec![proc.clone()]);
        assert_eq!(psi_candidates(Some(v1), None), vec![proc.clone()]);
        assert_eq!(psi_candidates(None, None), vec![proc]);
        // No readable candidate: a clear Unsupported error.
        let e = first_readable(&[PathBuf::from("/nonexistent/memory.pressure")]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Unsupported);
        assert!(e.to_string().contains("PSI") && e.to_string().contains("CONFIG_PSI"), "{e}");
    }

    #[test]
    fn follower_shrinks_under_pressure_rate_limited_down_to_the_floor() {
        let t0 = Instant::now();
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        let mut f = PressureFollower::new(1000, 700);
        assert_eq!(f.step(0.0, 0.0, at(0.0)), None); // calm at the target: nothing to do
        assert_eq!(f.step(12.0, 0.0, at(1.0)), Some(900)); // some ≥ 10
        assert_eq!(f.step(50.0, 9.0, at(2.0)), None); // 1 s later: rate limited
        assert_eq!(f.step(10.0, 0.0, at(3.0)), Some(810)); // 10% of the current budget
        assert_eq!(f.step(0.5, 2.0, at(5.0)), Some(729)); // full ≥ 2 alone is pressure
        assert_eq!(f.step(9.99, 1.99, at(7.5)), None); // just below both thresholds
        assert_eq!(f.step(30.0, 0.0, at(8.0)), Some(700)); // 656 clamped to the floor
        assert_eq!(f.step(30.0, 0.0, at(10.0)), None); // at the floor
        assert_eq!((f.current, f.initial, f.floor), (700, 1000, 700));
    }

    #[test]
    fn follower_grows_back_after_calm_never_above_the_target() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut f = PressureFollower::new(1000, 500);
        for (t, want) in [(0, 900), (2, 810), (4, 729), (6, 657)] {
            assert_eq!(f.step(20.0, 0.0, at(t)), Some(want));
        }
        assert_eq!(f.step(0.9, 0.0, at(7)), None); // calm starts
        assert_eq!(f.step(0.0, 0.0, at(16)), None); // 9 s calm
        assert_eq!(f.step(0.0, 0.0, at(17)), Some(757)); // 10 s: + 10% of the target
        assert_eq!(f.step(0.0, 0.0, at(21)), None); // 4 s after: rate limited
        assert_eq!(f.step(0.0, 0.0, at(22)), Some(857));
        assert_eq!(f.step(5.0, 0.0, at(23)), None); // moderate: no change, calm restarts
        assert_eq!(f.step(0.0, 0.0, at(24)), None);
        assert_eq!(f.step(0.0, 0.0, at(33)), None); // 9 s since calm restarted
        assert_eq!(f.step(0.0, 0.0, at(34)), Some(957));
        assert_eq!(f.step(0.0, 0.0, at(39)), Some(1000)); // capped at the target
        assert_eq!(f.step(0.0, 0.0, at(44)), None);
        assert_eq!(f.step(0.0, 0.0, at(100)), None);
        assert_eq!(f.current, 1000);
        // A new target: the budget jumps to it; shrinking then starts from it (the rate limit
        // still counts from the last shrink), growing stops at it.
        f.set_target(600);
        assert_eq!(f.current, 600);
        assert_eq!(f.step(15.0, 0.0, at(101)), Some(540));
        f.set_target(100); // below the floor
        assert_eq!((f.initial, f.current), (500, 500));
        // Initial below the floor starts at the floor.
        let f = PressureFollower::new(10, 64);
        assert_eq!((f.initial, f.current), (64, 64));
    }

    #[test]
    fn follower_handles_tiny_and_huge_budgets() {
        let t0 = Instant::now();
        let mut f = PressureFollower::new(5, 0);
        assert_eq!(f.step(100.0, 100.0, t0), Some(4)); // at least one byte per step
        let mut f = PressureFollower::new(u64::MAX, 0);
        assert_eq!(f.step(100.0, 0.0, t0), Some(u64::MAX - u64::MAX / 10));
        assert_eq!(f.step(f64::NAN, f64::NAN, t0 + Duration::from_secs(60)), None);
    }
}
