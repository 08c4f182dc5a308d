//! The hybrid tier's part of the forward pass (KAIROX; the tier itself is [`crate::hybrid`]): a
//! lone token's FFN site shared between the GPU's unit groups and the CPU, and attaching the tier.

use super::*;
use crate::balancer::{NeuronBalancer, SitePlan};
use crate::hybrid::*;
use crate::source::{column_ops, site_col_ops};
use sift_gpu::ColumnPoolSpec;
use sift_gpu::{GpuColumns, GpuDevice, GpuError};
use sift_sparsity::Site;
use std::time::Instant;

impl Engine {
    /// Puts the hybrid tier on `dev`: column pools for the FFN sites of every layer, their host
    /// tables filled from the pack's columns (dequantized, Q8_0 again), and the balancer.
    pub fn attach_hybrid(&mut self, dev: &mut GpuDevice, o: &HybridOptions) -> Result<(), HybridError> {
        if column_ops(&self.model).is_none() {
            return Err(HybridError::NoPack);
        }
        let knee = match o.group_size {
            Some(_) => 0,
            None => knee_bytes(&dev.probe()?.h2d),
        };
        self.attach_hybrid_with(o, knee, &mut |specs, fill| dev.column_pools(specs, fill))
    }

    /// The hybrid tier with its pools in host memory ([`GpuColumns::emulated`]): the same
    /// balancing and splits, the GPU's share computed by the scalar reference (tests; automatic
    /// groups aim at 64 KiB transfers).
    pub fn attach_hybrid_emulated(&mut self, o: &HybridOptions) -> Result<(), HybridError> {
        self.attach_hybrid_with(o, 64 << 10, &mut |specs, fill| Ok(GpuColumns::emulated(specs, fill)))
    }

    #[allow(clippy::type_complexity)]
    fn attach_hybrid_with(
        &mut self,
        o: &HybridOptions,
        knee: u64,
        pools: &mut dyn FnMut(Vec<ColumnPoolSpec>, &mut dyn FnMut(usize, &mut [u8])) -> Result<GpuColumns, GpuError>,
    ) -> Result<(), HybridError> {
        let cols = column_ops(&self.model).ok_or(HybridError::NoPack)?;
        let PoolLayout { specs, positions } =
            pool_layout(&self.model, o.group_size, o.gpu_bytes, knee).ok_or(HybridError::NoPack)?;
        let slots: Vec<usize> = specs.iter().map(|s| s.slots).collect();
        let sizes: Vec<usize> = specs.iter().map(|s| s.group_size).collect();
        let file = self.model.pack_bytes();
        let pool = &self.pool;
        let shapes = specs.clone();
        let mut fill = |p: usize, t: &mut [u8]| {
            let ops = site_col_ops(&cols[p / HYBRID_SITES.len()], HYBRID_SITES[p % HYBRID_SITES.len()]);
            fill_table(pool, ops, file, &positions[p], shapes[p].unit_bytes(), t);
        };
        let gpu = pools(specs, &mut fill)?;
        let balancer = NeuronBalancer::new(o.policy, &positions, &sizes, &slots);
        self.gpu.hybrid = Some(HybridTier {
            gpu,
            balancer,
            opts: o.clone(),
            warm: false,
            products: 0,
            stalled: 0,
            token_ns: Vec::new(),
            lambda: Vec::new(),
            token_start: None,
            spent_ns: [0.0; SPENT],
            token_spent_ns: [0.0; SPENT],
            counts: [0; COUNTS],
            token_counts: [0; COUNTS],
            attention_on_gpu: false,
            head_on_gpu: false,
            y: Vec::new(),
            coef: Vec::new(),
        });
        Ok(())
    }

    pub fn hybrid(&self) -> Option<&HybridTier> {
        self.gpu.hybrid.as_ref()
    }

    pub fn hybrid_mut(&mut self) -> Option<&mut HybridTier> {
        self.gpu.hybrid.as_mut()
    }

    /// One decoded token's products of an FFN site the GPU shares (see the module docs): the
    /// active list is in `s.active`, the input in `s.h` (FFN input) or `s.g` (GLU).
    pub(crate) fn project_hybrid(&mut self, l: usize, site: Site) -> Result<(), EvalError> {
        let hy = self.gpu.hybrid.as_ref().expect("called with a hybrid tier");
        let Some(p) = hy.pool_of(l, site) else {
            // Not an FFN site: the CPU's.
            return self.project(l, 1, site, true);
        };
        let c = &self.model.config;
        let (e, ff) = (c.n_embd, c.n_ff);
        let hy = self.gpu.hybrid.as_mut().expect("called with a hybrid tier");
        if l == 0 && site == HYBRID_SITES[0] {
            hy.begin_token()?;
        }
        if hy.gpu.specs[p].slots == 0 {
            // No slot on the GPU (the budget went to attention and the head): every unit on
            // the CPU, with nothing to plan, queue or wait for.
            let t0 = Instant::now();
            let n = self.s.active.len();
            self.project(l, 1, site, true)?;
            let hy = self.gpu.hybrid.as_mut().expect("called with a hybrid tier");
            hy.token_spent_ns[1] += t0.elapsed().as_nanos() as f64;
            // Not a balanced site: no planning to count (the simulator's calibration fits the
            // planning cost per balanced site).
            let values = (n * hy.gpu.specs[p].n_out) as u64;
            hy.count(Count::CpuSites, (n > 0) as u64);
            hy.count(Count::CpuValues, values);
            hy.count(Count::Units, n as u64);
            return Ok(());
        }
        let tq = Instant::now();
        let active = std::mem::take(&mut self.s.active);
        let plan: SitePlan = hy.balancer.plan(p, &active);
        let first_ns = hy.load(p, &plan.load_first)?;
        let x = if site == Site::FfnMid { &self.s.g[..ff] } else { &self.s.h[..e] };
        hy.coef.clear();
        hy.coef.extend(plan.gpu.iter().map(|&i| x[active[i] as usize]));
        let stall = !hy.gpu.loads_ready(p);
        let on_gpu = !plan.gpu.is_empty();
        if on_gpu {
            hy.gpu.compute(p, &plan.gpu_cols, &hy.coef)?;
        }
        // The CPU's share meanwhile, written over the outputs.
        let t0 = Instant::now();
        let queue_ns = (t0.duration_since(tq).as_nanos() as f64 - first_ns).max(0.0);
        self.s.active.clear();
        self.s.active.extend_from_slice(&plan.cpu_units);
        let cpu = if plan.cpu_units.is_empty() {
            match site {
                Site::FfnMid => self.s.o[..e].fill(0.0),
                _ => {
                    self.s.g[..ff].fill(0.0);
                    self.s.u[..ff].fill(0.0);
                }
            }
            Ok(())
        } else {
            self.project(l, 1, site, true)
        };
        let cpu_ns = t0.elapsed().as_nanos() as f64;
        let hy = self.gpu.hybrid.as_mut().expect("called with a hybrid tier");
        let t1 = Instant::now();
        if on_gpu {
            let n_out = hy.gpu.specs[p].n_out;
            hy.y.clear();
            hy.y.resize(n_out, 0.0);
            hy.gpu.finish(&mut hy.y)?;
            let outs: [&mut [f32]; 2] = match site {
                Site::FfnMid => [&mut self.s.o[..e], &mut []],
                _ => [&mut self.s.g[..ff], &mut self.s.u[..ff]],
            };
            let mut y = &hy.y[..];
            for out in outs {
                let (head, rest) = y.split_at(out.len());
                for (o, v) in out.iter_mut().zip(head) {
                    *o += v;
                }
                y = rest;
            }
        }
        cpu?;
        let wait_ns = t1.elapsed().as_nanos() as f64;
        let stall_ns = if stall { wait_ns } else { 0.0 };
        for (t, v) in hy.token_spent_ns.iter_mut().zip([queue_ns, cpu_ns, wait_ns]) {
            *t += v;
        }
        let next = hy.balancer.after(p, &plan, stall_ns, cpu_ns);
        hy.load(p, &next)?;
        hy.products += 1;
        let values = (plan.cpu_units.len() * hy.gpu.specs[p].n_out) as u64;
        hy.count(Count::Sites, 1);
        hy.count(Count::GpuProducts, on_gpu as u64);
        hy.count(Count::CpuSites, !plan.cpu_units.is_empty() as u64);
        hy.count(Count::CpuValues, values);
        hy.count(Count::Units, active.len() as u64);
        hy.count(Count::GpuUnits, plan.gpu.len() as u64);
        hy.stalled += stall as u64;
        self.s.active = active;
        Ok(())
    }
}
