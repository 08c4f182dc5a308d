//! Prometheus text exposition, written by hand: request and token counters, queue gauges, the
//! memory budget and cache gauges the worker publishes, and fixed-bucket histograms for time to
//! first token, inter-token latency and request duration.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Upper bounds (seconds) of the time-to-first-token and request-duration buckets.
const TTFT_BUCKETS: [f64; 12] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
/// Upper bounds (seconds) of the inter-token-latency buckets.
const ITL_BUCKETS: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0];

/// A histogram with fixed buckets.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram { bounds, counts: vec![0; bounds.len()], sum: 0.0, count: 0 }
    }

    pub fn observe(&mut self, v: f64) {
        for (i, b) in self.bounds.iter().enumerate() {
            if v <= *b {
                self.counts[i] += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

/// What the worker last published about the engine's memory (under `--memory`; zeros otherwise).
#[derive(Clone, Debug, Default)]
pub struct MemoryGauges {
    pub budget_bytes: u64,
    pub hit_rate: f64,
    pub bytes_read: u64,
    pub rss_bytes: u64,
}

/// A per-slot metric: name, kind, help, and its value for a slot.
type SlotMetric = (&'static str, &'static str, &'static str, fn(&SlotGauge) -> f64);

/// One parallel slot's figures (`-np`), as the worker last published them.
#[derive(Clone, Debug, Default)]
pub struct SlotGauge {
    pub processing: bool,
    /// Tokens in the slot's KV cache.
    pub n_past: usize,
    /// Tokens the slot has generated since the start.
    pub generated: u64,
}

/// The last budgeted decode against its bound (`sift_sim::bound`), for /metrics.
#[derive(Clone, Debug, Default)]
pub struct DecodeGauges {
    pub tok_s: f64,
    pub bound_tok_s: f64,
    pub bytes_read_per_token: f64,
    pub must_read_per_token: f64,
    pub read_amplification: f64,
    pub hit_rate_bytes: f64,
}

/// Every metric the server exports.
#[derive(Debug)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub errors: AtomicU64,
    pub cancelled: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub queued: AtomicU64,
    pub running: AtomicU64,
    hist: Mutex<Hists>,
    memory: Mutex<MemoryGauges>,
    decode: Mutex<DecodeGauges>,
    /// Per slot, and the sequences in the last batch step (`-np`).
    slots: Mutex<(Vec<SlotGauge>, usize)>,
}

#[derive(Debug)]
struct Hists {
    ttft: Histogram,
    itl: Histogram,
    duration: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            running: AtomicU64::new(0),
            hist: Mutex::new(Hists {
                ttft: Histogram::new(&TTFT_BUCKETS),
                itl: Histogram::new(&ITL_BUCKETS),
                duration: Histogram::new(&TTFT_BUCKETS),
            }),
            memory: Mutex::new(MemoryGauges::default()),
            decode: Mutex::new(DecodeGauges::default()),
            slots: Mutex::new((Vec::new(), 0)),
        }
    }
}

impl Metrics {
    pub fn inc(c: &AtomicU64, by: u64) {
        c.fetch_add(by, Ordering::Relaxed);
    }

    pub fn dec(c: &AtomicU64) {
        let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(v.saturating_sub(1)));
    }

    pub fn observe_ttft(&self, secs: f64) {
        if let Ok(mut h) = self.hist.lock() {
            h.ttft.observe(secs);
        }
    }

    pub fn observe_itl(&self, secs: f64) {
        if let Ok(mut h) = self.hist.lock() {
            h.itl.observe(secs);
        }
    }

    pub fn observe_duration(&self, secs: f64) {
        if let Ok(mut h) = self.hist.lock() {
            h.duration.observe(secs);
        }
    }

    pub fn set_memory(&self, g: MemoryGauges) {
        if let Ok(mut m) = self.memory.lock() {
            *m = g;
        }
    }

    /// Publishes the last budgeted decode's figures against its bound.
    pub fn set_decode(&self, t: &sift_sim::bound::DecodeTelemetry) {
        if let Ok(mut d) = self.decode.lock() {
            *d = DecodeGauges {
                tok_s: t.tok_s,
                bound_tok_s: t.bound.tok_s,
                bytes_read_per_token: t.bytes_read_per_token,
                must_read_per_token: t.bound.must_read_per_token,
                read_amplification: t.read_amplification,
                hit_rate_bytes: t.hit_rate_bytes,
            };
        }
    }

    /// Publishes the slots' figures and how many sequences the last step batched.
    pub fn set_slots(&self, slots: Vec<SlotGauge>, last_batch: usize) {
        if let Ok(mut m) = self.slots.lock() {
            *m = (slots, last_batch);
        }
    }

    pub fn memory(&self) -> MemoryGauges {
        self.memory.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// The exposition text (`text/plain; version=0.0.4`).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut metric = |name: &str, kind: &str, help: &str, v: f64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
        };
        metric("sift_requests_total", "counter", "Generation requests received", get(&self.requests) as f64);
        metric("sift_request_errors_total", "counter", "Generation requests that failed", get(&self.errors) as f64);
        metric(
            "sift_requests_cancelled_total",
            "counter",
            "Requests cancelled (client gone or shutdown)",
            get(&self.cancelled) as f64,
        );
        metric("sift_prompt_tokens_total", "counter", "Prompt tokens evaluated", get(&self.prompt_tokens) as f64);
        metric("sift_generated_tokens_total", "counter", "Tokens generated", get(&self.generated_tokens) as f64);
        metric("sift_queue_depth", "gauge", "Requests waiting for the worker", get(&self.queued) as f64);
        metric("sift_requests_running", "gauge", "Requests the worker is running", get(&self.running) as f64);
        let m = self.memory();
        let rss = sift_engine::current_rss().unwrap_or(m.rss_bytes);
        metric("sift_memory_budget_bytes", "gauge", "Current memory budget (0: none)", m.budget_bytes as f64);
        metric("sift_resident_bytes", "gauge", "Resident memory of the server process (VmRSS)", rss as f64);
        metric("sift_cache_hit_rate", "gauge", "Column cache hit rate under --memory", m.hit_rate);
        metric("sift_bytes_read_total", "counter", "Bytes read from the slow tier under --memory", m.bytes_read as f64);
        let d = self.decode.lock().map(|d| d.clone()).unwrap_or_default();
        let last = "of the last request's decode under --memory";
        metric("sift_decode_tokens_per_second", "gauge", &format!("Tokens per second {last}"), d.tok_s);
        metric(
            "sift_decode_bound_tokens_per_second",
            "gauge",
            &format!("The bound (must-read bytes at the disk's best bandwidth, or compute) {last}"),
            d.bound_tok_s,
        );
        metric(
            "sift_decode_bytes_read_per_token",
            "gauge",
            &format!("Bytes read per token {last}"),
            d.bytes_read_per_token,
        );
        metric(
            "sift_decode_must_read_per_token",
            "gauge",
            &format!("Bytes the optimal cache must read per token {last}"),
            d.must_read_per_token,
        );
        metric(
            "sift_decode_read_amplification",
            "gauge",
            &format!("Bytes read over the bytes of the missed columns used {last}"),
            d.read_amplification,
        );
        metric("sift_decode_hit_rate_bytes", "gauge", &format!("Cache hit rate by bytes {last}"), d.hit_rate_bytes);
        if let Ok(slots) = self.slots.lock() {
            if !slots.0.is_empty() {
                metric("sift_batch_sequences", "gauge", "Sequences in the last batch step (-np)", slots.1 as f64);
                let per_slot: [SlotMetric; 3] = [
                    ("sift_slot_processing", "gauge", "Whether the slot runs a request", |g| {
                        f64::from(u8::from(g.processing))
                    }),
                    ("sift_slot_n_past", "gauge", "Tokens in the slot's KV cache", |g| g.n_past as f64),
                    ("sift_slot_generated_tokens_total", "counter", "Tokens the slot generated", |g| {
                        g.generated as f64
                    }),
                ];
                for (name, kind, help, value) in per_slot {
                    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
                    for (i, g) in slots.0.iter().enumerate() {
                        let _ = writeln!(out, "{name}{{slot=\"{i}\"}} {}", value(g));
                    }
                }
            }
        }
        if let Ok(h) = self.hist.lock() {
            h.ttft.write(&mut out, "sift_time_to_first_token_seconds", "Time from request to first generated token");
            h.itl.write(&mut out, "sift_inter_token_latency_seconds", "Time between generated tokens");
            h.duration.write(&mut out, "sift_request_duration_seconds", "Time from request to its last token");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_histograms_cumulatively() {
        let m = Metrics::default();
        m.observe_ttft(0.03);
        m.observe_ttft(0.3);
        Metrics::inc(&m.requests, 2);
        let t = m.render();
        assert!(t.contains("sift_requests_total 2"), "{t}");
        assert!(t.contains("sift_time_to_first_token_seconds_bucket{le=\"0.05\"} 1"), "{t}");
        assert!(t.contains("sift_time_to_first_token_seconds_bucket{le=\"0.5\"} 2"), "{t}");
        assert!(t.contains("sift_time_to_first_token_seconds_count 2"), "{t}");
    }
}
