//! The tiered store's counters ([`TierStats`]): hits and misses of the cache, what preloading
//! brought in and how much of it was used, the bytes read by kind and the time spent reading and
//! waiting; [`account`] counts each finished read job.

use crate::io::LoadDone;

/// Counters of one run (reset with [`TieredStore::reset_stats`](super::TieredStore::reset_stats)).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct TierStats {
    /// Active columns found in the cache / not.
    pub hits: u64,
    pub misses: u64,
    /// The bytes of those columns.
    pub hit_bytes: u64,
    pub miss_bytes: u64,
    /// Misses served from the preload buffer, and misses of ops whose layer had a preload.
    pub preload_hits: u64,
    pub preload_misses: u64,
    pub bytes_preload: u64,
    pub bytes_ondemand: u64,
    pub bytes_prefill: u64,
    pub reads: u64,
    /// Jobs the loader ran (each a batch of `reads`, submitted together).
    pub batches: u64,
    /// Time the slow tier spent reading (loader thread).
    pub io_ns: u64,
    /// Time the compute thread waited for reads, and of it, for a prompt batch's rows.
    pub stall_ns: u64,
    pub stall_prefill_ns: u64,
    /// Predicted (layer, op, channel) parts brought in by preloading and not cached, and how
    /// many of them the token then used.
    pub preload_parts: u64,
    pub preload_used: u64,
    /// Fetches that covered only part of a site's active columns (the misses did not fit the
    /// transient area at once; the engine computes each part and fetches the rest).
    pub partial_fetches: u64,
}

impl TierStats {
    /// What was counted since `earlier` (a copy of these counters taken before).
    pub fn since(&self, earlier: &TierStats) -> TierStats {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        TierStats {
            hits: d(self.hits, earlier.hits),
            misses: d(self.misses, earlier.misses),
            hit_bytes: d(self.hit_bytes, earlier.hit_bytes),
            miss_bytes: d(self.miss_bytes, earlier.miss_bytes),
            preload_hits: d(self.preload_hits, earlier.preload_hits),
            preload_misses: d(self.preload_misses, earlier.preload_misses),
            bytes_preload: d(self.bytes_preload, earlier.bytes_preload),
            bytes_ondemand: d(self.bytes_ondemand, earlier.bytes_ondemand),
            bytes_prefill: d(self.bytes_prefill, earlier.bytes_prefill),
            reads: d(self.reads, earlier.reads),
            batches: d(self.batches, earlier.batches),
            io_ns: d(self.io_ns, earlier.io_ns),
            stall_ns: d(self.stall_ns, earlier.stall_ns),
            stall_prefill_ns: d(self.stall_prefill_ns, earlier.stall_prefill_ns),
            preload_parts: d(self.preload_parts, earlier.preload_parts),
            preload_used: d(self.preload_used, earlier.preload_used),
            partial_fetches: d(self.partial_fetches, earlier.partial_fetches),
        }
    }

    pub fn hit_rate(&self) -> f64 {
        ratio(self.hits, self.hits + self.misses)
    }
    /// The hit rate weighted by the columns' bytes.
    pub fn hit_rate_bytes(&self) -> f64 {
        ratio(self.hit_bytes, self.hit_bytes + self.miss_bytes)
    }
    pub fn preload_precision(&self) -> f64 {
        ratio(self.preload_used, self.preload_parts)
    }
    /// Of the misses of preloaded layers' ops, the fraction the preload buffer held.
    pub fn preload_recall(&self) -> f64 {
        ratio(self.preload_hits, self.preload_misses)
    }
    pub fn bytes_read(&self) -> u64 {
        self.bytes_preload + self.bytes_ondemand + self.bytes_prefill
    }
    pub fn mean_read(&self) -> f64 {
        ratio(self.bytes_read(), self.reads)
    }
    /// Mean requests per loader job (the queue depth the disk saw).
    pub fn mean_batch(&self) -> f64 {
        ratio(self.reads, self.batches)
    }
    /// Achieved read bandwidth while the slow tier was busy, bytes/s.
    pub fn read_bandwidth(&self) -> f64 {
        if self.io_ns == 0 {
            0.0
        } else {
            self.bytes_read() as f64 / (self.io_ns as f64 * 1e-9)
        }
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// What a read job brought in, for [`account`].
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    Preload,
    OnDemand,
    Prefill,
}

/// Counts a finished read job in `stats`: the stall, the loader's busy time, the requests and
/// the bytes by kind.
pub(crate) fn account(stats: &mut TierStats, done: &LoadDone, stall_ns: u64, kind: Kind, n_reqs: u64) {
    stats.stall_ns += stall_ns;
    stats.io_ns += done.busy_ns;
    stats.reads += n_reqs.max(1);
    stats.batches += 1;
    match kind {
        Kind::Preload => stats.bytes_preload += done.bytes,
        Kind::OnDemand => stats.bytes_ondemand += done.bytes,
        Kind::Prefill => {
            stats.bytes_prefill += done.bytes;
            stats.stall_prefill_ns += stall_ns;
        }
    }
}
