//! [`Progress`]: how far a job's reads have come, so a reader can use the first requests' bytes
//! while the later ones are still in flight (a site's on-demand reads streamed into the kernels).
//!
//! A streaming tier ([`SlowTier::read_batch_progress`](super::SlowTier::read_batch_progress))
//! publishes the number of the job's *leading* requests that are complete as completions arrive;
//! others publish it once, at the end. The loader marks the job finished either way, failed or
//! not, so a waiter never waits for a job that has ended.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

use super::lock;

/// Leading requests of a job known complete, and whether the job failed.
#[derive(Debug, Default)]
pub struct Progress {
    done: AtomicUsize,
    failed: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Progress {
    pub fn new() -> Progress {
        Progress::default()
    }

    /// Leading requests complete: their bytes are in the job's buffer and nothing writes them
    /// again (`Acquire`: the tier's writes happen before).
    pub fn done(&self) -> usize {
        self.done.load(Ordering::Acquire)
    }

    /// Whether the job ended with an error (its bytes past `done` are not to be used).
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// The first `n` requests are complete (a tier calls this as completions arrive).
    pub fn advance(&self, n: usize) {
        if n > self.done.load(Ordering::Relaxed) {
            self.done.store(n, Ordering::Release);
            let _g = lock(&self.lock);
            self.cv.notify_all();
        }
    }

    /// The job ended: every request complete, or failed.
    pub fn finish(&self, ok: bool) {
        if !ok {
            self.failed.store(true, Ordering::Release);
        }
        let _g = lock(&self.lock);
        if ok {
            self.done.store(usize::MAX, Ordering::Release);
        }
        self.cv.notify_all();
    }

    /// Waits until the first `n` requests are complete; false when the job failed first.
    pub fn wait_for(&self, n: usize) -> bool {
        loop {
            if self.done() >= n {
                return true;
            }
            if self.failed() {
                return false;
            }
            let g = lock(&self.lock);
            // Re-checked under the lock: `advance` and `finish` notify holding it.
            if self.done() >= n || self.failed() {
                continue;
            }
            drop(self.cv.wait(g).unwrap_or_else(|e| e.into_inner()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_waiter_wakes_when_its_requests_are_done_or_the_job_fails() {
        let p = Arc::new(Progress::new());
        let q = Arc::clone(&p);
        let t = std::thread::spawn(move || {
            for n in 1..=5 {
                std::thread::sleep(std::time::Duration::from_millis(2));
                q.advance(n);
            }
            q.finish(true);
        });
        assert!(p.wait_for(3));
        assert!(p.done() >= 3);
        assert!(p.wait_for(1000), "finished: every request is done");
        t.join().unwrap();
        let f = Arc::new(Progress::new());
        let g = Arc::clone(&f);
        let t = std::thread::spawn(move || {
            g.advance(2);
            std::thread::sleep(std::time::Duration::from_millis(5));
            g.finish(false);
        });
        assert!(!f.wait_for(4), "a failed job wakes its waiter with false");
        assert!(f.wait_for(2), "what was done before the failure stays done");
        t.join().unwrap();
    }
}
