//! A small GGUF v3 writer for the files sift makes itself (LoRA adapters): scalar metadata and
//! f32 tensors, data aligned to [`DEFAULT_ALIGNMENT`]. What it writes, [`Gguf::parse`] and
//! llama.cpp read.

use crate::{GgmlType, DEFAULT_ALIGNMENT};

/// One metadata value the writer knows.
#[derive(Clone, Debug, PartialEq)]
pub enum WriteValue {
    String(String),
    F32(f32),
    U32(u32),
    U64(u64),
}

/// A GGUF file built in memory: metadata pairs and f32 tensors, in the order added.
#[derive(Default)]
pub struct GgufWriter {
    meta: Vec<(String, WriteValue)>,
    tensors: Vec<(String, Vec<u64>, Vec<f32>)>,
}

impl GgufWriter {
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    pub fn meta(&mut self, key: &str, v: WriteValue) -> &mut Self {
        self.meta.push((key.to_string(), v));
        self
    }

    /// An f32 tensor of `rows` × `cols` (row-major; GGUF's `ne` is `[cols, rows]`).
    pub fn tensor_f32(&mut self, name: &str, rows: usize, cols: usize, data: Vec<f32>) -> &mut Self {
        assert_eq!(data.len(), rows * cols, "tensor {name}: {} values for {rows} x {cols}", data.len());
        self.tensors.push((name.to_string(), vec![cols as u64, rows as u64], data));
        self
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::new();
        let str = |b: &mut Vec<u8>, s: &str| {
            b.extend_from_slice(&(s.len() as u64).to_le_bytes());
            b.extend_from_slice(s.as_bytes());
        };
        b.extend_from_slice(b"GGUF");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&(self.meta.len() as u64).to_le_bytes());
        for (k, v) in &self.meta {
            str(&mut b, k);
            match v {
                WriteValue::String(s) => {
                    b.extend_from_slice(&8u32.to_le_bytes());
                    str(&mut b, s);
                }
                WriteValue::F32(x) => {
                    b.extend_from_slice(&6u32.to_le_bytes());
                    b.extend_from_slice(&x.to_le_bytes());
                }
                WriteValue::U32(x) => {
                    b.extend_from_slice(&4u32.to_le_bytes());
                    b.extend_from_slice(&x.to_le_bytes());
                }
                WriteValue::U64(x) => {
                    b.extend_from_slice(&10u32.to_le_bytes());
                    b.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
        let align = DEFAULT_ALIGNMENT as usize;
        let mut offset = 0usize;
        for (name, dims, data) in &self.tensors {
            str(&mut b, name);
            b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&(GgmlType::F32.id()).to_le_bytes());
            b.extend_from_slice(&(offset as u64).to_le_bytes());
            offset = (offset + 4 * data.len()).next_multiple_of(align);
        }
        b.resize(b.len().next_multiple_of(align), 0);
        for (_, _, data) in &self.tensors {
            for v in data {
                b.extend_from_slice(&v.to_le_bytes());
            }
            b.resize(b.len().next_multiple_of(align), 0);
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Gguf;

    #[test]
    fn what_it_writes_parses_back() {
        let mut w = GgufWriter::new();
        w.meta("general.type", WriteValue::String("adapter".into()))
            .meta("adapter.lora.alpha", WriteValue::F32(32.0))
            .meta("n", WriteValue::U32(7))
            .tensor_f32("a", 2, 3, vec![1., 2., 3., 4., 5., 6.])
            .tensor_f32("b", 1, 5, vec![-1.; 5]);
        let bytes = w.to_bytes();
        let g = Gguf::parse(&bytes).unwrap();
        assert_eq!(g.get_str("general.type"), Some("adapter"));
        assert_eq!(g.get_f32("adapter.lora.alpha"), Some(32.0));
        assert_eq!(g.get_u64("n"), Some(7));
        let a = g.tensor("a").unwrap();
        assert_eq!((a.n_rows(), a.n_elements()), (2, 6));
        let at = (g.data_offset + a.offset) as usize;
        let v: Vec<f32> = bytes[at..at + 24].chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(v, [1., 2., 3., 4., 5., 6.]);
        let b = g.tensor("b").unwrap();
        let bt = (g.data_offset + b.offset) as usize;
        assert_eq!(f32::from_le_bytes(bytes[bt..bt + 4].try_into().unwrap()), -1.0);
    }
}
