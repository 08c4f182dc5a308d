//! The layouts a sift pack adds to a model's weights, for activation sparsity: every
//! sparsifiable op transposed into contiguous columns (one per input channel; exact columns keep
//! the source's scales in a scale plane beside them), optionally in a unit order of its own per
//! selection site ([`UnitOrderTensor`]), and optionally cross-layer interleaved records for
//! preloading. Byte ranges index the whole pack file
//! ([`sift_gguf::GgufFile::file_bytes`]).

use serde::{Deserialize, Serialize};
use sift_quant::ColFormat;
use std::ops::Range;

/// Where in a layer a linear op reads its input (a selection site). Ops that share an input share
/// the selection. A site's geometry — its ops ([`Site::ops`]), where they lie among a layer's
/// seven ([`Site::op_range`]), its width ([`Site::width`], [`SiteDims`]) — is written here once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Site {
    /// Output of the attention norm, read by q, k and v.
    AttnIn = 0,
    /// Output of attention, read by o.
    AttnOut = 1,
    /// Output of the FFN norm, read by gate and up.
    FfnIn = 2,
    /// The GLU activation silu(gate) * up, read by down. Its units are the FFN neurons.
    FfnMid = 3,
}

impl Site {
    pub const ALL: [Site; 4] = [Site::AttnIn, Site::AttnOut, Site::FfnIn, Site::FfnMid];

    /// The name used in config and calibration files.
    pub fn name(self) -> &'static str {
        match self {
            Site::AttnIn => "qkv",
            Site::AttnOut => "o",
            Site::FfnIn => "gate_up",
            Site::FfnMid => "down",
        }
    }

    pub fn from_name(s: &str) -> Option<Site> {
        match s {
            "qkv" | "q" | "k" | "v" | "attn_in" => Some(Site::AttnIn),
            "o" | "attn_out" => Some(Site::AttnOut),
            "gate_up" | "gate" | "up" | "ffn_in" => Some(Site::FfnIn),
            "down" | "glu" | "ffn_mid" => Some(Site::FfnMid),
            _ => None,
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }

    /// The ops that read this site's activation.
    pub fn ops(self) -> &'static [OpKind] {
        SITE_OPS[self.index()]
    }

    /// Where this site's ops lie among a layer's seven, in [`OpKind::ALL`] order.
    pub fn op_range(self) -> Range<usize> {
        match self {
            Site::AttnIn => 0..3,
            Site::AttnOut => 3..4,
            Site::FfnIn => 4..6,
            Site::FfnMid => 6..7,
        }
    }

    /// The site's units (its activation's width) in a model of `c`: the embedding for the two
    /// normed residuals, the attention's output width, the FFN's neurons.
    pub fn width(self, c: &crate::Config) -> usize {
        match self {
            Site::AttnIn | Site::FfnIn => c.n_embd,
            Site::AttnOut => c.n_embd_q(),
            Site::FfnMid => c.n_ff,
        }
    }
}

/// Model shape facts a selector needs: the layers, and each site's units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SiteDims {
    pub n_layer: usize,
    /// Units at each site, in [`Site::ALL`] order: n_embd, n_embd_q, n_embd, n_ff.
    pub units: [usize; 4],
}

impl SiteDims {
    /// The sites of a model of `c`.
    pub fn of(c: &crate::Config) -> SiteDims {
        SiteDims { n_layer: c.n_layer, units: Site::ALL.map(|s| s.width(c)) }
    }
}

/// The seven sparsifiable linear ops of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpKind {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl OpKind {
    pub const ALL: [OpKind; 7] = [OpKind::Q, OpKind::K, OpKind::V, OpKind::O, OpKind::Gate, OpKind::Up, OpKind::Down];

    /// The selection site whose activation this op reads (an index into [`SITE_OPS`]: attention
    /// input, attention output, FFN input, GLU activation).
    pub fn site_index(self) -> usize {
        self.site().index()
    }

    /// The selection site whose activation this op reads.
    pub fn site(self) -> Site {
        match self {
            OpKind::Q | OpKind::K | OpKind::V => Site::AttnIn,
            OpKind::O => Site::AttnOut,
            OpKind::Gate | OpKind::Up => Site::FfnIn,
            OpKind::Down => Site::FfnMid,
        }
    }
}

/// The ops that read each selection site's activation, by site index (`sift_sparsity::Site`
/// order: attention input, attention output, FFN input, GLU activation). The one place the
/// site-to-ops map is written.
pub const SITE_OPS: [&[OpKind]; 4] =
    [&[OpKind::Q, OpKind::K, OpKind::V], &[OpKind::O], &[OpKind::Gate, OpKind::Up], &[OpKind::Down]];

/// One op's transposed weight: `n_in` columns of `n_out` values, `col_bytes` each, and for exact
/// columns the op's scale plane.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ColumnTensor {
    pub layer: usize,
    pub op: OpKind,
    #[serde(with = "col_format_name")]
    pub ty: ColFormat,
    pub n_in: usize,
    pub n_out: usize,
    pub col_bytes: usize,
    /// Byte range in the pack file.
    pub offset: u64,
    pub len: u64,
    pub crc32: u32,
    /// The scale plane's byte range in the pack file (empty for re-quantized columns).
    #[serde(default)]
    pub scales_offset: u64,
    #[serde(default)]
    pub scales_len: u64,
    #[serde(default)]
    pub scales_crc32: u32,
}

impl ColumnTensor {
    pub fn range(&self) -> Range<usize> {
        self.offset as usize..(self.offset + self.len) as usize
    }

    /// The scale plane's byte range in the pack file.
    pub fn scales_range(&self) -> Range<usize> {
        self.scales_offset as usize..(self.scales_offset + self.scales_len) as usize
    }
}

mod col_format_name {
    use serde::{Deserialize, Deserializer, Serializer};
    use sift_quant::ColFormat;
    pub fn serialize<S: Serializer>(t: &ColFormat, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&t.name())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ColFormat, D::Error> {
        let s = String::deserialize(d)?;
        ColFormat::from_name(&s).ok_or_else(|| serde::de::Error::custom(format!("unknown column format {s}")))
    }
}

/// Where one (layer, op) column sits inside a [`GroupTensor`] unit.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GroupPart {
    pub layer: usize,
    pub op: OpKind,
    /// Byte offset of the column within the unit record.
    pub offset: usize,
    pub col_bytes: usize,
}

/// Cross-layer interleaved columns (ActiveFlow §4, data layout): for a group of `n_layers`
/// consecutive layers, unit `c` (input channel `c` of the ops reading the normed residual: q, k,
/// v, gate, up) is one record holding that channel's column for every layer of the group and
/// every such op, in unit → layer → op order. One read brings a channel for the whole group.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GroupTensor {
    pub first_layer: usize,
    pub n_layers: usize,
    pub n_units: usize,
    pub unit_bytes: usize,
    pub parts: Vec<GroupPart>,
    pub offset: u64,
    pub len: u64,
    pub crc32: u32,
}

impl GroupTensor {
    /// The layers of this group.
    pub fn layers(&self) -> std::ops::Range<usize> {
        self.first_layer..self.first_layer + self.n_layers
    }

    /// The part holding (`layer`, `op`), if this group has it.
    pub fn part(&self, layer: usize, op: OpKind) -> Option<&GroupPart> {
        self.parts.iter().find(|p| p.layer == layer && p.op == op)
    }
}

/// The ops whose input is a layer's normed residual: the ones a cross-layer group interleaves.
pub const GROUP_OPS: [OpKind; 5] = [OpKind::Q, OpKind::K, OpKind::V, OpKind::Gate, OpKind::Up];

/// The order in which one selection site's units (input channels) lie in the column tensors of
/// its ops: a section of `n_units` little-endian `u32`s, entry `p` naming the unit whose column
/// is the `p`-th of each of the site's ops. A site without one is in the model's order. Units
/// that are active together, laid side by side, are read together (co-activation grouping);
/// scale planes stay in the model's order, since the kernels find a column's scales by its unit.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct UnitOrderTensor {
    pub layer: usize,
    /// The site (an index into [`SITE_OPS`]).
    pub site: usize,
    pub n_units: usize,
    /// Byte range in the pack file.
    pub offset: u64,
    pub len: u64,
    pub crc32: u32,
}

/// Where each unit of a site lies in its ops' column tensors: entry `u` is the column position of
/// unit `u` (the inverse of a [`UnitOrderTensor`]'s order), shared by the site's ops.
pub type UnitPositions = std::sync::Arc<[u32]>;

/// The inverse of `order` (position → unit) if it is a permutation of `0..order.len()`, else the
/// reason it is not.
pub fn unit_positions(order: &[u32]) -> Result<UnitPositions, String> {
    let mut pos = vec![u32::MAX; order.len()];
    for (p, &u) in order.iter().enumerate() {
        match pos.get_mut(u as usize) {
            None => return Err(format!("unit {u} at position {p} is past the site's {} units", order.len())),
            Some(slot) if *slot != u32::MAX => return Err(format!("unit {u} appears twice")),
            Some(slot) => *slot = p as u32,
        }
    }
    Ok(pos.into())
}

/// The column tensors of one layer.
#[derive(Clone, Debug)]
pub struct LayerColumns {
    /// Indexed by [`OpKind`] order: q, k, v, o, gate, up, down.
    pub ops: Vec<ColumnTensor>,
    /// Per site ([`SITE_OPS`] order), where its units lie when not in the model's order.
    pub positions: [Option<UnitPositions>; 4],
    /// The FFN's neuron bundles, when the pack has them.
    pub bundles: Option<BundleTensor>,
}

/// One layer's neuron bundles ([`sift_quant::bundles`]): per FFN neuron, in the model's neuron
/// order, a record of its gate row and up row (the GGUF's bytes) and its down column (exact, in
/// the format of the layer's down column tensor, whose scale plane the bundles share).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BundleTensor {
    pub layer: usize,
    /// The gate and up rows' GGUF types, by name.
    pub gate: String,
    pub up: String,
    pub n_embd: usize,
    pub n_ff: usize,
    pub record_bytes: usize,
    /// Byte range in the pack file.
    pub offset: u64,
    pub len: u64,
    pub crc32: u32,
}

impl BundleTensor {
    pub fn range(&self) -> Range<usize> {
        self.offset as usize..(self.offset + self.len) as usize
    }
}

impl LayerColumns {
    pub fn op(&self, op: OpKind) -> &ColumnTensor {
        &self.ops[op as usize]
    }

    /// The layout of this layer's bundles (their down columns in the down tensor's exact format),
    /// `None` without bundles or when the record does not describe a layout sift has.
    pub fn bundle_layout(&self) -> Option<sift_quant::bundles::BundleLayout> {
        let b = self.bundles.as_ref()?;
        let ColFormat::Exact(down) = self.op(OpKind::Down).ty else { return None };
        let ty = |name: &str| sift_quant::WeightType::from_name(name);
        let layout = sift_quant::bundles::BundleLayout::new(ty(&b.gate)?, ty(&b.up)?, down, b.n_embd, b.n_ff).ok()?;
        (layout.record_bytes() == b.record_bytes && layout.records_len() as u64 == b.len).then_some(layout)
    }

    /// Where `op`'s units lie in its column tensor (`None`: in the model's order).
    pub fn positions(&self, op: OpKind) -> Option<&UnitPositions> {
        self.positions[op.site_index()].as_ref()
    }

    /// Byte offset in the pack file of unit `u`'s column of `op`.
    pub fn column_offset(&self, op: OpKind, u: u32) -> u64 {
        let t = self.op(op);
        let p = self.positions(op).map_or(u, |p| p[u as usize]);
        t.offset + p as u64 * t.col_bytes as u64
    }
}

/// What a pack adds to its GGUF, with byte ranges into the pack file (`Model::pack_bytes`).
#[derive(Clone, Debug)]
pub struct PackIndex {
    pub layers: Vec<LayerColumns>,
    /// Cross-layer interleaved groups (empty when the pack was made with `--group 0`).
    pub groups: Vec<GroupTensor>,
    /// The source GGUF's file name.
    pub source_name: String,
    /// Where the source GGUF's bytes start in the tiered store's address space: past the pack's
    /// end (4 KiB aligned), so one read offset names a byte of either file (see
    /// `sift_store::io::tier::PackAndSource`).
    pub gguf_offset: u64,
    /// The source GGUF's length and header length (data offset).
    pub gguf_len: u64,
    pub gguf_header_len: u64,
}

impl PackIndex {
    /// Bytes of all column tensors.
    pub fn column_bytes(&self) -> u64 {
        self.layers.iter().flat_map(|l| &l.ops).map(|t| t.len).sum()
    }

    /// Bytes of all scale planes (kept in memory under a budget).
    pub fn scale_bytes(&self) -> u64 {
        self.layers.iter().flat_map(|l| &l.ops).map(|t| t.scales_len).sum()
    }

    /// Bytes of the unit positions of the sites not in the model's order (kept in memory).
    pub fn position_bytes(&self) -> u64 {
        self.layers.iter().flat_map(|l| l.positions.iter().flatten()).map(|p| p.len() as u64 * 4).sum()
    }

    /// Layers per cross-layer group (0: the pack has none).
    pub fn group_size(&self) -> usize {
        self.groups.first().map_or(0, |g| g.n_layers)
    }

    /// The group holding `layer`.
    pub fn group_of(&self, layer: usize) -> Option<&GroupTensor> {
        self.groups.iter().find(|g| g.layers().contains(&layer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A site's geometry agrees with itself: its ops are the ones that name it as their site,
    /// they lie at its op range in `OpKind::ALL`, and the sites partition the seven ops.
    #[test]
    fn site_geometry_is_one_map() {
        let mut seen = Vec::new();
        for site in Site::ALL {
            assert_eq!(&OpKind::ALL[site.op_range()], site.ops(), "{site:?}");
            for &op in site.ops() {
                assert_eq!(op.site(), site);
                assert_eq!(op.site_index(), site.index());
                seen.push(op);
            }
            assert_eq!(Site::from_name(site.name()), Some(site));
        }
        assert_eq!(seen, OpKind::ALL);
    }
}
