//! Property tests: random byte mutations and truncations of valid files never panic, and
//! whatever parses satisfies the reader's guarantees.

mod support;

use proptest::prelude::*;
use sift_gguf::Gguf;

/// A mutation applied at `pos % len`.
#[derive(Clone, Debug)]
enum Mutation {
    Set(usize, u8),
    Flip(usize, u8),
    /// Overwrites 8 bytes with a little-endian u64 (a count, length or offset).
    SetU64(usize, u64),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let interesting = prop_oneof![Just(0u64), Just(1), Just(u64::MAX), Just(1 << 32), Just(1 << 62), any::<u64>()];
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(p, v)| Mutation::Set(p, v)),
        (any::<usize>(), 0u8..8).prop_map(|(p, b)| Mutation::Flip(p, 1 << b)),
        (any::<usize>(), interesting).prop_map(|(p, v)| Mutation::SetU64(p, v)),
    ]
}

/// Applies `muts` within `window` (a range of `bytes`), then truncates to `cut` if given.
fn mutate(bytes: &mut Vec<u8>, window: std::ops::Range<usize>, muts: &[Mutation], cut: Option<usize>) {
    let len = window.len();
    for m in muts {
        match *m {
            Mutation::Set(p, v) => bytes[window.start + p % len] = v,
            Mutation::Flip(p, b) => bytes[window.start + p % len] ^= b,
            Mutation::SetU64(p, v) => {
                let at = window.start + p % len.saturating_sub(8).max(1);
                let end = (at + 8).min(bytes.len());
                bytes[at..end].copy_from_slice(&v.to_le_bytes()[..end - at]);
            }
        }
    }
    if let Some(c) = cut {
        bytes.truncate(c % (bytes.len() + 1));
    }
}

/// Parses `bytes`; on success checks the invariants callers rely on.
fn check(bytes: &[u8]) {
    let Ok(g) = Gguf::parse(bytes) else { return };
    assert!(g.alignment.is_power_of_two());
    assert_eq!(g.data_offset % g.alignment, 0);
    assert_eq!(g.file_size, bytes.len() as u64);
    for (k, v) in &g.metadata {
        // Identity, not equality: a mutated float may be NaN, which never equals itself.
        assert!(g.get(k).is_some_and(|found| std::ptr::eq(found, v)), "lookup of '{k}' finds another entry");
        let _ = (v.to_string(), v.type_name());
    }
    for t in &g.tensors {
        assert!((1..=4).contains(&t.dims.len()));
        assert_eq!(t.offset % g.alignment, 0);
        assert_eq!(t.dims[0] % t.ty.block_size() as u64, 0);
        assert_eq!(t.n_bytes, t.n_elements() / t.ty.block_size() as u64 * t.ty.block_bytes() as u64);
        assert_eq!(g.tensor_data(bytes, t).len() as u64, t.n_bytes);
        assert_eq!(g.tensor(&t.name).map(|x| &x.name), Some(&t.name));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Mutations anywhere in a small synthetic file that uses every value type.
    #[test]
    fn synthetic_mutations_never_panic(
        muts in prop::collection::vec(mutation(), 1..8),
        cut in prop::option::weighted(0.3, any::<usize>()),
    ) {
        let mut bytes = support::sample_builder().bytes();
        let len = bytes.len();
        mutate(&mut bytes, 0..len, &muts, cut);
        check(&bytes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Mutations in the first 64 KiB or the tensor table of the real model's header.
    #[test]
    fn real_header_mutations_never_panic(
        muts in prop::collection::vec(mutation(), 1..6),
        in_tensor_table in any::<bool>(),
        cut in prop::option::weighted(0.2, any::<usize>()),
    ) {
        let mut bytes = real_header().to_vec();
        let len = bytes.len();
        let window = if in_tensor_table { len - 16 * 1024..len } else { 0..64 * 1024 };
        mutate(&mut bytes, window, &muts, cut);
        check(&bytes);
    }
}

/// The real model's header and tensor table, followed by the first 4 KiB of data, with the
/// tensor offsets kept but the data cut off (so only a few small tensors fit).
fn real_header() -> &'static [u8] {
    static HEADER: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    HEADER.get_or_init(|| support::smollm_prefix(1_785_664 + 4096))
}
