//! Activation traces (`sift trace`): what the selector saw and chose for every decoded token,
//! layer and site, so a run can be replayed through the cache without running the model.
//!
//! # What a trace holds
//! Per decoded token and layer: the residual stream entering the layer (f32, what the
//! cross-layer prefetcher predicts from) and, for each of the four sites (q/k/v input, o input,
//! gate/up input, down input), the input the selector looked at (f16, before masking: enough to
//! re-run any magnitude selector, DIP-CA's cache-aware re-ranking included) and the units the
//! recording run's selector chose (a bit mask, or "all"). Prompt batches and sequence resets are
//! recorded as events: under a memory budget a prompt batch reads whole layers and leaves the
//! cache alone, so the cache's history is the decoded tokens'.
//!
//! Replaying other selectors on the recorded inputs is an approximation past the first layer
//! (the recording run's own choices shaped the later inputs); replaying the recorded choices is
//! exact.
//!
//! # File format (little-endian)
//! `SIFTTRC1`, u32 header length, a JSON [`TraceHeader`], then events: `1` reset; `2` + u32 n:
//! prompt batch of n tokens; `3` + u32 position: a decoded token, followed by one record per
//! layer: `n_embd` f32 residual, then per site a u8 flag (0: all units, 1: subset), `dim` f16
//! inputs and, for a subset, a `ceil(dim / 8)`-byte mask (bit `u % 8` of byte `u / 8`); `0xff`
//! ends the file. A trace of SmolLM2-135M is ~0.3 MB per token, of Qwen2.5-1.5B ~1 MB.

use half::f16;
use sift_engine::Tracer;
use sift_sparsity::Site;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

const MAGIC: &[u8; 8] = b"SIFTTRC1";
const EV_RESET: u8 = 1;
const EV_PROMPT: u8 = 2;
const EV_TOKEN: u8 = 3;
const EV_END: u8 = 0xff;
/// Largest dimension a trace may declare (guards allocation from a hostile header).
const MAX_DIM: usize = 1 << 20;
const MAX_LAYERS: usize = 1024;
/// The largest context and batch a trace may record (`-c` is at most 2^24).
const MAX_CTX: usize = 1 << 24;
/// The largest runtime a trace may record (budgets are at most 1 PiB).
const MAX_RUNTIME: u64 = 1 << 50;

/// Problems reading or writing a trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: not a sift trace ({why}); make one with `sift trace`")]
    Format { path: PathBuf, why: String },
    #[error("{path}: the trace was recorded on {recorded}, not on this model ({model}); record it again with `sift trace -m MODEL`")]
    WrongModel { path: PathBuf, recorded: String, model: String },
}

/// What a trace describes (the JSON header).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct TraceHeader {
    /// The model file's name and shape, to refuse replaying on another model.
    pub model: String,
    pub n_layer: usize,
    pub n_embd: usize,
    /// Units at each site: q/k/v input, o input, gate/up input, down input.
    pub dims: [usize; 4],
    /// The recording run's selector, e.g. `topk r=0.50`.
    pub selector: String,
    /// Context size and prompt batch of the recording run (the simulator sizes KV from them).
    pub n_ctx: usize,
    pub n_batch: usize,
    /// Memory the process used before the engine (tokenizer, code), as the engine's plan counts it.
    pub runtime_bytes: u64,
    /// The recording run's measured decode speed, for reference (0 if unknown).
    #[serde(default)]
    pub measured_tok_s: f64,
}

impl TraceHeader {
    /// Checks the trace fits `model`'s shape.
    pub fn check_model(&self, path: &Path, model: &sift_model::Model) -> Result<(), TraceError> {
        let c = &model.config;
        let dims = sift_model::layout::SiteDims::of(c).units;
        if self.n_layer != c.n_layer || self.n_embd != c.n_embd || self.dims != dims {
            return Err(TraceError::WrongModel {
                path: path.into(),
                recorded: format!("{} ({} layers, dims {:?})", self.model, self.n_layer, self.dims),
                model: format!("{} layers, dims {:?}", c.n_layer, dims),
            });
        }
        Ok(())
    }
}

/// One site of one layer of a decoded token.
#[derive(Clone, Debug)]
pub struct SiteRecord {
    /// The selector's input (before masking).
    pub input: Vec<f32>,
    /// The units chosen (ascending), or `None` for all.
    pub active: Option<Vec<u32>>,
}

/// One layer of a decoded token.
#[derive(Clone, Debug)]
pub struct LayerRecord {
    pub residual: Vec<f32>,
    pub sites: [SiteRecord; 4],
}

/// An event of a trace.
#[derive(Clone, Debug)]
pub enum Event {
    Reset,
    Prompt(usize),
    Token { pos: usize, layers: Vec<LayerRecord> },
}

/// A trace read into memory.
#[derive(Clone, Debug)]
pub struct Trace {
    pub header: TraceHeader,
    pub events: Vec<Event>,
}

impl Trace {
    /// Decoded tokens in the trace.
    pub fn n_tokens(&self) -> usize {
        self.events.iter().filter(|e| matches!(e, Event::Token { .. })).count()
    }

    /// Reads and validates a trace file.
    pub fn read(path: &Path) -> Result<Trace, TraceError> {
        let io = |source| TraceError::Io { path: path.into(), source };
        let bad = |why: String| TraceError::Format { path: path.into(), why };
        // Only a regular file (a FIFO would block the open, a device never end).
        let mut r = BufReader::new(sift_output::open_regular(path).map_err(io)?.0);
        let mut magic = [0u8; 8];
        read_exact(&mut r, &mut magic).map_err(|e| e.map_or_else(|| bad("too short".into()), io))?;
        if &magic != MAGIC {
            return Err(bad("wrong magic".into()));
        }
        let hlen = read_u32(&mut r).map_err(|e| e.map_or_else(|| bad("truncated header".into()), io))? as usize;
        if hlen > 1 << 20 {
            return Err(bad(format!("header of {hlen} bytes")));
        }
        let mut h = vec![0u8; hlen];
        read_exact(&mut r, &mut h).map_err(|e| e.map_or_else(|| bad("truncated header".into()), io))?;
        let header: TraceHeader = serde_json::from_slice(&h).map_err(|e| bad(format!("header: {e}")))?;
        if header.n_layer == 0
            || header.n_layer > MAX_LAYERS
            || header.n_embd == 0
            || header.n_embd > MAX_DIM
            || header.dims.iter().any(|&d| d == 0 || d > MAX_DIM)
        {
            return Err(bad(format!("implausible shape: {} layers, dims {:?}", header.n_layer, header.dims)));
        }
        // The run's settings, replayed by `simulate` and `plan`: within what a run can have.
        let plausible = (1..=MAX_CTX).contains(&header.n_ctx)
            && (1..=MAX_CTX).contains(&header.n_batch)
            && header.runtime_bytes <= MAX_RUNTIME
            && header.measured_tok_s.is_finite()
            && header.measured_tok_s >= 0.0;
        if !plausible {
            return Err(bad(format!(
                "implausible run: n_ctx {}, n_batch {}, runtime {} bytes, {} tok/s",
                header.n_ctx, header.n_batch, header.runtime_bytes, header.measured_tok_s
            )));
        }
        let mut events = Vec::new();
        let trunc = || bad("truncated (the recording may have been interrupted)".into());
        loop {
            let mut tag = [0u8; 1];
            read_exact(&mut r, &mut tag).map_err(|e| e.map_or_else(trunc, io))?;
            match tag[0] {
                EV_END => break,
                EV_RESET => events.push(Event::Reset),
                EV_PROMPT => {
                    let n = read_u32(&mut r).map_err(|e| e.map_or_else(trunc, io))?;
                    events.push(Event::Prompt(n as usize));
                }
                EV_TOKEN => {
                    let pos = read_u32(&mut r).map_err(|e| e.map_or_else(trunc, io))? as usize;
                    let mut layers = Vec::with_capacity(header.n_layer);
                    for _ in 0..header.n_layer {
                        let residual = read_f32s(&mut r, header.n_embd).map_err(|e| e.map_or_else(trunc, io))?;
                        let mut sites = Vec::with_capacity(4);
                        for &dim in &header.dims {
                            let mut flag = [0u8; 1];
                            read_exact(&mut r, &mut flag).map_err(|e| e.map_or_else(trunc, io))?;
                            let input = read_f16s(&mut r, dim).map_err(|e| e.map_or_else(trunc, io))?;
                            let active = match flag[0] {
                                0 => None,
                                1 => {
                                    let mut mask = vec![0u8; dim.div_ceil(8)];
                                    read_exact(&mut r, &mut mask).map_err(|e| e.map_or_else(trunc, io))?;
                                    Some(
                                        (0..dim as u32).filter(|&u| mask[u as usize / 8] >> (u % 8) & 1 == 1).collect(),
                                    )
                                }
                                f => return Err(bad(format!("site flag {f}"))),
                            };
                            sites.push(SiteRecord { input, active });
                        }
                        let sites: [SiteRecord; 4] = sites.try_into().expect("four sites");
                        layers.push(LayerRecord { residual, sites });
                    }
                    events.push(Event::Token { pos, layers });
                }
                t => return Err(bad(format!("unknown event {t}"))),
            }
        }
        // Nothing follows the end marker: bytes there were appended or the file was altered.
        match read_exact(&mut r, &mut [0u8; 1]) {
            Err(None) => {}
            Err(Some(e)) => return Err(io(e)),
            Ok(()) => return Err(bad("bytes after the end of the recording (appended or altered)".into())),
        }
        Ok(Trace { header, events })
    }
}

/// `Err(None)`: end of file; `Err(Some(e))`: another I/O error.
fn read_exact(r: &mut impl Read, buf: &mut [u8]) -> Result<(), Option<std::io::Error>> {
    r.read_exact(buf).map_err(|e| if e.kind() == std::io::ErrorKind::UnexpectedEof { None } else { Some(e) })
}

fn read_u32(r: &mut impl Read) -> Result<u32, Option<std::io::Error>> {
    let mut b = [0u8; 4];
    read_exact(r, &mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_f32s(r: &mut impl Read, n: usize) -> Result<Vec<f32>, Option<std::io::Error>> {
    let mut b = vec![0u8; n * 4];
    read_exact(r, &mut b)?;
    Ok(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

fn read_f16s(r: &mut impl Read, n: usize) -> Result<Vec<f32>, Option<std::io::Error>> {
    let mut b = vec![0u8; n * 2];
    read_exact(r, &mut b)?;
    Ok(b.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect())
}

/// Writes a trace as the engine runs: give the engine a clone ([`Engine::set_tracer`]) and end
/// the file with [`TraceWriter::finish`] on another.
///
/// [`Engine::set_tracer`]: sift_engine::Engine::set_tracer
#[derive(Clone)]
pub struct TraceWriter(Arc<Mutex<Inner>>);

struct Inner {
    path: PathBuf,
    w: Option<BufWriter<File>>,
    /// The temporary file `w` writes, renamed over `path` by [`TraceWriter::finish`].
    out: Option<sift_output::Output>,
    dims: [usize; 4],
    /// The first write error (the engine's hooks cannot return one).
    error: Option<std::io::Error>,
    tokens: usize,
    buf: Vec<u8>,
}

impl Inner {
    fn write(&mut self, bytes: &[u8]) {
        if self.error.is_some() {
            return;
        }
        if let Some(w) = &mut self.w {
            if let Err(e) = w.write_all(bytes) {
                self.error = Some(e);
            }
        }
    }
}

impl TraceWriter {
    pub fn create(path: &Path, header: &TraceHeader) -> Result<TraceWriter, TraceError> {
        let io = |source| TraceError::Io { path: path.into(), source };
        let mut out = sift_output::Output::create(path, &[]).map_err(|e| io(e.into()))?;
        let mut w = BufWriter::with_capacity(1 << 20, out.file().try_clone().map_err(io)?);
        let h = serde_json::to_vec(header).expect("header serializes");
        w.write_all(MAGIC).map_err(io)?;
        w.write_all(&(h.len() as u32).to_le_bytes()).map_err(io)?;
        w.write_all(&h).map_err(io)?;
        Ok(TraceWriter(Arc::new(Mutex::new(Inner {
            path: path.into(),
            w: Some(w),
            out: Some(out),
            dims: header.dims,
            error: None,
            tokens: 0,
            buf: Vec::new(),
        }))))
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Decoded tokens written so far.
    pub fn tokens(&self) -> usize {
        self.inner().tokens
    }

    /// Ends and flushes the file; reports the first write error. Returns the decoded tokens.
    pub fn finish(&self) -> Result<usize, TraceError> {
        let mut g = self.inner();
        g.write(&[EV_END]);
        let path = g.path.clone();
        let io = |source| TraceError::Io { path: path.clone(), source };
        if let Some(e) = g.error.take() {
            return Err(io(e));
        }
        if let Some(mut w) = g.w.take() {
            w.flush().map_err(io)?;
        }
        if let Some(out) = g.out.take() {
            out.commit().map_err(|e| io(e.into()))?;
        }
        Ok(g.tokens)
    }
}

impl Tracer for TraceWriter {
    fn prompt(&mut self, n: usize) {
        let mut b = vec![EV_PROMPT];
        b.extend_from_slice(&(n as u32).to_le_bytes());
        self.inner().write(&b);
    }

    fn token(&mut self, pos: usize) {
        let mut g = self.inner();
        g.tokens += 1;
        let mut b = vec![EV_TOKEN];
        b.extend_from_slice(&(pos as u32).to_le_bytes());
        g.write(&b);
    }

    fn reset(&mut self) {
        self.inner().write(&[EV_RESET]);
    }

    fn layer(&mut self, _layer: usize, residual: &[f32]) {
        let mut g = self.inner();
        let mut b = std::mem::take(&mut g.buf);
        b.clear();
        b.extend(residual.iter().flat_map(|v| v.to_le_bytes()));
        g.write(&b);
        g.buf = b;
    }

    fn site(&mut self, _layer: usize, site: Site, input: &[f32], active: Option<&[u32]>) {
        let mut g = self.inner();
        let dim = g.dims[site.index()];
        debug_assert_eq!(input.len(), dim);
        let mut b = std::mem::take(&mut g.buf);
        b.clear();
        b.push(active.is_some() as u8);
        b.extend(input.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()));
        if let Some(a) = active {
            let start = b.len();
            b.resize(start + dim.div_ceil(8), 0);
            for &u in a {
                b[start + u as usize / 8] |= 1 << (u % 8);
            }
        }
        g.write(&b);
        g.buf = b;
    }
}
