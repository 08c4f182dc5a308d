//! Cross-layer preloading (ActiveFlow §3–4; KAIROX's adjacent-layer pipeline is N = 1): at the
//! first layer of each group of N layers, the `CrossLayerPrefetcher` predicts the active input
//! channels of the next group's q/k/v/gate/up from the residual stream (|x_c · norm_c| of each
//! target layer, keeping as many channels as that layer used on the previous token, plus a
//! margin) and hands the reads of those not cached to the loader thread, which runs them while
//! the current group computes. With a pack made with groups of N (`sift pack --group N`), one
//! read brings a channel for all N layers (the interleaved record). The tiered store asks it for
//! a ready preload when a site's columns are fetched (`CrossLayerPrefetcher::ready`, then
//! `offset` and `buffer` per missing column).

use crate::io::{AlignedBuf, LoadDone, ReadReq, TierIo};
use crate::tiered::{account, plan_within, read_shape, Kind, OpCache, TierStats};
use sift_model::layout::{OpKind, PackIndex, GROUP_OPS};
use sift_model::Model;
use std::ops::Range;

/// A preload in flight or done: the group it covers and where each part landed in its buffer.
struct Preload {
    tag: u64,
    layers: Range<usize>,
    /// Per (layer - first, op in GROUP_OPS order): buffer offset of each channel, or u32::MAX.
    pos: Vec<Vec<u32>>,
    done: Option<LoadDone>,
    /// Parts read (not cached when requested) and parts used so far.
    parts: u64,
}

/// A preload that [`CrossLayerPrefetcher::ready`] waited for (an index into its preloads, valid
/// until the next `begin_layer`).
#[derive(Clone, Copy)]
pub(crate) struct ReadyPreload(usize);

/// The cross-layer prefetcher of a tiered store (see the module docs).
pub(crate) struct CrossLayerPrefetcher {
    /// Layers per preload group (0: off).
    group: usize,
    margin: f32,
    /// Whether preloads read the pack's interleaved groups (their size equals `group`).
    interleaved: bool,
    /// Norm weights of each layer's attention and FFN input, for predicting channels.
    norms: Vec<(Vec<f32>, Vec<f32>)>,
    /// Channels each (layer, in-site) used on the last token (0 = unknown: predict nothing).
    last_active: Vec<[usize; 2]>,
    preloads: Vec<Preload>,
    /// Preload buffers not in use.
    spare: Vec<AlignedBuf>,
    next_tag: u64,
}

impl CrossLayerPrefetcher {
    /// Groups of `group` layers (0: off), with two buffers of `buf_bytes`.
    pub(crate) fn new(model: &Model, group: usize, margin: f32, interleaved: bool, buf_bytes: usize) -> Self {
        CrossLayerPrefetcher {
            group,
            margin,
            interleaved,
            norms: model.layers.iter().map(|lw| (lw.attn_norm.clone(), lw.ffn_norm.clone())).collect(),
            last_active: vec![[0; 2]; model.config.n_layer],
            preloads: Vec::new(),
            spare: if group > 0 { vec![AlignedBuf::new(buf_bytes), AlignedBuf::new(buf_bytes)] } else { Vec::new() },
            next_tag: 1,
        }
    }

    pub(crate) fn group(&self) -> usize {
        self.group
    }

    pub(crate) fn interleaved(&self) -> bool {
        self.interleaved
    }

    /// A decoded token used `n` channels at `layer`'s input site `in_site` (0: attention, 1: FFN).
    pub(crate) fn note_active(&mut self, layer: usize, in_site: usize, n: usize) {
        self.last_active[layer][in_site] = n;
    }

    /// A new conversation: forget the last token's counts and drop the preloads.
    pub(crate) fn reset(&mut self, io: &mut dyn TierIo) {
        self.last_active.iter_mut().for_each(|a| *a = [0; 2]);
        self.drop_all(io);
    }

    /// Called at the start of layer `l` of a decoded token with the residual entering it: at the
    /// first layer of a preload group, predicts and starts reading the next group's columns
    /// (those not in `ops`' caches).
    pub(crate) fn begin_layer(
        &mut self,
        l: usize,
        x: &[f32],
        io: &mut dyn TierIo,
        ops: &[Vec<OpCache>],
        index: &PackIndex,
    ) {
        // Preloads of layers already passed (or of the previous token) are finished with.
        let old: Vec<Preload>;
        (old, self.preloads) =
            std::mem::take(&mut self.preloads).into_iter().partition(|p| l == 0 || p.layers.end <= l);
        for mut p in old {
            let done = match p.done.take() {
                Some(d) => d,
                None => io.wait(p.tag).0,
            };
            self.spare.push(done.buf);
        }
        let n = self.group;
        if n == 0 || !l.is_multiple_of(n) {
            return;
        }
        let target = l + n..(l + 2 * n).min(ops.len());
        if target.is_empty() || self.preloads.iter().any(|p| p.layers == target) {
            return;
        }
        self.start(target, x, io, ops, index);
    }

    /// Channels to preload for (layer, in-site), by |x_c · norm_c|.
    fn predict(&self, layer: usize, site: usize, x: &[f32], out: &mut Vec<u32>) {
        out.clear();
        let last = self.last_active[layer][site];
        if last == 0 {
            return;
        }
        let norm = if site == 0 { &self.norms[layer].0 } else { &self.norms[layer].1 };
        let k = ((last as f32 * (1.0 + self.margin)).ceil() as usize).min(x.len());
        let mut scored: Vec<(f32, u32)> =
            x.iter().zip(norm).enumerate().map(|(c, (v, w))| ((v * w).abs(), c as u32)).collect();
        if k < scored.len() {
            scored.select_nth_unstable_by(k, |a, b| b.0.total_cmp(&a.0));
            scored.truncate(k);
        }
        out.extend(scored.iter().map(|s| s.1));
        out.sort_unstable();
    }

    fn start(&mut self, layers: Range<usize>, x: &[f32], io: &mut dyn TierIo, ops: &[Vec<OpCache>], index: &PackIndex) {
        let Some(buf) = self.spare.pop() else {
            return;
        };
        let nl = layers.len();
        let first = layers.start;
        let mut pos = vec![vec![u32::MAX; 0]; nl * GROUP_OPS.len()];
        let mut pred = Vec::new();
        // Wanted parts per (layer, op), not cached.
        let mut want: Vec<Vec<u32>> = vec![Vec::new(); nl * GROUP_OPS.len()];
        for (li, l) in layers.clone().enumerate() {
            for site in 0..2 {
                self.predict(l, site, x, &mut pred);
                let site_ops: &[usize] = if site == 0 { &[0, 1, 2] } else { &[3, 4] };
                for &oi in site_ops {
                    let oc = &ops[l][GROUP_OPS[oi] as usize];
                    want[li * GROUP_OPS.len() + oi] = pred.iter().copied().filter(|&u| !oc.cache.contains(u)).collect();
                }
            }
        }
        let mut ranges: Vec<(u64, usize)> = Vec::new();
        let mut owners: Vec<(usize, u32, usize)> = Vec::new(); // (part, unit, offset within range)
        let mut parts = 0u64;
        let group = if self.interleaved { index.group_of(first).filter(|g| g.layers() == layers) } else { None };
        if let Some(g) = group {
            // A channel's record is read when the parts it would bring in (predicted and not
            // cached) make up at least half of its bytes; the rest are left to on-demand reads.
            let n_in = index.layers[0].ops[0].n_in;
            let mut wanted_bytes = vec![0usize; n_in];
            let mut wanted_by: Vec<Vec<u8>> = vec![Vec::new(); n_in];
            for (pi, units) in want.iter().enumerate() {
                for &u in units {
                    wanted_bytes[u as usize] += g.parts[pi].col_bytes;
                    wanted_by[u as usize].push(pi as u8);
                }
            }
            let mut bytes = 0usize;
            for ch in 0..n_in {
                if 2 * wanted_bytes[ch] < g.unit_bytes {
                    continue;
                }
                if bytes + g.unit_bytes > buf.len() {
                    break;
                }
                bytes += g.unit_bytes;
                let r = ranges.len();
                ranges.push((g.offset + ch as u64 * g.unit_bytes as u64, g.unit_bytes));
                for &pi in &wanted_by[ch] {
                    owners.push((pi as usize, ch as u32, r));
                }
            }
            // Offsets of each part within its record.
            let part_off: Vec<usize> = g.parts.iter().map(|p| p.offset).collect();
            let (reqs, starts) = match plan_within(&mut ranges, buf.len(), read_shape(io)) {
                Some(p) => p,
                None => {
                    self.spare.push(buf);
                    return;
                }
            };
            owners.retain(|o| o.2 < ranges.len());
            for p in pos.iter_mut() {
                *p = vec![u32::MAX; index.layers[0].ops[0].n_in];
            }
            for &(pi, ch, r) in &owners {
                pos[pi][ch as usize] = (starts[r] + part_off[pi]) as u32;
                parts += 1;
            }
            self.submit(io, layers, pos, buf, reqs, parts);
        } else {
            let mut layout: Vec<(usize, u32)> = Vec::new(); // (part, unit) per range
            let mut bytes = 0usize;
            'outer: for (pi, units) in want.iter().enumerate() {
                let (l, op) = (first + pi / GROUP_OPS.len(), GROUP_OPS[pi % GROUP_OPS.len()]);
                let oc = &ops[l][op as usize];
                for &u in units {
                    if bytes + oc.col_bytes > buf.len() {
                        break 'outer;
                    }
                    bytes += oc.col_bytes;
                    ranges.push((oc.column_offset(u), oc.col_bytes));
                    layout.push((pi, u));
                }
            }
            // plan_reads wants ranges sorted by offset.
            let mut order: Vec<usize> = (0..ranges.len()).collect();
            order.sort_by_key(|&i| ranges[i].0);
            let mut sorted: Vec<(u64, usize)> = order.iter().map(|&i| ranges[i]).collect();
            let (reqs, starts) = match plan_within(&mut sorted, buf.len(), read_shape(io)) {
                Some(p) => p,
                None => {
                    self.spare.push(buf);
                    return;
                }
            };
            order.truncate(sorted.len());
            for p in pos.iter_mut() {
                *p = vec![u32::MAX; index.layers[0].ops[0].n_in];
            }
            for (k, &i) in order.iter().enumerate() {
                let (pi, u) = layout[i];
                pos[pi][u as usize] = starts[k] as u32;
                parts += 1;
            }
            self.submit(io, layers, pos, buf, reqs, parts);
        }
    }

    fn submit(
        &mut self,
        io: &mut dyn TierIo,
        layers: Range<usize>,
        pos: Vec<Vec<u32>>,
        buf: AlignedBuf,
        reqs: Vec<ReadReq>,
        parts: u64,
    ) {
        let tag = self.next_tag;
        self.next_tag += 1;
        io.submit(tag, buf, reqs);
        self.preloads.push(Preload { tag, layers, pos, done: None, parts });
    }

    /// Drops every preload (waiting for reads in flight) and keeps their buffers.
    pub(crate) fn drop_all(&mut self, io: &mut dyn TierIo) {
        for mut p in std::mem::take(&mut self.preloads) {
            let done = match p.done.take() {
                Some(d) => d,
                None => io.wait(p.tag).0,
            };
            self.spare.push(done.buf);
        }
    }

    /// The preload covering `layer`, waited for (the wait is accounted in `stats`).
    pub(crate) fn ready(
        &mut self,
        layer: usize,
        io: &mut dyn TierIo,
        stats: &mut TierStats,
    ) -> Result<Option<ReadyPreload>, std::io::Error> {
        let Some(i) = self.preloads.iter().position(|p| p.layers.contains(&layer)) else {
            return Ok(None);
        };
        if self.preloads[i].done.is_none() {
            let (done, stall) = io.wait(self.preloads[i].tag);
            account(stats, &done, stall, Kind::Preload, 0);
            stats.preload_parts += self.preloads[i].parts;
            if let Err(e) = &done.result {
                let source = std::io::Error::new(e.kind(), e.to_string());
                self.spare.push(done.buf);
                self.preloads.remove(i);
                return Err(source);
            }
            self.preloads[i].done = Some(done);
        }
        Ok(Some(ReadyPreload(i)))
    }

    /// Whether a ready preload read `op`'s columns (preloads cover q, k, v, gate and up).
    pub(crate) fn covers(op: OpKind) -> bool {
        GROUP_OPS.contains(&op)
    }

    /// Where `unit` of (`layer`, `op`) sits in a ready preload's buffer, if it was preloaded.
    pub(crate) fn offset(&self, ready: ReadyPreload, layer: usize, op: OpKind, unit: u32) -> Option<usize> {
        let p = &self.preloads[ready.0];
        let oi = GROUP_OPS.iter().position(|&g| g == op)?;
        let at = *p.pos[(layer - p.layers.start) * GROUP_OPS.len() + oi].get(unit as usize)?;
        (at != u32::MAX).then_some(at as usize)
    }

    /// A ready preload's buffer.
    pub(crate) fn buffer(&self, ready: ReadyPreload) -> &[u8] {
        self.preloads[ready.0].done.as_ref().map_or(&[], |d| &d.buf[..])
    }
}
