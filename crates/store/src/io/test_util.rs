//! Helpers shared by the `io` modules' tests: the test model, deterministic randomness, and the
//! bytes a read must deliver.

use std::path::PathBuf;
use std::sync::Arc;

use super::{ReadReq, DIRECT_ALIGN};

pub const PAGE: usize = DIRECT_ALIGN;

pub fn model_path() -> PathBuf {
    let p = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    assert!(p.exists(), "{} missing: run ./scripts/fetch-model.sh", p.display());
    p
}

pub fn model_bytes() -> Arc<[u8]> {
    std::fs::read(model_path()).unwrap().into()
}

/// xorshift64*: deterministic test randomness without a dependency.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Expected buffer contents of `r`: file bytes, zeros past the end of the file.
pub fn expected(file: &[u8], r: &ReadReq) -> Vec<u8> {
    let mut v = vec![0u8; r.len];
    let start = (r.offset as usize).min(file.len());
    let end = (r.offset as usize + r.len).min(file.len());
    v[..end - start].copy_from_slice(&file[start..end]);
    v
}
