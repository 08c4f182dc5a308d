//! Live memory-budget control: decides *when* and *to what* the memory budget of a running
//! `generate` / `chat` (and later the server) changes. The engine applies a change between tokens
//! (`Engine::set_memory_budget`); this module only watches and decides.
//!
//! [`BudgetControl::start`] spawns one watcher thread (none when there is nothing to watch) that
//! publishes the newest requested budget; the decoding loop calls
//! [`BudgetControl::take_change`] between tokens and applies what it returns. Two sources:
//!
//! - **Control file** (`--budget-file F`): F holds a budget (`700M`, `1.5G`, `60%`, bytes; the
//!   caller's parser reads it). It is read every [`FILE_POLL`] and at once (within [`TICK`]) on
//!   `SIGUSR1`, whose handler only bumps an atomic counter (async-signal-safe; a counter rather
//!   than a flag so that several watchers in one process each see the signal). The file's value
//!   is applied when its content or modification time changes, and on every `SIGUSR1`. Its
//!   value at start counts too (the file is the live target). An empty or missing file is
//!   ignored silently (an editor caught between truncating and writing); unparseable content
//!   gives one warning on stderr naming the file and the text, and the budget stays; a value
//!   below the run's floor (its fixed part) is raised to the floor with a warning. Write the file
//!   atomically (write a temporary file, then rename) to be safe from half-written values.
//! - **Memory pressure** (`--follow-pressure`): Linux PSI (`some`/`full avg10`, the share of the
//!   last 10 s in which some / all tasks stalled on memory) is read every [`PSI_POLL`], from the
//!   process's own cgroup v2 `memory.pressure` when it is in a non-root cgroup v2, else from
//!   `/proc/pressure/memory`. [`PressureFollower`] (pure, tested on scripted timelines) shrinks the
//!   budget by [`SHRINK_PERCENT`]% of the current budget under pressure (some ≥
//!   [`PRESSURE_SOME`] or full ≥ [`PRESSURE_FULL`]), at most once per [`SHRINK_EVERY`], never below
//!   the floor; after [`CALM_FOR`] without pressure (some < [`CALM_SOME`]) it grows back by
//!   [`GROW_PERCENT`]% of the target per [`GROW_EVERY`], never above the target. The target is the
//!   run's initial budget, or the control file's value once it sets one (a file change resets the
//!   budget to the new target).
//!
//! Without PSI (a kernel without `CONFIG_PSI`, or booted with `psi=0`) `start` with
//! `follow_pressure` fails with an [`io::ErrorKind::Unsupported`] error saying so.

mod pressure;
pub use pressure::*;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

/// How often the control file is read.
pub const FILE_POLL: Duration = Duration::from_millis(200);
/// How often PSI is read.
pub const PSI_POLL: Duration = Duration::from_secs(1);
/// The watcher's wake-up period: the latency of a `SIGUSR1` re-read and of [`BudgetControl::stop`].
pub const TICK: Duration = Duration::from_millis(50);
/// Longest control file read (anything past it is ignored).
const MAX_FILE_BYTES: u64 = 4096;

/// Parses a budget text into bytes; the error is shown to the user.
pub type BudgetParser = Box<dyn Fn(&str) -> Result<u64, String> + Send>;

/// What [`BudgetControl::start`] watches.
pub struct ControlOptions {
    /// The budget the run started with (bytes).
    pub initial: u64,
    /// The smallest budget the run can take (its fixed part); never go below.
    pub floor: u64,
    /// `--budget-file F`: a file holding a budget such as "700M", "1.5G", "60%", "734003200".
    pub control_file: Option<PathBuf>,
    /// `--follow-pressure`: follow Linux memory pressure (PSI).
    pub follow_pressure: bool,
    /// Parses the control file's text (trimmed) into bytes (a percentage needs the model size:
    /// the caller provides it); the error is shown to the user.
    pub parse: BudgetParser,
}

/// The live budget control of one run; see the module docs.
pub struct BudgetControl {
    shared: Arc<Shared>,
    /// Dropped to stop the watcher.
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// Between the watcher and the decoding loop.
struct Shared {
    /// The newest requested budget.
    requested: AtomicU64,
    /// The budget `take_change` last returned (the initial one before).
    returned: AtomicU64,
}

impl Shared {
    fn publish(&self, budget: u64) {
        self.requested.store(budget, Ordering::Release);
    }
}

impl BudgetControl {
    /// Starts watching: the control file (installing the `SIGUSR1` handler, and applying the
    /// file's current value at once) and/or PSI (checked readable here). Spawns one thread, or
    /// none when there is neither. Errors: PSI asked for but not available
    /// ([`io::ErrorKind::Unsupported`]), or the signal handler could not be installed.
    pub fn start(opts: ControlOptions) -> io::Result<BudgetControl> {
        let initial = opts.initial.max(opts.floor);
        let shared = Arc::new(Shared { requested: AtomicU64::new(initial), returned: AtomicU64::new(initial) });
        if opts.control_file.is_none() && !opts.follow_pressure {
            return Ok(BudgetControl { shared, stop: None, thread: None });
        }
        let psi = if opts.follow_pressure {
            let path = psi_memory_path()?;
            let text = fs::read_to_string(&path)?;
            parse_psi(&text).map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidData, format!("{}: unexpected content: {e}", path.display()))
            })?;
            Some(path)
        } else {
            None
        };
        if opts.control_file.is_some() {
            install_sigusr1()?;
        }
        let mut watcher = Watcher::new(opts, shared.clone(), psi);
        watcher.poll_file(false);
        let (tx, rx) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new().name("sift-budget".into()).spawn(move || watcher.run(rx))?;
        Ok(BudgetControl { shared, stop: Some(tx), thread: Some(thread) })
    }

    /// The newest requested budget, if it differs from the one this returned last (or from the
    /// initial budget, before the first change). Cheap (two atomics): call it between tokens.
    pub fn take_change(&self) -> Option<u64> {
        let v = self.shared.requested.load(Ordering::Acquire);
        let old = self.shared.returned.swap(v, Ordering::AcqRel);
        (v != old).then_some(v)
    }

    /// The newest requested budget (whether taken or not).
    #[cfg(test)]
    pub fn requested(&self) -> u64 {
        self.shared.requested.load(Ordering::Acquire)
    }

    /// Stops the watcher thread and waits for it (within [`TICK`]). Dropping does the same.
    #[cfg(test)]
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for BudgetControl {
    fn drop(&mut self) {
        self.shutdown();
    }
}

// ---- SIGUSR1 ----

/// Bumped by the `SIGUSR1` handler; each watcher remembers the value it last saw.
static SIGUSR1_COUNT: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_sigusr1(_: libc::c_int) {
    // A lock-free atomic add: async-signal-safe.
    SIGUSR1_COUNT.fetch_add(1, Ordering::Relaxed);
}

/// Installs the `SIGUSR1` handler once per process (with `SA_RESTART`, so that other threads'
/// system calls are restarted rather than failing with `EINTR`). It stays installed: restoring
/// the default action (terminate) would let a late signal kill the process.
fn install_sigusr1() -> io::Result<()> {
    static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();
    let r = INSTALLED.get_or_init(|| {
        // SAFETY: a zeroed `sigaction` is a valid value; the pointers passed are to this local
        // (a null old-action pointer is allowed); the handler only does an atomic add, which is
        // async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigusr1 as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL));
            }
        }
        Ok(())
    });
    r.map_err(|e| {
        let e = io::Error::from_raw_os_error(e);
        io::Error::new(e.kind(), format!("installing the SIGUSR1 handler: {e}"))
    })
}

// ---- the watcher ----

/// What the control file looked like when last read.
#[derive(Clone, Debug, PartialEq)]
struct FileState {
    mtime: Option<SystemTime>,
    len: u64,
    text: String,
}

struct Watcher {
    file: Option<PathBuf>,
    /// The control file's state when last read (`None`: missing or never read).
    seen: Option<FileState>,
    /// The last read error printed (printed again only when it changes).
    file_error: Option<String>,
    psi: Option<PathBuf>,
    psi_error: Option<String>,
    follower: PressureFollower,
    floor: u64,
    parse: BudgetParser,
    shared: Arc<Shared>,
    signals_seen: usize,
}

impl Watcher {
    fn new(opts: ControlOptions, shared: Arc<Shared>, psi: Option<PathBuf>) -> Watcher {
        let floor = opts.floor;
        Watcher {
            file: opts.control_file,
            seen: None,
            file_error: None,
            psi,
            psi_error: None,
            follower: PressureFollower::new(opts.initial, floor),
            floor,
            parse: opts.parse,
            shared,
            signals_seen: SIGUSR1_COUNT.load(Ordering::Relaxed),
        }
    }

    /// The current budget (the follower's, which is the target when not following pressure).
    fn current(&self) -> u64 {
        self.follower.current
    }

    fn run(mut self, stop: mpsc::Receiver<()>) {
        let start = Instant::now();
        let (mut next_file, mut next_psi) = (start + FILE_POLL, start + PSI_POLL);
        loop {
            match stop.recv_timeout(TICK) {
                Err(RecvTimeoutError::Timeout) => {}
                _ => return,
            }
            let now = Instant::now();
            let signals = SIGUSR1_COUNT.load(Ordering::Relaxed);
            let signalled = signals != self.signals_seen;
            self.signals_seen = signals;
            if self.file.is_some() && (signalled || now >= next_file) {
                self.poll_file(signalled);
                next_file = now + FILE_POLL;
            }
            if self.psi.is_some() && now >= next_psi {
                self.poll_psi(now);
                next_psi = now + PSI_POLL;
            }
        }
    }

    /// Reads the control file; applies its value when it changed (or `force`).
    fn poll_file(&mut self, force: bool) {
        let Some(path) = self.file.clone() else { return };
        let state = match read_control_file(&path) {
            Ok(Some(s)) => s,
            Ok(None) => {
                self.seen = None; // missing: a re-created file counts as a change
                return;
            }
            Err(e) => {
                let msg = e.to_string();
                if self.file_error.as_deref() != Some(msg.as_str()) {
                    eprintln!(
                        "warning: budget file {}: {msg}; keeping the budget at {}",
                        path.display(),
                        fmt_bytes(self.current())
                    );
                    self.file_error = Some(msg);
                }
                return;
            }
        };
        self.file_error = None;
        if !force && self.seen.as_ref() == Some(&state) {
            return;
        }
        let text = state.text.trim().to_string();
        self.seen = Some(state);
        self.apply_text(&path, &text);
    }

    /// Applies the control file's text: a new target (clamped to the floor), or a warning.
    fn apply_text(&mut self, path: &Path, text: &str) {
        if text.is_empty() {
            return;
        }
        match (self.parse)(text) {
            Ok(mut v) => {
                if v < self.floor {
                    eprintln!(
                        "warning: budget file {} asks for {}, below the smallest budget this run can take; using {}",
                        path.display(),
                        fmt_bytes(v),
                        fmt_bytes(self.floor)
                    );
                    v = self.floor;
                }
                self.follower.set_target(v);
                self.shared.publish(self.follower.current);
            }
            Err(e) => eprintln!(
                "warning: budget file {}: cannot use '{}': {e}; keeping the budget at {}",
                path.display(),
                text.escape_debug(),
                fmt_bytes(self.current())
            ),
        }
    }

    fn poll_psi(&mut self, now: Instant) {
        let Some(path) = self.psi.clone() else { return };
        let r = fs::read_to_string(&path).map_err(|e| e.to_string()).and_then(|t| parse_psi(&t));
        match r {
            Ok(p) => {
                self.psi_error = None;
                self.on_psi(p, now);
            }
            Err(msg) => {
                if self.psi_error.as_deref() != Some(msg.as_str()) {
                    eprintln!("warning: memory pressure {}: {msg}; budget left as it is", path.display());
                    self.psi_error = Some(msg);
                }
            }
        }
    }

    fn on_psi(&mut self, p: Psi, now: Instant) {
        if let Some(v) = self.follower.step(p.some_avg10, p.full_avg10, now) {
            self.shared.publish(v);
        }
    }
}

/// The control file's state, `None` if it does not exist. Reads at most [`MAX_FILE_BYTES`].
fn read_control_file(path: &Path) -> io::Result<Option<FileState>> {
    // A FIFO or a device is refused without blocking (it would hang the watcher).
    let bytes = match sift_output::read_regular(path, MAX_FILE_BYTES) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = fs::metadata(path)?;
    let text = String::from_utf8(bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "content is not UTF-8 text"))?;
    Ok(Some(FileState { mtime: meta.modified().ok(), len: meta.len(), text }))
}

fn fmt_bytes(b: u64) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    } else if b >= 1 << 20 {
        format!("{:.1} MiB", b as f64 / MIB)
    } else {
        format!("{b} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A stand-in for the CLI's budget parser: bytes or a number with an `M` suffix.
    fn parse_test(s: &str) -> Result<u64, String> {
        match s.strip_suffix('M') {
            Some(m) => m.parse::<u64>().map(|m| m * MIB).map_err(|e| e.to_string()),
            None => s.parse::<u64>().map_err(|e| e.to_string()),
        }
    }

    fn opts(initial: u64, floor: u64, file: Option<PathBuf>, pressure: bool) -> ControlOptions {
        ControlOptions { initial, floor, control_file: file, follow_pressure: pressure, parse: Box::new(parse_test) }
    }

    /// Polls `take_change` until it returns something or `limit` passes.
    fn wait_change(c: &BudgetControl, limit: Duration) -> Option<u64> {
        let end = Instant::now() + limit;
        loop {
            if let Some(v) = c.take_change() {
                return Some(v);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Replaces the file's content the safe way (a new file renamed over it).
    fn write_atomic(path: &Path, text: &str) {
        let tmp = path.with_extension("tmp");
        fs::write(&tmp, text).unwrap();
        fs::rename(&tmp, path).unwrap();
    }

    #[test]
    fn without_sources_nothing_changes() {
        let c = BudgetControl::start(opts(100 * MIB, 10 * MIB, None, false)).unwrap();
        assert!(c.thread.is_none());
        assert_eq!(c.take_change(), None);
        assert_eq!(c.requested(), 100 * MIB);
        c.stop();
    }

    #[test]
    fn control_file_changes_arrive_within_a_second() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("budget");
        fs::write(&path, "150M\n").unwrap();
        let c = BudgetControl::start(opts(200 * MIB, 10 * MIB, Some(path.clone()), false)).unwrap();
        // The value at start applies at once.
        assert_eq!(c.take_change(), Some(150 * MIB));
        assert_eq!(c.take_change(), None);
        fs::write(&path, "120M").unwrap();
        assert_eq!(wait_change(&c, Duration::from_secs(1)), Some(120 * MIB));
        write_atomic(&path, "130M");
        assert_eq!(wait_change(&c, Duration::from_secs(1)), Some(130 * MIB));
        // Unparseable: a warning, no change.
        fs::write(&path, "lots").unwrap();
        assert_eq!(wait_change(&c, Duration::from_millis(700)), None);
        assert_eq!(c.requested(), 130 * MIB);
        // Empty or deleted: ignored.
        fs::write(&path, "").unwrap();
        assert_eq!(wait_change(&c, Duration::from_millis(500)), None);
        fs::remove_file(&path).unwrap();
        assert_eq!(wait_change(&c, Duration::from_millis(500)), None);
        // Below the floor: clamped to it.
        fs::write(&path, "1M").unwrap();
        assert_eq!(wait_change(&c, Duration::from_secs(1)), Some(10 * MIB));
        c.stop();
    }

    #[test]
    fn control_file_created_after_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("later");
        let c = BudgetControl::start(opts(64 * MIB, MIB, Some(path.clone()), false)).unwrap();
        assert_eq!(c.take_change(), None);
        write_atomic(&path, "33554432");
        assert_eq!(wait_change(&c, Duration::from_secs(1)), Some(32 * MIB));
        drop(c); // Drop stops the thread too
    }

    #[test]
    fn sigusr1_rereads_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("budget");
        fs::write(&path, "300M").unwrap();
        let c = BudgetControl::start(opts(400 * MIB, 10 * MIB, Some(path.clone()), false)).unwrap();
        assert_eq!(c.take_change(), Some(300 * MIB));
        let before = SIGUSR1_COUNT.load(Ordering::Relaxed);
        write_atomic(&path, "250M");
        // SAFETY: kill(2) on our own process; the handler is installed by `start`.
        assert_eq!(unsafe { libc::kill(libc::getpid(), libc::SIGUSR1) }, 0);
        assert_eq!(wait_change(&c, Duration::from_secs(1)), Some(250 * MIB));
        assert!(SIGUSR1_COUNT.load(Ordering::Relaxed) > before, "handler did not run");
        // A signal with the file unchanged re-applies the same value: no change to report.
        // SAFETY: as above: kill(2) on our own process, whose SIGUSR1 handler `start` installed.
        unsafe { libc::kill(libc::getpid(), libc::SIGUSR1) };
        assert_eq!(wait_change(&c, Duration::from_millis(300)), None);
        c.stop();
    }

    #[test]
    fn follow_pressure_starts_where_psi_exists() {
        match BudgetControl::start(opts(100 * MIB, 10 * MIB, None, true)) {
            Ok(c) => {
                assert!(c.thread.is_some());
                c.stop();
            }
            Err(e) => {
                assert!(fs::read_to_string(PROC_PSI_MEMORY).is_err(), "PSI is readable, yet: {e}");
                assert_eq!(e.kind(), io::ErrorKind::Unsupported);
            }
        }
    }

    /// The file's value becomes the follower's target; pressure then shrinks from it and calm
    /// grows back to it.
    #[test]
    fn file_target_and_pressure_combine() {
        let shared = Arc::new(Shared { requested: AtomicU64::new(1000), returned: AtomicU64::new(1000) });
        let mut w = Watcher::new(opts(1000, 100, None, true), shared.clone(), Some(PathBuf::from("/unused")));
        let path = Path::new("F");
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let busy = Psi { some_avg10: 40.0, full_avg10: 5.0 };
        let calm = Psi { some_avg10: 0.0, full_avg10: 0.0 };
        w.on_psi(busy, at(0));
        assert_eq!(shared.requested.load(Ordering::Relaxed), 900);
        w.apply_text(path, "2000");
        assert_eq!((w.follower.initial, shared.requested.load(Ordering::Relaxed)), (2000, 2000));
        w.on_psi(busy, at(2));
        assert_eq!(shared.requested.load(Ordering::Relaxed), 1800);
        w.apply_text(path, "junk"); // warning, nothing changes
        w.apply_text(path, "50"); // below the floor: 100
        assert_eq!((w.follower.initial, shared.requested.load(Ordering::Relaxed)), (100, 100));
        w.apply_text(path, "400");
        w.on_psi(busy, at(4));
        assert_eq!(shared.requested.load(Ordering::Relaxed), 360);
        w.on_psi(calm, at(5));
        w.on_psi(calm, at(15));
        assert_eq!(shared.requested.load(Ordering::Relaxed), 400);
        w.on_psi(calm, at(100));
        assert_eq!(shared.requested.load(Ordering::Relaxed), 400);
    }
}
