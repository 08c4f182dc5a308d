//! Parallel sequences in the forward pass (the sequences themselves are [`crate::slots`]): taking
//! a slot in use, [`Engine::decode`] — the one forward entry — over runs of one or several
//! sequences, and a batch's rows one at a time.

use super::*;
use crate::kv::KvCache;
use crate::slots::*;
use sift_sparsity::{Phase, Site};

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
            if self.gpu().is_some() || self.gpu.hybrid.is_some() {
                return Err("parallel sequences (-np) do not run with a GPU tier yet: use -np 1".into());
            }
            if self.selector().keeps_sequence_state() {
                return Err(format!(
                    "the selector {} keeps state per sequence; parallel sequences need -np 1 with it",
                    self.selector().describe()
                ));
            }
            if self.seq.n_ctx / n < 2 {
                return Err(format!("-c {} is too small for {n} parallel sequences", self.seq.n_ctx));
            }
        }
        let c = &self.model.config;
        let first = self.kv_first_page();
        let (kt, vt) = (self.seq.kv.k_type, self.seq.kv.v_type);
        let mut parked: Vec<(KvCache, usize)> = (0..n)
            .map(|_| {
                let mut kv = KvCache::new(c, kt, vt);
                kv.set_capacity(first);
                (kv, 0)
            })
            .collect();
        parked[0] = (KvCache::new(c, kt, vt), 0);
        let old = std::mem::replace(&mut self.seq.parked, parked);
        self.seq.n_ctx /= n;
        let growth = self.kv_growth_bytes();
        if let Some(store) = self.source.memory_mut() {
            if let Err(e) = store.set_kv_growth(growth) {
                self.seq.parked = old;
                self.seq.n_ctx *= n;
                return Err(format!("the KV caches of {n} parallel sequences do not fit the memory budget: {e}"));
            }
        }
        self.seq.current = 0;
        Ok(())
    }

    /// The number of sequences (1 unless [`Engine::set_slots`] gave more).
    pub fn n_slots(&self) -> usize {
        self.seq.parked.len().max(1)
    }

    /// The slot the single-sequence calls work on.
    pub fn current_slot(&self) -> usize {
        self.seq.current
    }

    /// Makes `slot`'s cache and position the engine's own (a swap of a few pointers).
    pub fn use_slot(&mut self, slot: usize) {
        let cur = self.seq.current;
        if slot == cur {
            return;
        }
        assert!(slot < self.n_slots(), "slot {slot} of {}", self.n_slots());
        let Sequences { kv, n_past, parked, current, .. } = &mut self.seq;
        std::mem::swap(kv, &mut parked[cur].0);
        parked[cur].1 = *n_past;
        std::mem::swap(kv, &mut parked[slot].0);
        *n_past = parked[slot].1;
        *current = slot;
    }

    /// Forgets `slot`'s positions from `p0` on, the slot in use staying in use (llama.cpp's
    /// `llama_memory_seq_rm(mem, slot, p0, -1)`): a rejected draft's tokens, or a cached prompt
    /// cut where a new one parts from it. `slot`'s next tokens continue at `p0` (at most its
    /// length). Only that slot changes: cut to nothing, its KV pages past the first go back (under
    /// a budget, to the weight cache), and what the slots share — the selector, the store's
    /// context, the tracer — is left alone (with one slot, this is [`Engine::truncate`]).
    pub fn seq_truncate(&mut self, slot: usize, p0: usize) {
        if self.n_slots() == 1 {
            assert_eq!(slot, 0, "slot {slot} of 1");
            return self.truncate(p0);
        }
        let current = self.seq.current;
        self.use_slot(slot);
        self.seq.n_past = self.seq.n_past.min(p0);
        if p0 == 0 {
            self.seq.kv.set_capacity(self.kv_first_page());
            let growth = self.kv_growth_bytes();
            if let Some(memory) = self.source.memory_mut() {
                // Growing the cache back never fails: the fixed part only shrinks.
                let _ = memory.set_kv_growth(growth);
            }
        }
        self.use_slot(current);
    }

    /// Tokens in `slot`'s KV cache.
    pub fn slot_n_past(&self, slot: usize) -> usize {
        if slot == self.seq.current {
            self.seq.n_past
        } else {
            self.seq.parked[slot].1
        }
    }

    /// Bytes of the parked slots' caches (every slot but the one in use).
    pub(crate) fn parked_kv_bytes(&self) -> u64 {
        let c = &self.model.config;
        let (kt, vt) = (self.seq.kv.k_type, self.seq.kv.v_type);
        (self.seq.parked.iter().enumerate())
            .filter(|&(i, _)| i != self.seq.current)
            .map(|(_, (kv, _))| KvCache::bytes(c, kv.capacity(), kt, vt))
            .sum()
    }

    /// Bytes of every slot's cache beyond one first page (what the budget's plan does not hold).
    fn kv_growth_bytes(&self) -> u64 {
        let c = &self.model.config;
        let (kt, vt) = (self.seq.kv.k_type, self.seq.kv.v_type);
        KvCache::bytes(c, self.seq.kv.capacity(), kt, vt) + self.parked_kv_bytes()
            - KvCache::bytes(c, self.kv_first_page(), kt, vt)
    }

    /// How a batch of several sequences runs here, computing what each computes alone:
    /// - [`SlotsMode::Batch`]: every run in one pass: dense kernels on rows (any selector's masked
    ///   inputs on GGUF rows; a dense selection on a pack);
    /// - [`SlotsMode::RowByRow`]: where a lone token runs on its active columns (a sparse
    ///   selection on a pack; anything on the tiered store): the decoding sequences' tokens go
    ///   through the layers together (one attention per sequence, one output head for all), each
    ///   token's products on its own columns in turn, so the union of their columns is read
    ///   about once per layer (from memory; under a budget, from the disk into the cache);
    ///   prompt chunks run alone;
    /// - [`SlotsMode::OneByOne`]: one sequence after another (a GPU tier, a tracer, sparse
    ///   prefill, a selector with per-sequence state).
    ///
    /// `SIFT_SLOTS_ONE_BY_ONE=1` forces the last (for A/B benchmarks).
    pub fn slots_mode(&self) -> SlotsMode {
        if std::env::var_os("SIFT_SLOTS_ONE_BY_ONE").is_some_and(|v| v == "1") {
            SlotsMode::OneByOne
        } else if self.slots_batch_blocker().is_none() {
            SlotsMode::Batch
        } else if self.gpu().is_none()
            && self.gpu.hybrid.is_none()
            && !self.watched()
            && self.prefill.ratio == 0.0
            && !self.selector().keeps_sequence_state()
        {
            SlotsMode::RowByRow
        } else {
            SlotsMode::OneByOne
        }
    }

    /// Whether every run of a batch of sequences shares one pass ([`SlotsMode::Batch`]).
    pub fn batches_slots(&self) -> bool {
        self.slots_batch_blocker().is_none()
    }

    /// Why [`Engine::batches_slots`] is false, in a few words.
    pub fn slots_batch_blocker(&self) -> Option<&'static str> {
        Some(if self.source.lone_token_differs(!self.selector().is_dense()) {
            match self.memory() {
                Some(_) => "the tiered store reads a lone token's weights its own way",
                None => "a pack computes a lone token's sparse products on its columns",
            }
        } else if self.gpu().is_some() || self.gpu.hybrid.is_some() {
            "a GPU tier"
        } else if self.watched() {
            "a tracer"
        } else if self.prefill.ratio > 0.0 {
            "sparse prefill"
        } else if self.selector().keeps_sequence_state() {
            "a selector with per-sequence state"
        } else {
            return None;
        })
    }

    /// [`Engine::decode`] with each run's phase from its length.
    pub fn eval_slots(&mut self, runs: &[SlotRun<'_>]) -> Result<&[f32], EvalError> {
        self.decode(runs, None)
    }

    /// The one forward entry (llama.cpp's `llama_decode`): evaluates a batch of runs — the next
    /// tokens of one or several sequences (at most one run per slot), a prompt, a prompt chunk
    /// that knows where its prompt ends, a decoded token, and the next tokens of the other
    /// slots beside them — and returns the logits each run asked for, in run order (a run's last
    /// token's row, or every token's). A run of more than one token counts as prompt, of one as
    /// generation, unless `phase` says (perplexity scores tokens as generation in batches). Each
    /// run gets exactly what it gets alone ([`Engine::slots_mode`] says how they share the
    /// work). On an error the runs not yet evaluated keep nothing of theirs in their caches.
    pub fn decode(&mut self, runs: &[SlotRun<'_>], phase: Option<Phase>) -> Result<&[f32], EvalError> {
        // A run that knows where its prompt ends is part of a prompt, whatever its length.
        let phase_of = |r: &SlotRun<'_>| {
            phase.unwrap_or(if r.tokens.len() > 1 || r.prompt_end.is_some() { Phase::Prompt } else { Phase::Generate })
        };
        if let [r] = runs {
            assert!(r.slot < self.n_slots(), "slot {} of {}", r.slot, self.n_slots());
            self.use_slot(r.slot);
            return self.run_one(r.tokens, r.logits, phase_of(r), r.prompt_end);
        }
        let n_vocab = self.model.config.n_vocab;
        for (i, r) in runs.iter().enumerate() {
            assert!(r.slot < self.n_slots(), "slot {} of {}", r.slot, self.n_slots());
            assert!(runs[..i].iter().all(|o| o.slot != r.slot), "slot {} twice in one batch", r.slot);
            self.check_tokens(r.tokens)?;
            let past = self.slot_n_past(r.slot);
            if past + r.tokens.len() > self.seq.n_ctx {
                return Err(EvalError::ContextFull {
                    n_past: past,
                    n_new: r.tokens.len(),
                    n_ctx: self.seq.n_ctx,
                    n_ctx_train: self.model.config.n_ctx_train,
                });
            }
        }
        let mode = if runs.len() > 1 && phase.is_none() { self.slots_mode() } else { SlotsMode::OneByOne };
        // Runs that want every token's logits run apart (the batch's head computes one row per run).
        let shared = |i: &usize| runs[*i].logits != Logits::All;
        let together: Vec<usize> = match mode {
            SlotsMode::Batch => (0..runs.len()).filter(shared).collect(),
            SlotsMode::RowByRow => (0..runs.len()).filter(|&i| runs[i].tokens.len() == 1).filter(shared).collect(),
            SlotsMode::OneByOne => Vec::new(),
        };
        let n_together: usize = together.iter().map(|&i| runs[i].tokens.len()).sum();
        let together = if together.len() > 1 && n_together <= self.n_batch() { together } else { Vec::new() };
        let mut rows: Vec<Option<Vec<f32>>> = vec![None; runs.len()];
        // The runs apart, each exactly as alone.
        for (i, r) in runs.iter().enumerate().filter(|(i, _)| !together.contains(i)) {
            self.use_slot(r.slot);
            let logits = self.run_one(r.tokens, r.logits, phase_of(r), r.prompt_end)?;
            if r.logits != Logits::None {
                rows[i] = Some(logits.to_vec());
            }
        }
        if !together.is_empty() {
            let batch: Vec<SlotRun<'_>> = together.iter().map(|&i| runs[i]).collect();
            self.apply_budget_request();
            for r in &batch {
                self.use_slot(r.slot);
                let end = self.seq.n_past + r.tokens.len();
                self.reserve_kv(end)?;
            }
            let tokens: Vec<u32> = batch.iter().flat_map(|r| r.tokens.iter().copied()).collect();
            let mut row0 = 0;
            self.seq.runs.clear();
            for r in &batch {
                self.seq.runs.push(RunRows { slot: r.slot, row0, len: r.tokens.len() });
                row0 += r.tokens.len();
            }
            let phase = if batch.iter().all(|r| r.tokens.len() == 1) { Phase::Generate } else { Phase::Prompt };
            let row_mode = if mode == SlotsMode::RowByRow { RowMode::OneAtATime } else { RowMode::Together };
            let result = self.forward_runs(&tokens, &batch, phase, &self.exec_plan(FfnStep::Sites, row_mode));
            self.seq.runs.clear();
            result?;
            let mut got = self.seq.logits.chunks(n_vocab);
            for &i in together.iter().filter(|&&i| runs[i].logits == Logits::Last) {
                rows[i] = Some(got.next().expect("a row per run that asked").to_vec());
            }
        }
        self.seq.logits.clear();
        for row in rows.into_iter().flatten() {
            self.seq.logits.extend_from_slice(&row);
        }
        Ok(&self.seq.logits)
    }

    /// One site of a batch a token at a time ([`SlotsMode::RowByRow`]): each row moved to row 0,
    /// computed as a lone token (its own selection and columns), moved back.
    pub(crate) fn site_row_by_row(&mut self, l: usize, n: usize, site: Site, way: LayerPlan) -> Result<(), EvalError> {
        self.each_row_alone(n, site, |e, t| {
            let Engine { model, s, .. } = e;
            s.swap_site_rows(&model.config, site, 0, t);
            let r = e.site(l, 1, site, way);
            let Engine { model, s, .. } = e;
            s.swap_site_rows(&model.config, site, 0, t);
            r
        })
    }

    /// Runs `row(engine, t)` for each of `n` rows as a lone token, first to last, and records the union of
    /// the units the rows chose at `site` ([`SparsityStats::batch_union`], the `-np` slots'
    /// statistics). Stops at the first error.
    pub(crate) fn each_row_alone(
        &mut self,
        n: usize,
        site: Site,
        mut row: impl FnMut(&mut Engine, usize) -> Result<(), EvalError>,
    ) -> Result<(), EvalError> {
        let width = site.width(&self.model.config);
        let mut union = std::mem::take(&mut self.seq.union);
        union.clear();
        union.resize(width, false);
        let i = site.index();
        let active0 = self.sparsity.stats.active[i];
        let mut r = Ok(());
        for t in 0..n {
            let before = self.sparsity.stats.active[i];
            r = row(self, t);
            // The units this token used: all, or its selection (left in `s.active`).
            if self.sparsity.stats.active[i] - before >= width as u64 {
                union.fill(true);
            } else {
                for &j in &self.s.active {
                    union[j as usize] = true;
                }
            }
            if r.is_err() {
                break;
            }
        }
        // Sites where every token was dense tell nothing about the union.
        let used = self.sparsity.stats.active[i] - active0;
        if used < (n * width) as u64 {
            let b = &mut self.sparsity.stats.batch_union[n.clamp(2, 9) - 2];
            b.site_visits += 1;
            b.union_units += union.iter().filter(|&&u| u).count() as u64;
            b.token_units += used;
        }
        self.seq.union = union;
        r
    }

    /// The batch of [`Engine::eval_slots`] through every layer and the output head.
    fn forward_runs(
        &mut self,
        tokens: &[u32],
        runs: &[SlotRun<'_>],
        phase: Phase,
        plan: &ExecPlan,
    ) -> Result<(), EvalError> {
        let n = tokens.len();
        let e = self.model.config.n_embd;
        self.begin_slots_batch(phase, n);
        let r = (|| {
            self.embed(tokens)?;
            for (l, &way) in plan.layers.iter().enumerate() {
                self.layer(l, n, way)?;
                if !crate::forward::all_finite(&self.s.x[..n * e]) {
                    return Err(EvalError::NonFinite {
                        where_: format!("layer {l}"),
                        first: 0,
                        end: n,
                        lora: self.lora.is_some(),
                    });
                }
            }
            // The rows whose logits are wanted (the last of their runs) moved to the end, in
            // order, for the head; from the last down, so none is overwritten before it moves.
            let wanted: Vec<usize> = (self.seq.runs.iter().zip(runs))
                .filter(|(_, r)| r.logits == Logits::Last)
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
                    return Err(EvalError::NonFinite {
                        where_: "the output head".into(),
                        first: 0,
                        end: n,
                        lora: self.lora.is_some(),
                    });
                }
                let mut out = std::mem::take(&mut self.seq.logits);
                out.clear();
                out.extend_from_slice(self.head_logits(k));
                self.seq.logits = out;
            }
            Ok(())
        })();
        self.end_slots_batch();
        r?;
        for rr in self.seq.runs.clone() {
            self.use_slot(rr.slot);
            self.seq.n_past += rr.len;
        }
        Ok(())
    }
}
