//! Per-layer, per-site sparsity ratios: the method's uniform ratio plus overrides from a JSON file.
//!
//! ```json
//! { "ratio": 0.5, "sites": { "qkv": 0.3, "down": 0.6 }, "layers": { "0": { "down": 0.0 }, "23": 0.2 } }
//! ```
//! `ratio` replaces `--ratio`; `sites` sets a site in every layer; `layers` sets one layer, either
//! every sparsified site (a number) or some sites (an object). Later entries win: ratio, sites, layers.

use crate::{Method, Site};
use serde_json::Value;

/// Fraction of units skipped, per layer and site. Sites a method does not sparsify are 0.
#[derive(Clone, Debug, PartialEq)]
pub struct Ratios {
    table: Vec<[f32; 4]>,
}

/// A bad ratio or override file.
#[derive(Debug, thiserror::Error)]
pub enum RatioError {
    #[error("ratio {0} is outside [0, 1): it is the fraction of units skipped")]
    OutOfRange(f64),
    #[error("sparsity config: {0}")]
    Config(String),
}

fn check(r: f64) -> Result<f32, RatioError> {
    if (0.0..1.0).contains(&r) {
        Ok(r as f32)
    } else {
        Err(RatioError::OutOfRange(r))
    }
}

impl Ratios {
    /// `ratio` at every site the method sparsifies, 0 elsewhere.
    pub fn uniform(method: Method, n_layer: usize, ratio: f64) -> Result<Ratios, RatioError> {
        let r = check(ratio)?;
        let mut row = [0f32; 4];
        for s in method.sites() {
            row[s.index()] = r;
        }
        Ok(Ratios { table: vec![row; n_layer] })
    }

    /// Explicit per-layer ratios (from a calibration's allocation).
    pub fn from_table(table: Vec<[f32; 4]>) -> Ratios {
        Ratios { table }
    }

    pub fn n_layer(&self) -> usize {
        self.table.len()
    }

    #[inline]
    pub fn get(&self, layer: usize, site: Site) -> f32 {
        self.table.get(layer).map_or(0.0, |r| r[site.index()])
    }

    pub fn set(&mut self, layer: usize, site: Site, r: f32) {
        self.table[layer][site.index()] = r;
    }

    pub fn table(&self) -> &[[f32; 4]] {
        &self.table
    }

    /// Applies a JSON override document (see the module docs) for `method`.
    pub fn apply_overrides(&mut self, method: Method, json: &str) -> Result<(), RatioError> {
        let v: Value = serde_json::from_str(json).map_err(|e| RatioError::Config(format!("not valid JSON: {e}")))?;
        let obj = v.as_object().ok_or_else(|| RatioError::Config("the top level must be an object".into()))?;
        for key in obj.keys() {
            if !matches!(key.as_str(), "ratio" | "sites" | "layers") {
                return Err(RatioError::Config(format!("unknown key '{key}' (expected ratio, sites, layers)")));
            }
        }
        let num = |v: &Value, what: &str| -> Result<f32, RatioError> {
            let x = v.as_f64().ok_or_else(|| RatioError::Config(format!("{what} must be a number")))?;
            check(x)
        };
        let site = |k: &str| -> Result<Site, RatioError> {
            let s = Site::from_name(k)
                .ok_or_else(|| RatioError::Config(format!("unknown site '{k}' (qkv, o, gate_up, down)")))?;
            if !method.sites().contains(&s) {
                return Err(RatioError::Config(format!("method {method} does not sparsify site '{k}'")));
            }
            Ok(s)
        };
        if let Some(r) = obj.get("ratio") {
            let r = num(r, "ratio")?;
            *self = Ratios::uniform(method, self.table.len(), r as f64)?;
        }
        if let Some(sites) = obj.get("sites") {
            let sites = sites.as_object().ok_or_else(|| RatioError::Config("sites must be an object".into()))?;
            for (k, v) in sites {
                let (s, r) = (site(k)?, num(v, &format!("sites.{k}"))?);
                for row in &mut self.table {
                    row[s.index()] = r;
                }
            }
        }
        if let Some(layers) = obj.get("layers") {
            let layers = layers.as_object().ok_or_else(|| RatioError::Config("layers must be an object".into()))?;
            for (k, v) in layers {
                let l: usize = k.parse().map_err(|_| RatioError::Config(format!("layer key '{k}' is not a number")))?;
                if l >= self.table.len() {
                    return Err(RatioError::Config(format!(
                        "layer {l} does not exist (the model has {})",
                        self.table.len()
                    )));
                }
                match v {
                    Value::Object(m) => {
                        for (sk, sv) in m {
                            let (s, r) = (site(sk)?, num(sv, &format!("layers.{k}.{sk}"))?);
                            self.table[l][s.index()] = r;
                        }
                    }
                    other => {
                        let r = num(other, &format!("layers.{k}"))?;
                        for s in method.sites() {
                            self.table[l][s.index()] = r;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The overall fraction of weight bytes skipped, given each site's bytes per layer.
    pub fn overall(&self, site_bytes: [f64; 4]) -> f64 {
        let total: f64 = site_bytes.iter().sum::<f64>() * self.table.len() as f64;
        let skipped: f64 =
            self.table.iter().map(|row| (0..4).map(|i| row[i] as f64 * site_bytes[i]).sum::<f64>()).sum();
        if total > 0.0 {
            skipped / total
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_apply_in_order() {
        let mut r = Ratios::uniform(Method::TopK, 4, 0.5).unwrap();
        r.apply_overrides(Method::TopK, r#"{"sites": {"qkv": 0.3}, "layers": {"0": {"down": 0.0}, "3": 0.1}}"#)
            .unwrap();
        assert_eq!(r.get(1, Site::AttnIn), 0.3);
        assert_eq!(r.get(1, Site::FfnMid), 0.5);
        assert_eq!(r.get(0, Site::FfnMid), 0.0);
        assert_eq!(r.get(3, Site::AttnOut), 0.1);
    }

    #[test]
    fn bad_overrides_are_errors() {
        let mut r = Ratios::uniform(Method::Dip, 2, 0.5).unwrap();
        for bad in [
            "[1]",
            "{\"ratio\": 1.5}",
            "{\"sites\": {\"qkv\": 0.2}}",
            "{\"sites\": {\"nope\": 0.2}}",
            "{\"layers\": {\"9\": 0.2}}",
            "{\"extra\": 1}",
            "not json",
        ] {
            assert!(r.apply_overrides(Method::Dip, bad).is_err(), "{bad}");
        }
        assert!(Ratios::uniform(Method::TopK, 2, 1.0).is_err());
    }
}
