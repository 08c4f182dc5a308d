//! Calibrated magnitude thresholds (TEAL): a unit is active when |x_j| reaches its layer's and
//! site's threshold, so the number of active units varies per token while the average matches the
//! target. Thresholds come from the calibration histograms ([`crate::calib`]); the per-site ratios
//! from the calibration's greedy allocation when it has one for this target, else uniform.

use crate::calib::{Calibration, CalibrationError};
use crate::{Phase, Ratios, Selection, Selector, Site};

pub struct ThresholdSelector {
    /// `thresholds[layer][site]`; 0 means dense.
    thresholds: Vec<[f32; 4]>,
    describe: String,
}

impl ThresholdSelector {
    /// Thresholds for `ratios` (the allocation stored in `calib` for the same overall ratio replaces a
    /// uniform table).
    pub fn new(calib: &Calibration, ratios: &Ratios) -> Result<Self, CalibrationError> {
        let (table, how) = calib.allocation_for(ratios);
        let mut thresholds = vec![[0f32; 4]; ratios.n_layer()];
        for (l, row) in thresholds.iter_mut().enumerate() {
            for s in Site::ALL {
                let r = table.get(l, s);
                row[s.index()] = if r > 0.0 { calib.histogram(l, s)?.threshold_for(r) } else { 0.0 };
            }
        }
        Ok(ThresholdSelector { thresholds, describe: format!("threshold ({how})") })
    }

    pub fn threshold(&self, layer: usize, site: Site) -> f32 {
        self.thresholds[layer][site.index()]
    }
}

impl Selector for ThresholdSelector {
    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn select(&mut self, layer: usize, site: Site, _: Phase, x: &[f32], active: &mut Vec<u32>) -> Selection {
        let t = self.thresholds.get(layer).map_or(0.0, |r| r[site.index()]);
        if t <= 0.0 {
            return Selection::All;
        }
        active.clear();
        active.extend(x.iter().enumerate().filter(|(_, v)| v.abs() >= t).map(|(j, _)| j as u32));
        Selection::Subset
    }
}
