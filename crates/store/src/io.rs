//! Slow tier: reading pack bytes from disk (io_uring + O_DIRECT, pread fallback, in-memory).
