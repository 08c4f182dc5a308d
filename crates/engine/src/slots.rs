//! Parallel sequences (llama-server's slots, `-np`): one engine, one KV cache per sequence, and a
//! step that evaluates tokens of several sequences in one pass over the weights (continuous
//! batching).
//!
//! The slot in use owns the engine's own cache and position ([`Engine::n_past`]): every
//! single-sequence call (`eval`, `truncate`, `reserve_kv`) works on it, and with one slot nothing
//! changes. The other slots' caches are parked here and swapped in by [`Engine::use_slot`] (a few
//! pointers). [`Engine::eval_slots`] runs a batch of [`SlotRun`]s, each a slot's next tokens (a
//! decode token, or a chunk of a prompt): the linear ops read each weight once for the whole batch
//! and the attention of each run reads its own slot's cache. A batch computes exactly what each
//! run computes alone: the dense kernels give every token row the same bits whatever the batch
//! (see `matmul`), and a run's attention is the one it has alone.
//!
//! Where a lone token is computed otherwise than a token in a batch (a sparse selection on a pack
//! runs a lone token on its active columns), the decoding sequences still go through the layers
//! together, but each token's products run on its own columns in turn ([`SlotsMode::RowByRow`]).
//! Under a memory budget (the tiered store) every token takes that way too: the union of the
//! batch's columns is fetched into the cache once per layer. Where a row's result would depend on
//! the batch in other ways (the GPU), or on its sequence's history (a selector with per-sequence
//! state), the runs are evaluated one after the other, each as it would be alone.
//!
//! Under a memory budget every slot's cache is counted: the pages beyond the first slot's first
//! page come out of the weight cache (`TieredStore::set_kv_growth`), as one cache's growth does.

use crate::kv::KvCache;

/// Which positions of a run need logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// None (a prompt chunk before its last).
    None,
    /// Only the last token's (generation).
    Last,
    /// Every token's (perplexity, prompt log-probabilities).
    All,
}

/// The next tokens of one sequence in a batch of several.
#[derive(Clone, Copy, Debug)]
pub struct SlotRun<'a> {
    /// The slot (sequence) they continue.
    pub slot: usize,
    pub tokens: &'a [u32],
    /// The logits the run wants: its last token's, every token's, or none.
    pub logits: Logits,
    /// Where the prompt these tokens are part of ends (a prompt read in chunks; `None`: at the
    /// run's end, or not a prompt): sparse prefill's last dense block is the prompt's
    /// ([`Engine::eval_prompt_part`]), and the run counts as prompt whatever its length.
    pub prompt_end: Option<usize>,
}

/// The rows of a batch one sequence holds, while the batch runs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RunRows {
    pub slot: usize,
    pub row0: usize,
    pub len: usize,
}

/// How [`Engine::eval_slots`] shares a step's work between sequences ([`Engine::slots_mode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotsMode {
    Batch,
    RowByRow,
    OneByOne,
}

/// The engine's sequences (slots, `-np`): the one in use — its KV cache and position, which every
/// single-sequence call works on — and the others parked; the context each may fill; a batch's
/// runs while it runs. Where per-sequence state lives (truncating, parking).
pub(crate) struct Sequences {
    /// The KV cache of the sequence in use.
    pub(crate) kv: KvCache,
    /// Tokens in it.
    pub(crate) n_past: usize,
    /// Positions a sequence may hold (`-c`, divided by `-np`).
    pub(crate) n_ctx: usize,
    /// One entry per slot; the entry of the slot in use is an empty placeholder.
    pub(crate) parked: Vec<(KvCache, usize)>,
    pub(crate) current: usize,
    pub(crate) runs: Vec<RunRows>,
    /// Logits of the runs that asked for them, in run order.
    pub(crate) logits: Vec<f32>,
    /// The units a site's tokens used in such a batch (the union of their selections).
    pub(crate) union: Vec<bool>,
}

impl Sequences {
    /// One sequence with an empty cache of `kv`'s types, holding up to `n_ctx` positions.
    pub(crate) fn new(kv: KvCache, n_ctx: usize) -> Sequences {
        Sequences {
            kv,
            n_past: 0,
            n_ctx,
            parked: Vec::new(),
            current: 0,
            runs: Vec::new(),
            logits: Vec::new(),
            union: Vec::new(),
        }
    }
}
