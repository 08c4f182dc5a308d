//! Unit orders for the column file, from an activation trace: where co-activation grouping
//! (KAIROX §5, the read-path issue) will put its groups. This is its simplest form, the
//! baseline a partitioner must beat: per layer and site, units sorted by how many traced tokens
//! activated them, hottest first. Units that are active on most tokens then lie side by side, so
//! a token's misses among them fall into fewer, larger reads, and the cold tail lies apart.

use crate::trace::{Event, Trace};
use sift_store::UnitOrders;

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
                let identity = order.iter().enumerate().all(|(p, &u)| p as u32 == u);
                (!identity).then_some(order)
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
}
