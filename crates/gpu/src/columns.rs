//! The hybrid tier's column pools (issue 20, KAIROX's GPU side): for each (layer, site) a pool
//! of `slots` group slots on the GPU, each holding `group_size` units' columns, and a page-locked
//! host table of every group the pool can load. The engine decides which groups live where (the
//! balancer); this module moves bytes and multiplies.
//!
//! A unit's columns are the site's ops' columns for one input channel, concatenated (gate then
//! up for the FFN input; down for the GLU), as Q8_0 blocks along the output: one column of
//! `n_out` values, `n_out / 32 * 34` bytes. Q8_0 because the GPU kernel is then one format for
//! every model; it costs the GPU more bytes per unit than a 4-bit file holds (about 1.9x for
//! Q4_K) and rounds the dequantized weights once more to 8 bits (small beside 4-bit rounding).
//!
//! Two streams: the **critical** stream runs [`GpuColumns::compute`] (a token's active resident
//! columns times their inputs, back to pinned host memory) and the **reload** stream runs
//! [`GpuColumns::load`] (a group's bytes from the host table into a slot). A pool's computation
//! waits for the loads queued for it before; a load waits for the computation that last read
//! its pool (the slot it overwrites may be in use): loads never block the CPU, and computations
//! wait for loads only when they were queued too late — an I/O stall, which
//! [`GpuColumns::loads_ready`] tells before it happens.

use crate::{GpuDevice, GpuError};

/// The shape of one pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColumnPoolSpec {
    /// Output values of a unit's concatenated columns (a multiple of 32).
    pub n_out: usize,
    /// Units per group (one transfer).
    pub group_size: usize,
    /// Groups in the host table.
    pub n_groups: usize,
    /// Group slots on the GPU.
    pub slots: usize,
}

impl ColumnPoolSpec {
    /// Bytes of one unit's columns (Q8_0 along the output).
    pub const fn unit_bytes(&self) -> usize {
        self.n_out / 32 * 34
    }

    /// Bytes of one group (a transfer).
    pub const fn group_bytes(&self) -> usize {
        self.unit_bytes() * self.group_size
    }

    /// Device bytes of the pool's slots.
    pub const fn device_bytes(&self) -> u64 {
        (self.group_bytes() * self.slots) as u64
    }

    /// Host bytes of the pool's table.
    pub const fn table_bytes(&self) -> u64 {
        (self.group_bytes() * self.n_groups) as u64
    }
}

/// Column pools on the GPU and their host tables (see the module docs).
pub struct GpuColumns {
    pub specs: Vec<ColumnPoolSpec>,
    backend: Backend,
}

enum Backend {
    /// The pools in host memory, products by [`axpy_cols_q8_ref`]: the reference the CUDA
    /// pools are tested against, and how the hybrid path is tested without a GPU.
    Host(HostColumns),
    #[cfg(feature = "cuda")]
    Cuda(Box<crate::cuda_columns::Columns>),
}

struct HostColumns {
    tables: Vec<Vec<u8>>,
    slots: Vec<Vec<u8>>,
    y: Vec<f32>,
    in_flight: bool,
}

/// `y[k] += Σ_i coef[i] · C[idx[i]][k]` over Q8_0 columns of `col_bytes` in `pool`: the scalar
/// reference of kernels.cu's `axpy_cols_q8` (which sums in chunks of 64 columns, atomically, so
/// results differ by float reassociation only).
pub fn axpy_cols_q8_ref(pool: &[u8], col_bytes: usize, idx: &[u32], coef: &[f32], y: &mut [f32]) {
    let mut w = vec![0f32; col_bytes / 34 * 32];
    for (&c, &a) in idx.iter().zip(coef) {
        sift_quant::ColType::Q8_0.dequantize_col(&pool[c as usize * col_bytes..(c as usize + 1) * col_bytes], &mut w);
        for (o, v) in y.iter_mut().zip(&w) {
            *o += a * v;
        }
    }
}

impl GpuColumns {
    /// The pools in host memory (no GPU): loads are copies, products [`axpy_cols_q8_ref`].
    pub fn emulated(specs: Vec<ColumnPoolSpec>, fill: &mut dyn FnMut(usize, &mut [u8])) -> GpuColumns {
        let mut tables = Vec::with_capacity(specs.len());
        let mut slots = Vec::with_capacity(specs.len());
        for (i, s) in specs.iter().enumerate() {
            let mut t = vec![0u8; s.table_bytes() as usize];
            fill(i, &mut t);
            tables.push(t);
            slots.push(vec![0u8; s.device_bytes() as usize]);
        }
        GpuColumns { specs, backend: Backend::Host(HostColumns { tables, slots, y: Vec::new(), in_flight: false }) }
    }

    /// Whether the pools are on a GPU (not [`GpuColumns::emulated`]).
    pub fn on_gpu(&self) -> bool {
        !matches!(self.backend, Backend::Host(_))
    }
}

impl GpuDevice {
    /// Allocates the pools of `specs` (device slots and pinned host tables) and fills each host
    /// table by `fill(pool, table)` (the table's `n_groups` groups in order, each `group_size`
    /// units of [`ColumnPoolSpec::unit_bytes`]).
    pub fn column_pools(
        &mut self,
        specs: Vec<ColumnPoolSpec>,
        fill: &mut dyn FnMut(usize, &mut [u8]),
    ) -> Result<GpuColumns, GpuError> {
        for (i, s) in specs.iter().enumerate() {
            if s.n_out == 0 || s.n_out % 32 != 0 || s.group_size == 0 {
                return Err(GpuError::Shape {
                    name: format!("column pool {i}"),
                    msg: format!("{} outputs (a non-zero multiple of 32 needed), groups of {}", s.n_out, s.group_size),
                });
            }
            if s.slots * s.group_size > i32::MAX as usize || s.n_out > i32::MAX as usize {
                return Err(GpuError::Shape {
                    name: format!("column pool {i}"),
                    msg: "too large for 32-bit indices".into(),
                });
            }
        }
        #[cfg(feature = "cuda")]
        {
            let inner = crate::cuda_columns::Columns::new(&self.inner, &specs, fill)?;
            Ok(GpuColumns { specs, backend: Backend::Cuda(Box::new(inner)) })
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = fill;
            unreachable!("a GpuDevice exists only in builds with the cuda feature")
        }
    }
}

impl GpuColumns {
    /// Device bytes of all slots.
    pub fn device_bytes(&self) -> u64 {
        self.specs.iter().map(|s| s.device_bytes()).sum()
    }

    /// Host (pinned) bytes of all tables.
    pub fn table_bytes(&self) -> u64 {
        self.specs.iter().map(|s| s.table_bytes()).sum()
    }

    fn check(&self, pool: usize, group: u32, slot: u32) -> Result<(), GpuError> {
        let s = self.specs.get(pool).ok_or_else(|| GpuError::Shape {
            name: "column pools".into(),
            msg: format!("no pool {pool} of {}", self.specs.len()),
        })?;
        if group as usize >= s.n_groups || slot as usize >= s.slots {
            return Err(GpuError::Shape {
                name: format!("column pool {pool}"),
                msg: format!("group {group} of {} into slot {slot} of {}", s.n_groups, s.slots),
            });
        }
        Ok(())
    }

    /// Queues group `group` of `pool`'s table into slot `slot` on the reload stream.
    pub fn load(&mut self, pool: usize, group: u32, slot: u32) -> Result<(), GpuError> {
        self.check(pool, group, slot)?;
        let s = self.specs[pool];
        match &mut self.backend {
            Backend::Host(h) => {
                let gb = s.group_bytes();
                let (g, sl) = (group as usize, slot as usize);
                h.slots[pool][sl * gb..(sl + 1) * gb].copy_from_slice(&h.tables[pool][g * gb..(g + 1) * gb]);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.load(&s, pool, group as usize, slot as usize),
        }
    }

    /// Whether every load queued for `pool` has arrived (a computation now would not wait).
    pub fn loads_ready(&self, pool: usize) -> bool {
        match &self.backend {
            Backend::Host(_) => {
                let _ = pool;
                true
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.loads_ready(pool),
        }
    }

    /// Queues `Σ_i coef[i] · column idx[i]` of `pool` (column `c` = unit `c % group_size` of
    /// slot `c / group_size`) on the critical stream, after the pool's queued loads; the result
    /// comes back with [`GpuColumns::finish`]. One computation at a time.
    pub fn compute(&mut self, pool: usize, idx: &[u32], coef: &[f32]) -> Result<(), GpuError> {
        let s = *self.specs.get(pool).ok_or_else(|| GpuError::Shape {
            name: "column pools".into(),
            msg: format!("no pool {pool} of {}", self.specs.len()),
        })?;
        let cols = s.slots * s.group_size;
        if idx.len() != coef.len() || idx.iter().any(|&c| c as usize >= cols) {
            return Err(GpuError::Shape {
                name: format!("column pool {pool}"),
                msg: format!("{} indices for {} factors, or an index past its {cols} columns", idx.len(), coef.len()),
            });
        }
        match &mut self.backend {
            Backend::Host(h) => {
                if h.in_flight {
                    return Err(GpuError::Driver("a column computation is already in flight".into()));
                }
                h.y.clear();
                h.y.resize(s.n_out, 0.0);
                axpy_cols_q8_ref(&h.slots[pool], s.unit_bytes(), idx, coef, &mut h.y);
                h.in_flight = true;
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.compute(&s, pool, idx, coef),
        }
    }

    /// Waits for the computation queued last and adds its `n_out` values into `y`.
    pub fn finish(&mut self, y: &mut [f32]) -> Result<(), GpuError> {
        match &mut self.backend {
            Backend::Host(h) => {
                if !std::mem::take(&mut h.in_flight) {
                    return Err(GpuError::Driver("no column computation in flight".into()));
                }
                for (o, v) in y.iter_mut().zip(&h.y) {
                    *o += v;
                }
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.finish(y),
        }
    }

    /// Waits until every queued load has arrived.
    pub fn sync_loads(&mut self) -> Result<(), GpuError> {
        match &mut self.backend {
            Backend::Host(_) => Ok(()),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.sync_loads(),
        }
    }
}

/// What [`GpuDevice::probe`] measured: the figures the hybrid simulation's GPU profile needs.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct GpuProbe {
    pub name: String,
    /// Host-to-device bandwidth from page-locked memory by transfer size: (bytes per transfer,
    /// bytes/s), transfers queued back to back on one stream, as the reload stream issues them.
    pub h2d: Vec<(u64, f64)>,
    /// Device memory bandwidth: bytes read and written per second by a device-to-device copy.
    pub device_bw: f64,
    /// One hybrid product's fixed cost, ns: a small copy in, a kernel, a small copy back, a wait.
    pub round_trip_ns: f64,
}

impl GpuDevice {
    /// Measures transfers by size, device bandwidth and a product's round trip (about a second).
    pub fn probe(&mut self) -> Result<GpuProbe, GpuError> {
        #[cfg(feature = "cuda")]
        {
            let mut p = crate::cuda_columns::probe(&self.inner)?;
            p.name = self.name.clone();
            Ok(p)
        }
        #[cfg(not(feature = "cuda"))]
        unreachable!("a GpuDevice exists only in builds with the cuda feature")
    }
}
