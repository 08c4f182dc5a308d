//! Unit orders for the column file, from an activation trace (KAIROX §5's co-activation
//! grouping): where each site's units lie in the file decides how many reads a token's misses
//! take. Two orders:
//!
//! - [`coactivation_orders`]: units that are active on the same tokens lie side by side. Each
//!   unit's activations over the traced tokens form a bitset; a chain starts at the most active
//!   unit and repeatedly appends the unplaced unit most similar to the last one placed (Jaccard
//!   similarity of the bitsets). Units a token needs then tend to be neighbours, so its misses
//!   fall into fewer, longer runs, which the store reads as few large reads.
//! - [`frequency_orders`]: units sorted hottest first, the simplest baseline (measured worse than
//!   the model's own order: the cached hot units and the missed ones interleave at its boundary).
//! - `metis_orders` (cargo feature `metis`): the co-activation graph (each unit linked to the
//!   units most often active with it, Jaccard weights) partitioned into groups of a few units by
//!   METIS's multilevel k-way partitioner, groups laid out hottest first. Measured against the
//!   chain in docs/benchmarks.md (issue 16, step 4); built only with the feature, because it did
//!   not read less than the model's order either.

use crate::trace::{Event, LayerRecord, Trace};
use sift_store::UnitOrders;

/// `sift pack --unit-order`'s orders by `grouping` (`coactivation`, `metis` with groups of
/// `group_units`, or `frequency`), saying which on stderr; `None` for `metis` in a build without
/// the feature.
pub fn orders_by(trace: &Trace, grouping: &str, threads: usize, group_units: usize) -> Option<UnitOrders> {
    match grouping {
        "frequency" => Some(frequency_orders(trace)),
        #[cfg(feature = "metis")]
        "metis" => {
            eprintln!(
                "partitioning units into groups of {group_units} with METIS over {} traced tokens",
                trace.n_tokens()
            );
            Some(metis_orders(trace, threads, group_units))
        }
        #[cfg(not(feature = "metis"))]
        "metis" => {
            let _ = group_units;
            None
        }
        _ => {
            eprintln!("grouping units by co-activation over {} traced tokens", trace.n_tokens());
            Some(coactivation_orders(trace, threads))
        }
    }
}

/// Per layer and site, units in a co-activation chain (see the module docs), computed on
/// `threads` threads; a site the trace never selected from (always dense) gets none.
pub fn coactivation_orders(trace: &Trace, threads: usize) -> UnitOrders {
    per_site_orders(trace, threads, &chain)
}

/// Per layer and site, a job for every site `per_site` orders (from the site's activation
/// bitsets), run on `threads` threads; sites the trace never selected from get none, and orders
/// equal to the model's are left out.
fn per_site_orders(trace: &Trace, threads: usize, per_site: &(dyn Fn(&UnitBits) -> Vec<u32> + Sync)) -> UnitOrders {
    let h = &trace.header;
    let tokens: Vec<&Vec<LayerRecord>> = trace
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Token { layers, .. } => Some(layers),
            _ => None,
        })
        .collect();
    let jobs: Vec<(usize, usize)> = (0..h.n_layer).flat_map(|l| (0..4).map(move |si| (l, si))).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(vec![None; jobs.len()]);
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| loop {
                let j = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&(l, si)) = jobs.get(j) else { break };
                let order = site_bits(&tokens, l, si, h.dims[si]).map(|b| per_site(&b)).filter(|o| !is_identity(o));
                results.lock().unwrap_or_else(|e| e.into_inner())[j] = order;
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(|e| e.into_inner()).into_iter();
    (0..h.n_layer).map(|_| std::array::from_fn(|_| results.next().flatten())).collect()
}

/// Each unit's activations over the tokens, as bitsets of `words` words; `None` when the site
/// was dense on every token.
struct UnitBits {
    bits: Vec<u64>,
    words: usize,
    n: usize,
}

impl UnitBits {
    fn of(&self, u: usize) -> &[u64] {
        &self.bits[u * self.words..(u + 1) * self.words]
    }
}

fn site_bits(tokens: &[&Vec<LayerRecord>], l: usize, si: usize, n: usize) -> Option<UnitBits> {
    let words = tokens.len().div_ceil(64).max(1);
    let mut bits = vec![0u64; n * words];
    let mut sparse = false;
    for (t, layers) in tokens.iter().enumerate() {
        let Some(rec) = layers.get(l) else { continue };
        let (w, b) = (t / 64, 1u64 << (t % 64));
        match &rec.sites[si].active {
            Some(units) => {
                sparse = true;
                for &u in units.iter().filter(|&&u| (u as usize) < n) {
                    bits[u as usize * words + w] |= b;
                }
            }
            None => (0..n).for_each(|u| bits[u * words + w] |= b),
        }
    }
    sparse.then_some(UnitBits { bits, words, n })
}

/// The greedy co-activation chain over `b`'s units.
fn chain(b: &UnitBits) -> Vec<u32> {
    let n = b.n;
    let count: Vec<u32> = (0..n).map(|u| b.of(u).iter().map(|w| w.count_ones()).sum()).collect();
    let mut placed = vec![false; n];
    let mut order = Vec::with_capacity(n);
    // Start at the most active unit (ties: the lowest).
    let mut cur = (0..n).max_by(|&a, &c| count[a].cmp(&count[c]).then(c.cmp(&a))).unwrap_or(0);
    while order.len() < n {
        placed[cur] = true;
        order.push(cur as u32);
        // The unplaced unit most similar to `cur`: Jaccard, ties to the more active, then lower.
        let mut best: Option<(f64, u32, usize)> = None;
        for v in 0..n {
            if placed[v] {
                continue;
            }
            let j = jaccard(b, &count, cur, v);
            let better = match best {
                None => true,
                Some((bj, bc, _)) => j > bj || (j == bj && count[v] > bc),
            };
            if better {
                best = Some((j, count[v], v));
            }
        }
        match best {
            Some((_, _, v)) => cur = v,
            None => break,
        }
    }
    order
}

/// Jaccard similarity of units `a` and `b`'s activations (0 when neither was ever active).
fn jaccard(b: &UnitBits, count: &[u32], a: usize, c: usize) -> f64 {
    let inter: u32 = b.of(a).iter().zip(b.of(c)).map(|(x, y)| (x & y).count_ones()).sum();
    let union = count[a] + count[c] - inter;
    if union == 0 {
        0.0
    } else {
        f64::from(inter) / f64::from(union)
    }
}

/// Per layer and site, units in METIS groups of about `group_units` (see the module docs).
#[cfg(feature = "metis")]
pub fn metis_orders(trace: &Trace, threads: usize, group_units: usize) -> UnitOrders {
    per_site_orders(trace, threads, &|b| metis_groups(b, group_units.max(1)))
}

/// Neighbours each unit keeps in the co-activation graph METIS partitions.
#[cfg(feature = "metis")]
const GRAPH_NEIGHBOURS: usize = 16;

/// The co-activation graph of `b`'s units partitioned by METIS into groups of about
/// `group_units`, groups hottest first (by their units' mean activations), units hottest first
/// within a group.
#[cfg(feature = "metis")]
fn metis_groups(b: &UnitBits, group_units: usize) -> Vec<u32> {
    let n = b.n;
    let count: Vec<u32> = (0..n).map(|u| b.of(u).iter().map(|w| w.count_ones()).sum()).collect();
    let hottest_first = |units: &mut Vec<u32>| {
        units.sort_by(|&a, &c| count[c as usize].cmp(&count[a as usize]).then(a.cmp(&c)));
    };
    let nparts = n.div_ceil(group_units);
    let mut all: Vec<u32> = (0..n as u32).collect();
    if nparts < 2 {
        hottest_first(&mut all);
        return all;
    }
    // Each unit's strongest neighbours, the edges made symmetric (weight: the larger side's).
    let mut edges: Vec<std::collections::BTreeMap<u32, i32>> = vec![Default::default(); n];
    for a in 0..n {
        let mut best: Vec<(f64, usize)> =
            (0..n).filter(|&c| c != a).map(|c| (jaccard(b, &count, a, c), c)).filter(|&(j, _)| j > 0.0).collect();
        best.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
        for &(j, c) in best.iter().take(GRAPH_NEIGHBOURS) {
            let w = ((j * 1000.0).round() as i32).max(1);
            for (x, y) in [(a, c), (c, a)] {
                let e = edges[x].entry(y as u32).or_insert(0);
                *e = (*e).max(w);
            }
        }
    }
    let mut xadj: Vec<metis::Idx> = Vec::with_capacity(n + 1);
    let (mut adjncy, mut adjwgt) = (Vec::new(), Vec::new());
    xadj.push(0);
    for e in &edges {
        for (&v, &w) in e {
            adjncy.push(v as metis::Idx);
            adjwgt.push(w as metis::Idx);
        }
        xadj.push(adjncy.len() as metis::Idx);
    }
    let mut part = vec![0 as metis::Idx; n];
    let ok = !adjncy.is_empty()
        && metis::Graph::new(1, nparts as metis::Idx, &xadj, &adjncy)
            .is_ok_and(|g| g.set_adjwgt(&adjwgt).part_kway(&mut part).is_ok());
    if !ok {
        hottest_first(&mut all);
        return all;
    }
    let mut groups: Vec<Vec<u32>> = vec![Vec::new(); nparts];
    for (u, &p) in part.iter().enumerate() {
        groups[(p as usize).min(nparts - 1)].push(u as u32);
    }
    groups.retain(|g| !g.is_empty());
    groups.iter_mut().for_each(hottest_first);
    let heat = |g: &Vec<u32>| g.iter().map(|&u| f64::from(count[u as usize])).sum::<f64>() / g.len() as f64;
    groups.sort_by(|x, y| heat(y).total_cmp(&heat(x)).then(x[0].cmp(&y[0])));
    groups.concat()
}

fn is_identity(order: &[u32]) -> bool {
    order.iter().enumerate().all(|(p, &u)| p as u32 == u)
}

/// Per layer and site, the units ordered hottest first by their activation counts in `trace`
/// (ties in the model's order); a site whose order would be the model's own gets none.
pub fn frequency_orders(trace: &Trace) -> UnitOrders {
    let h = &trace.header;
    let mut counts: Vec<[Vec<u32>; 4]> = (0..h.n_layer).map(|_| h.dims.map(|d| vec![0u32; d])).collect();
    for ev in &trace.events {
        let Event::Token { layers, .. } = ev else { continue };
        for (l, rec) in layers.iter().enumerate().take(h.n_layer) {
            for (si, site) in rec.sites.iter().enumerate() {
                let c = &mut counts[l][si];
                match &site.active {
                    Some(units) => {
                        for &u in units {
                            if let Some(n) = c.get_mut(u as usize) {
                                *n += 1;
                            }
                        }
                    }
                    None => c.iter_mut().for_each(|n| *n += 1),
                }
            }
        }
    }
    counts
        .into_iter()
        .map(|sites| {
            sites.map(|c| {
                let mut order: Vec<u32> = (0..c.len() as u32).collect();
                order.sort_by(|&a, &b| c[b as usize].cmp(&c[a as usize]).then(a.cmp(&b)));
                (!is_identity(&order)).then_some(order)
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{LayerRecord, SiteRecord, TraceHeader};

    fn token(sites: [Option<Vec<u32>>; 4]) -> Event {
        let sites = sites.map(|active| SiteRecord { input: Vec::new(), active });
        Event::Token { pos: 0, layers: vec![LayerRecord { residual: Vec::new(), sites }] }
    }

    #[test]
    fn units_are_ordered_hottest_first_and_the_models_order_is_left_out() {
        let header = TraceHeader {
            model: "m".into(),
            n_layer: 1,
            n_embd: 4,
            dims: [4, 4, 4, 6],
            selector: "topk".into(),
            n_ctx: 16,
            n_batch: 1,
            runtime_bytes: 0,
            measured_tok_s: 0.0,
        };
        let events = vec![
            Event::Prompt(3),
            token([Some(vec![2, 3]), None, Some(vec![0, 1]), Some(vec![5])]),
            token([Some(vec![3]), None, Some(vec![0]), Some(vec![1, 5])]),
            Event::Reset,
            token([Some(vec![3]), None, Some(vec![0, 1]), Some(vec![1, 4, 5])]),
        ];
        let orders = frequency_orders(&Trace { header, events });
        assert_eq!(orders.len(), 1);
        // Site 0: 3 (3 tokens), 2 (1), then 0 and 1 (none) in the model's order.
        assert_eq!(orders[0][0], Some(vec![3, 2, 0, 1]));
        // Dense and already-ordered sites keep the model's order (nothing stored).
        assert_eq!(orders[0][1], None);
        assert_eq!(orders[0][2], None);
        assert_eq!(orders[0][3], Some(vec![5, 1, 4, 0, 2, 3]));
    }

    #[test]
    fn units_active_together_end_up_side_by_side() {
        let header = TraceHeader {
            model: "m".into(),
            n_layer: 1,
            n_embd: 8,
            dims: [8, 8, 8, 8],
            selector: "topk".into(),
            n_ctx: 16,
            n_batch: 1,
            runtime_bytes: 0,
            measured_tok_s: 0.0,
        };
        // Two groups interleaved in the model's order: {0, 2, 4, 6} on even tokens, {1, 3, 5, 7}
        // on odd ones; unit 0 also on every third token (the most active, the chain's start).
        let events: Vec<Event> = (0..12)
            .map(|t| {
                let mut a: Vec<u32> = if t % 2 == 0 { vec![0, 2, 4, 6] } else { vec![1, 3, 5, 7] };
                if t % 3 == 0 && !a.contains(&0) {
                    a.insert(0, 0);
                }
                token([Some(a), None, None, None])
            })
            .collect();
        let orders = coactivation_orders(&Trace { header, events }, 2);
        let o = orders[0][0].clone().expect("a new order");
        assert_eq!(o[0], 0);
        let group = |u: u32| u % 2;
        // One switch from the even group to the odd one.
        let switches = o.windows(2).filter(|w| group(w[0]) != group(w[1])).count();
        assert_eq!(switches, 1, "{o:?}");
        assert_eq!(orders[0][1], None);
    }

    #[cfg(feature = "metis")]
    #[test]
    fn metis_groups_units_active_together() {
        // Four groups of four interleaved in the model's order: unit u is active on the tokens
        // t with t % 4 == u % 4, and units 0-3 once more (the hottest group).
        let n = 16u32;
        let events: Vec<Event> = (0..40)
            .map(|t| {
                let mut a: Vec<u32> = (0..n).filter(|u| u % 4 == t % 4).collect();
                if t == 1 {
                    a.extend([0, 2, 3]);
                    a.sort_unstable();
                }
                token([Some(a), None, None, None])
            })
            .collect();
        let header = TraceHeader {
            model: "m".into(),
            n_layer: 1,
            n_embd: 16,
            dims: [16, 16, 16, 16],
            selector: "topk".into(),
            n_ctx: 64,
            n_batch: 1,
            runtime_bytes: 0,
            measured_tok_s: 0.0,
        };
        let orders = metis_orders(&Trace { header, events }, 2, 4);
        let o = orders[0][0].clone().expect("a new order");
        // Each run of four holds one residue class.
        for g in o.chunks(4) {
            assert!(g.iter().all(|u| u % 4 == g[0] % 4), "{o:?}");
        }
        assert_eq!(o.len(), 16);
        assert_eq!(orders[0][1], None);
    }
}
