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
//! Where a row's result would depend on the batch (column kernels of a sparse decode, the tiered
//! store's reads, the GPU), or on its sequence's history (a selector with per-sequence state),
//! the runs are evaluated one after the other instead, each as it would be alone.
//!
//! Under a memory budget every slot's cache is counted: the pages beyond the first slot's first
//! page come out of the weight cache (`TieredStore::set_kv_growth`), as one cache's growth does.

use crate::forward::{Engine, EvalError, Logits};
use crate::kv::KvCache;
use sift_sparsity::Phase;

/// The next tokens of one sequence in a batch of several.
#[derive(Clone, Copy, Debug)]
pub struct SlotRun<'a> {
    /// The slot (sequence) they continue.
    pub slot: usize,
    pub tokens: &'a [u32],
    /// Whether the run's last token's logits are wanted.
    pub logits: bool,
}

/// The rows of a batch one sequence holds, while the batch runs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RunRows {
    pub slot: usize,
    pub row0: usize,
    pub len: usize,
}

/// The slots' parked caches and positions, which one is in use, and a batch's runs.
#[derive(Default)]
pub(crate) struct Slots {
    /// One entry per slot; the entry of the slot in use is an empty placeholder.
    parked: Vec<(KvCache, usize)>,
    current: usize,
    pub(crate) runs: Vec<RunRows>,
    /// Logits of the runs that asked for them, in run order.
    logits: Vec<f32>,
}

impl Engine {
    /// Gives the engine `n` sequences (slots), each with its own KV cache of `n_ctx / n`
    /// positions as llama-server splits its context. Slot 0 keeps the current conversation.
    /// Refused with a GPU tier (its layers keep one cache) or a selector that keeps per-sequence
    /// state (core neurons), and under a budget when the new caches' first pages do not fit.
    pub fn set_slots(&mut self, n: usize) -> Result<(), String> {
        if n == self.n_slots() {
            return Ok(());
        }
        if n == 0 || n > 256 {
            return Err(format!("{n} parallel sequences: use 1 to 256"));
        }
        if self.n_slots() != 1 {
            return Err("the number of parallel sequences is set once".into());
        }
        if n > 1 {
            if self.gpu().is_some() || self.hybrid.is_some() {
                return Err("parallel sequences (-np) do not run with a GPU tier yet: use -np 1".into());
            }
            if self.selector().keeps_sequence_state() {
                return Err(format!(
                    "the selector {} keeps state per sequence; parallel sequences need -np 1 with it",
                    self.selector().describe()
                ));
            }
            if self.n_ctx / n < 2 {
                return Err(format!("-c {} is too small for {n} parallel sequences", self.n_ctx));
            }
        }
        let c = &self.model.config;
        let first = self.kv_first_page();
        let (kt, vt) = (self.kv.k_type, self.kv.v_type);
        let mut parked: Vec<(KvCache, usize)> = (0..n)
            .map(|_| {
                let mut kv = KvCache::new(c, kt, vt);
                kv.set_capacity(first);
                (kv, 0)
            })
            .collect();
        parked[0] = (KvCache::new(c, kt, vt), 0);
        let old = std::mem::replace(&mut self.slots.parked, parked);
        self.n_ctx /= n;
        let growth = self.kv_growth_bytes();
        if let Some(store) = self.source.store_mut() {
            if let Err(e) = store.set_kv_growth(growth) {
                self.slots.parked = old;
                self.n_ctx *= n;
                return Err(format!("the KV caches of {n} parallel sequences do not fit the memory budget: {e}"));
            }
        }
        self.slots.current = 0;
        Ok(())
    }

    /// The number of sequences (1 unless [`Engine::set_slots`] gave more).
    pub fn n_slots(&self) -> usize {
        self.slots.parked.len().max(1)
    }

    /// The slot the single-sequence calls work on.
    pub fn current_slot(&self) -> usize {
        self.slots.current
    }

    /// Makes `slot`'s cache and position the engine's own (a swap of a few pointers).
    pub fn use_slot(&mut self, slot: usize) {
        let cur = self.slots.current;
        if slot == cur {
            return;
        }
        assert!(slot < self.n_slots(), "slot {slot} of {}", self.n_slots());
        let Slots { parked, .. } = &mut self.slots;
        std::mem::swap(&mut self.kv, &mut parked[cur].0);
        parked[cur].1 = self.n_past;
        std::mem::swap(&mut self.kv, &mut parked[slot].0);
        self.n_past = parked[slot].1;
        self.slots.current = slot;
    }

    /// Tokens in `slot`'s KV cache.
    pub fn slot_n_past(&self, slot: usize) -> usize {
        if slot == self.slots.current {
            self.n_past
        } else {
            self.slots.parked[slot].1
        }
    }

    /// Bytes of the parked slots' caches (every slot but the one in use).
    pub(crate) fn parked_kv_bytes(&self) -> u64 {
        let c = &self.model.config;
        let (kt, vt) = (self.kv.k_type, self.kv.v_type);
        (self.slots.parked.iter().enumerate())
            .filter(|&(i, _)| i != self.slots.current)
            .map(|(_, (kv, _))| KvCache::bytes(c, kv.capacity(), kt, vt))
            .sum()
    }

    /// Bytes of every slot's cache beyond one first page (what the budget's plan does not hold).
    fn kv_growth_bytes(&self) -> u64 {
        let c = &self.model.config;
        let (kt, vt) = (self.kv.k_type, self.kv.v_type);
        KvCache::bytes(c, self.kv.capacity(), kt, vt) + self.parked_kv_bytes()
            - KvCache::bytes(c, self.kv_first_page(), kt, vt)
    }

    /// Whether a batch of several sequences computes what each computes alone here: dense
    /// kernels on rows (any selector's masked inputs on GGUF rows; a dense selection on a pack),
    /// nothing that watches or reads
    /// per token (tracer, observer, tiered store, GPU, sparse prefill), and a selector without
    /// per-sequence state. Otherwise [`Engine::eval_slots`] runs one sequence at a time.
    pub fn batches_slots(&self) -> bool {
        self.slots_batch_blocker().is_none()
    }

    /// Why [`Engine::batches_slots`] is false, in a few words.
    pub fn slots_batch_blocker(&self) -> Option<&'static str> {
        Some(if self.source.lone_token_differs(!self.selector().is_dense()) {
            match self.store() {
                Some(_) => "the tiered store reads a lone token's weights its own way",
                None => "a pack computes a lone token's sparse products on its columns",
            }
        } else if self.gpu().is_some() || self.hybrid.is_some() {
            "a GPU tier"
        } else if self.watched() {
            "a tracer"
        } else if self.prefill.0 > 0.0 {
            "sparse prefill"
        } else if self.selector().keeps_sequence_state() {
            "a selector with per-sequence state"
        } else {
            return None;
        })
    }

    /// Evaluates the next tokens of several sequences (at most one run per slot, `n_batch`
    /// tokens in all) and returns the last token's logits of each run that asked, in run order.
    /// A run of more than one token counts as prompt, of one as generation. On an error no
    /// run's tokens stay in its cache.
    pub fn eval_slots(&mut self, runs: &[SlotRun<'_>]) -> Result<&[f32], EvalError> {
        let n_vocab = self.model.config.n_vocab;
        let n: usize = runs.iter().map(|r| r.tokens.len()).sum();
        for (i, r) in runs.iter().enumerate() {
            assert!(r.slot < self.n_slots(), "slot {} of {}", r.slot, self.n_slots());
            assert!(runs[..i].iter().all(|o| o.slot != r.slot), "slot {} twice in one batch", r.slot);
            self.check_tokens(r.tokens)?;
            let past = self.slot_n_past(r.slot);
            if past + r.tokens.len() > self.n_ctx {
                return Err(EvalError::ContextFull {
                    n_past: past,
                    n_new: r.tokens.len(),
                    n_ctx: self.n_ctx,
                    n_ctx_train: self.model.config.n_ctx_train,
                });
            }
        }
        self.slots.logits.clear();
        if runs.len() == 1 || !self.batches_slots() || n > self.n_batch() {
            // One sequence at a time, each exactly as alone.
            for r in runs {
                self.use_slot(r.slot);
                let logits = self.eval(r.tokens, Logits::Last)?;
                if r.logits {
                    let row = logits[..n_vocab].to_vec();
                    self.slots.logits.extend_from_slice(&row);
                }
            }
            return Ok(&self.slots.logits);
        }
        self.apply_budget_request();
        for r in runs {
            self.use_slot(r.slot);
            let end = self.n_past + r.tokens.len();
            self.reserve_kv(end)?;
        }
        let tokens: Vec<u32> = runs.iter().flat_map(|r| r.tokens.iter().copied()).collect();
        let mut row0 = 0;
        self.slots.runs.clear();
        for r in runs {
            self.slots.runs.push(RunRows { slot: r.slot, row0, len: r.tokens.len() });
            row0 += r.tokens.len();
        }
        let phase = if runs.iter().all(|r| r.tokens.len() == 1) { Phase::Generate } else { Phase::Prompt };
        let result = self.forward_runs(&tokens, runs, phase);
        self.slots.runs.clear();
        result?;
        Ok(&self.slots.logits)
    }

    /// The batch of [`Engine::eval_slots`] through every layer and the output head.
    fn forward_runs(&mut self, tokens: &[u32], runs: &[SlotRun<'_>], phase: Phase) -> Result<(), EvalError> {
        let n = tokens.len();
        let e = self.model.config.n_embd;
        self.begin_slots_batch(phase, n);
        let r = (|| {
            self.embed(tokens)?;
            for l in 0..self.model.layers.len() {
                self.layer(l, n)?;
                if !crate::forward::all_finite(&self.s.x[..n * e]) {
                    return Err(EvalError::NonFinite { where_: format!("layer {l}"), first: 0, end: n });
                }
            }
            // The rows whose logits are wanted (the last of their runs) moved to the end, in
            // order, for the head; from the last down, so none is overwritten before it moves.
            let wanted: Vec<usize> = (self.slots.runs.iter().zip(runs))
                .filter(|(_, r)| r.logits)
                .map(|(rr, _)| rr.row0 + rr.len - 1)
                .collect();
            let k = wanted.len();
            for (i, &row) in wanted.iter().enumerate().rev() {
                let to = n - k + i;
                if to != row {
                    self.s.x.copy_within(row * e..(row + 1) * e, to * e);
                }
            }
            if k > 0 {
                self.output_head(n, k)?;
                if !crate::forward::all_finite(self.head_logits(k)) {
                    return Err(EvalError::NonFinite { where_: "the output head".into(), first: 0, end: n });
                }
                let mut out = std::mem::take(&mut self.slots.logits);
                out.clear();
                out.extend_from_slice(self.head_logits(k));
                self.slots.logits = out;
            }
            Ok(())
        })();
        self.end_slots_batch(phase);
        r?;
        for rr in self.slots.runs.clone() {
            self.use_slot(rr.slot);
            self.n_past += rr.len;
        }
        Ok(())
    }
}
