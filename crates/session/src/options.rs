//! The options a session is opened with, as flags: `--sparsity` and its refinements
//! ([`SparsityOptions`]), `--memory` and the tiered store's settings ([`MemoryOptions`]), and the
//! whole set with the model and engine settings ([`SessionOptions`]). The CLI flattens them into
//! its commands; the server receives a [`SessionOptions`].

use anyhow::Context;
use clap::Args;
use sift_engine::prefill::{PrefillMasks, PREFILL_BLOCK};
use sift_engine::sparsity::{
    build_selector_with_norms, Calibration, ColumnNorms, Method, Ratios, Selector, SparsityConfig,
};
use sift_engine::{Engine, EngineOptions};
use sift_store::cache::Policy;
use sift_store::io::TierKind;
use sift_store::tiered::{CacheSplit, TieredOptions, BUDGET_MAX_BATCH};
use std::path::PathBuf;

/// Everything [`Session::open`](crate::Session::open) needs.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// The model: a `.gguf`, or a `.sift` pack (needed by `--memory` and the column kernels).
    pub model: PathBuf,
    /// Threads, context, batch. The sparsity flags set `sparse_head`, `column_kernels` and
    /// `all_columns`, and a memory budget caps `n_batch`, when the session opens.
    pub engine: EngineOptions,
    pub sparsity: SparsityOptions,
    pub memory: MemoryOptions,
}

impl SessionOptions {
    /// The engine options the session runs with: `engine` with the sparsity flags' kernel
    /// choices applied and the prompt batch capped under a budget.
    pub fn engine_options(&self) -> EngineOptions {
        let mut eo = self.engine.clone();
        eo.sparse_head = self.sparsity.sparse_head;
        eo.column_kernels = !self.sparsity.dense_kernels;
        eo.all_columns = self.sparsity.all_columns;
        eo.prefill_sparsity = self.sparsity.prefill_sparsity;
        eo.prefill_masks = self.sparsity.prefill_masks.unwrap_or_default();
        self.memory.adjust(&mut eo);
        if eo.prefill_sparsity > 0.0 && self.memory.enabled() {
            // A sparse block is one batch (its neurons are chosen for the block's tokens).
            eo.n_batch = self.engine.n_batch.min(PREFILL_BLOCK).max(eo.n_batch);
        }
        eo
    }

    /// The session options of a command's flags.
    ///
    /// With `--memory`, or a sparsity method on the column kernels (`--sparsity` other than
    /// dense, or `--sparsity-config`, without `--dense-kernels`), on a `.gguf`, the model becomes
    /// the pack built from it (once; see [`crate::autopack`]): its columns are what makes a sparse
    /// decode read less.
    pub fn from_flags(
        model: &std::path::Path,
        engine: EngineOptions,
        sparsity: &SparsityOptions,
        memory: &MemoryOptions,
    ) -> anyhow::Result<SessionOptions> {
        let sparse = sparsity.method.is_some_and(|m| m != Method::Dense) || sparsity.config.is_some();
        let columns = memory.memory.is_some() || (sparse && !sparsity.dense_kernels);
        anyhow::ensure!(
            memory.pack_dir.is_none() || columns,
            "--pack-dir says where the column file of --memory (or of a sparse decode on a .gguf) goes, and neither is asked for: add --memory BYTES, or drop --pack-dir"
        );
        let model = if columns && model.exists() {
            crate::autopack::column_file(model, memory.pack_dir.as_deref())?
        } else {
            model.to_path_buf()
        };
        Ok(SessionOptions { model, engine, sparsity: sparsity.clone(), memory: memory.clone() })
    }

    /// Refuses flags that would change the result but are not applied with the others given
    /// (a flag is applied, refused with what to do, or said to change nothing — never ignored
    /// silently): sparse prefill's refinements without `--prefill-sparsity`, a batch too small
    /// for its blocks, the hybrid decode's settings without `--gpu-policy`.
    pub fn check_flags(&self) -> anyhow::Result<()> {
        let sp = &self.sparsity;
        if sp.prefill_sparsity <= 0.0 {
            let given = [
                ("--prefill-predictor", sp.prefill_predictor.is_some()),
                ("--prefill-masks", sp.prefill_masks.is_some()),
                ("--prefill-compensator", sp.prefill_compensator.is_some()),
                ("--prefill-schedule uniform", sp.prefill_schedule != "layerwise"),
                ("--prefill-down columns", sp.prefill_down != "copy"),
            ];
            if let Some((flag, _)) = given.iter().find(|(_, g)| *g) {
                anyhow::bail!(
                    "{flag} sets how sparse prefill runs, which is off: add --prefill-sparsity R (the share of FFN neurons a prompt block skips), or drop {flag}"
                );
            }
        } else {
            let b = self.engine_options().n_batch;
            anyhow::ensure!(
                b >= PREFILL_BLOCK,
                "--prefill-sparsity reads prompts in blocks of {PREFILL_BLOCK} tokens, one batch each: -b {b} holds less than a block; use -b {PREFILL_BLOCK} or more"
            );
        }
        let gpu = &self.memory.gpu;
        if gpu.gpu_policy.is_none() {
            if gpu.gpu_attention != sift_engine::hybrid::AttentionPlacement::Auto {
                anyhow::bail!(
                    "--gpu-attention places the hybrid decode's attention: it needs --gpu-policy POLICY with --gpu-memory BYTES (and a GPU), or drop it"
                );
            }
            if gpu.gpu_group_size.is_some() {
                anyhow::bail!("--gpu-group-size sizes the hybrid decode's unit groups: it needs --gpu-policy POLICY with --gpu-memory BYTES, or drop it");
            }
        }
        Ok(())
    }
}

#[derive(Args, Clone, Debug)]
pub struct SparsityOptions {
    /// Selection method: dense, topk, threshold, dip, dip-ca, glu, cats, cats-threshold, core,
    /// core-sim, wina, wina-threshold (default: dense; with --memory alone, the planner's choice)
    #[arg(long = "sparsity")]
    pub method: Option<Method>,
    /// Fraction of units skipped at each sparsified site (0 = dense)
    #[arg(long = "ratio", default_value_t = 0.5, value_parser = crate::ranges::skip_ratio)]
    pub ratio: f64,
    /// JSON file with per-site / per-layer ratio overrides (see docs/sparsity.md)
    #[arg(long = "sparsity-config")]
    pub config: Option<PathBuf>,
    /// Calibration file from `sift calibrate` (threshold, core-sim)
    #[arg(long = "calib")]
    pub calib: Option<PathBuf>,
    /// DIP-CA: penalty for units not in cache (Eq. 10)
    #[arg(long = "gamma", default_value_t = 0.2, value_parser = crate::ranges::weight_f32)]
    pub gamma: f32,
    /// DIP-CA: cache size as a fraction of each site's units (default: 1 - ratio)
    #[arg(long = "cache-frac", value_parser = crate::ranges::fraction_f32)]
    pub cache_frac: Option<f32>,
    /// core: token-wise fraction of positive activations that are core (SparseInfer's alpha)
    #[arg(long = "alpha", default_value_t = 0.4, value_parser = crate::ranges::fraction_f32)]
    pub alpha: f32,
    /// core: rank neurons by |GLU| instead of positive GLU values (SwiGLU adaptation)
    #[arg(long = "core-magnitude")]
    pub core_magnitude: bool,
    /// Fraction of the output head's input channels skipped per token (magnitude Top-K)
    #[arg(long = "sparse-head", default_value_t = 0.0, value_parser = crate::ranges::skip_ratio_f32)]
    pub sparse_head: f32,
    /// With a .sift pack: decode sparse selections on the dense kernels with masked inputs instead
    /// of the column kernels (same results up to rounding; for comparisons)
    #[arg(long = "dense-kernels")]
    pub dense_kernels: bool,
    /// With a .sift pack: run every product of the seven linears on the re-quantized columns,
    /// prompts and dense selections too (measures what re-quantizing the columns costs)
    #[arg(long = "all-columns", conflicts_with = "dense_kernels")]
    pub all_columns: bool,
    /// FastForward's sparse prefill: share of FFN neurons skipped in the middle 128-token blocks
    /// of a prompt (the first and last blocks stay dense; 0 = dense prefill)
    #[arg(long = "prefill-sparsity", default_value_t = 0.0, value_parser = crate::ranges::skip_ratio_f32)]
    pub prefill_sparsity: f32,
    /// How sparse prefill chooses a block's neurons: predicted (the expert predictor `sift train
    /// prefill` made), oracle (the block's dense FFN's own top neurons: the quality ceiling),
    /// random (times the sparse FFN only: the speed ceiling); auto: predicted when the model has
    /// a predictor beside it, else oracle
    #[arg(long = "prefill-masks", default_value = "auto", value_parser = parse_prefill_masks)]
    pub prefill_masks: MaskChoice,
    /// The expert predictor's file (default: MODEL.prefill beside the model, or beside a pack's
    /// GGUF)
    #[arg(long = "prefill-predictor", value_name = "FILE")]
    pub prefill_predictor: Option<PathBuf>,
    /// The predictor file's error compensator on sparse blocks: auto (as `sift train prefill`
    /// decided on held-out text), on, off
    #[arg(long = "prefill-compensator", default_value = "auto", value_parser = parse_switch)]
    pub prefill_compensator: Switch,
    /// How the prefill sparsity is spread over layers: layerwise (FastForward's Algorithm 1 from
    /// the attention mass recorded in the predictor file, when it has one) or uniform
    #[arg(long = "prefill-schedule", default_value = "layerwise", value_parser = ["layerwise", "uniform"])]
    pub prefill_schedule: String,
    /// Where sparse prompt blocks read the chosen neurons' down-projection columns: copy (an 8-bit
    /// neuron-major copy of every ffn_down made at load, one byte per weight: ~2× faster than the
    /// pack's columns on AVX-512 VNNI, not made on other CPUs) or columns (the pack's, no memory)
    #[arg(long = "prefill-down", default_value = "copy", value_parser = ["copy", "columns"])]
    pub prefill_down: String,
    /// LoRA adapters (a GGUF LoRA, as llama.cpp's --lora; `sift train distill` makes them to
    /// recover what sparsity costs), added on each adapted op's masked input
    #[arg(long = "lora", value_name = "FILE")]
    pub lora: Option<PathBuf>,
}

/// `auto` (`None`), `on` or `off`. (An alias, so that clap takes the value as parsed.)
pub type Switch = Option<bool>;

fn parse_switch(s: &str) -> Result<Switch, String> {
    match s {
        "auto" => Ok(None),
        "on" => Ok(Some(true)),
        "off" => Ok(Some(false)),
        _ => Err(format!("'{s}': use auto, on or off")),
    }
}

/// `--prefill-masks`: a mask source, or `None` for auto. (An alias, so that clap takes the value
/// as parsed instead of treating the flag as optional.)
pub type MaskChoice = Option<PrefillMasks>;

fn parse_prefill_masks(s: &str) -> Result<MaskChoice, String> {
    match s {
        "auto" => Ok(None),
        "predicted" => Ok(Some(PrefillMasks::Predicted)),
        "oracle" => Ok(Some(PrefillMasks::Oracle)),
        "random" => Ok(Some(PrefillMasks::Random)),
        _ => Err(format!("unknown prefill mask source '{s}' (auto, predicted, oracle, random)")),
    }
}

impl SparsityOptions {
    /// The method asked for (dense when none was).
    pub fn method(&self) -> Method {
        self.method.unwrap_or(Method::Dense)
    }

    /// Checks the flags; errors name the flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            (0.0..1.0).contains(&self.sparse_head),
            "--sparse-head must be in [0, 1), got {}",
            self.sparse_head
        );
        anyhow::ensure!(
            (0.0..1.0).contains(&self.prefill_sparsity),
            "--prefill-sparsity must be in [0, 1), got {}",
            self.prefill_sparsity
        );
        if let Some(f) = self.cache_frac {
            anyhow::ensure!((0.0..=1.0).contains(&f), "--cache-frac must be in [0, 1], got {f}");
        }
        Ok(())
    }

    /// The config these flags describe for a model of `n_layer` layers.
    pub fn config(&self, n_layer: usize) -> anyhow::Result<SparsityConfig> {
        let method = self.method();
        let ratio = if method == Method::Dense { 0.0 } else { self.ratio };
        let mut ratios = Ratios::uniform(method, n_layer, ratio).context("--ratio")?;
        if let Some(p) = &self.config {
            let text = std::fs::read_to_string(p).with_context(|| format!("cannot read '{}'", p.display()))?;
            ratios.apply_overrides(method, &text).with_context(|| format!("in '{}'", p.display()))?;
        }
        Ok(SparsityConfig {
            method,
            ratios,
            gamma: self.gamma,
            cache_fraction: self.cache_frac,
            alpha: self.alpha,
            core_magnitude: self.core_magnitude,
        })
    }

    /// Flags for `method` at `ratio` with the other settings at their defaults.
    pub fn for_method(method: Method, ratio: f64, gamma: f32, calib: Option<PathBuf>) -> SparsityOptions {
        SparsityOptions {
            method: Some(method),
            ratio,
            config: None,
            calib,
            gamma,
            cache_frac: None,
            alpha: 0.4,
            core_magnitude: false,
            sparse_head: 0.0,
            dense_kernels: false,
            all_columns: false,
            prefill_sparsity: 0.0,
            prefill_masks: None,
            prefill_predictor: None,
            prefill_compensator: None,
            prefill_schedule: "layerwise".into(),
            prefill_down: "copy".into(),
            lora: None,
        }
    }

    /// The selector these flags describe, for `model`.
    pub fn selector(&self, model: &sift_model::Model) -> anyhow::Result<Box<dyn Selector>> {
        self.validate()?;
        let dims = sift_engine::sparsity::SiteDims::of(&model.config);
        let cfg = self.config(dims.n_layer)?;
        let calib = match &self.calib {
            Some(p) => Some(Calibration::load(p)?),
            None => None,
        };
        let norms = column_norms_if_needed(&cfg, calib.as_ref(), model)?;
        Ok(build_selector_with_norms(&cfg, dims, calib.as_ref(), norms)?)
    }

    /// Installs the selector on `engine`.
    pub fn apply(&self, engine: &mut Engine) -> anyhow::Result<()> {
        self.validate()?;
        let dims = engine.site_dims();
        let cfg = self.config(dims.n_layer)?;
        let calib = match &self.calib {
            Some(p) => Some(Calibration::load(p)?),
            None => None,
        };
        let norms = column_norms_if_needed(&cfg, calib.as_ref(), &engine.model)?;
        let sel = build_selector_with_norms(&cfg, dims, calib.as_ref(), norms)?;
        engine.set_selector(sel);
        Ok(())
    }
}

/// The weight columns' norms a weight-aware method needs, computed from `model` when the
/// calibration (if any) does not hold them (a second or so per GB of weights).
fn column_norms_if_needed(
    cfg: &SparsityConfig,
    calib: Option<&Calibration>,
    model: &sift_model::Model,
) -> anyhow::Result<Option<std::sync::Arc<ColumnNorms>>> {
    if !cfg.method.needs_column_norms() || calib.is_some_and(|c| c.column_norms.is_some()) {
        return Ok(None);
    }
    let norms = sift_engine::weight_norms::column_norms(model)?;
    Ok(Some(std::sync::Arc::new(norms)))
}

#[derive(Args, Clone, Debug)]
pub struct MemoryOptions {
    /// Hard memory budget: bytes (K/M/G suffixes, powers of 1024) or a percentage of the model
    /// size ("60%"). The columns are streamed from a sift pack (built once from a .gguf, see
    /// --pack-dir) and cached in what is left after the resident parts.
    #[arg(long = "memory", value_name = "BYTES|PERCENT")]
    pub memory: Option<String>,
    /// Where --memory on a .gguf builds (once) and finds its pack (default: next to the GGUF, or
    /// the user's cache folder when that is not writable)
    #[arg(long = "pack-dir", value_name = "DIR")]
    pub pack_dir: Option<PathBuf>,
    /// Cache policy of the column cache: lfu (context-level counts), lru, tam (temporal activation
    /// momentum), tam-adaptive (TAM whose λ follows each layer's stalls, from --tam-lambda),
    /// static (hot set from --calib pinned), none
    #[arg(
        long = "cache-policy",
        default_value = "lfu",
        value_parser = ["lfu", "lru", "tam", "tam-adaptive", "static", "none"]
    )]
    pub cache_policy: String,
    /// Layers per cross-layer preload group (0: read misses on demand only; 1: next layer only;
    /// default: the planner's choice)
    #[arg(long = "preload", value_parser = crate::ranges::count_in::<0, 4096>)]
    pub preload: Option<usize>,
    /// Slow tier: auto (io_uring, else pread), io_uring, pread, memory (whole pack in RAM; tests)
    #[arg(long = "io", default_value = "auto", value_parser = ["auto", "io_uring", "pread", "memory"])]
    pub io: String,
    /// TAM decay λ
    #[arg(long = "tam-lambda", default_value_t = sift_store::cache::TAM_DEFAULT_LAMBDA, value_parser = crate::ranges::skip_ratio_f32)]
    pub tam_lambda: f32,
    /// TAM admission margin ε (threshold (1 − λ) + ε)
    #[arg(long = "tam-eps", default_value_t = sift_store::cache::TAM_DEFAULT_EPS, value_parser = crate::ranges::fraction_f32)]
    pub tam_eps: f32,
    /// Keep the token-embedding table in memory (default: one row read from disk per token)
    #[arg(long = "resident-embd")]
    pub resident_embd: bool,
    /// How cache slots are shared among ops: read-cost (small columns, which cost a whole 4 KiB
    /// read each, first) or uniform (the same fraction of every op)
    #[arg(long = "cache-split", default_value = "read-cost", value_parser = ["read-cost", "uniform"])]
    pub cache_split: String,
    /// Map the weights from the file (the default, as llama.cpp)
    #[arg(long = "mmap", overrides_with = "no_mmap")]
    pub mmap: bool,
    /// Without --memory: copy the weights into memory backed by huge pages instead of mapping
    /// the file (llama.cpp's --no-mmap). The load reads the whole file; the whole embedding table
    /// is then resident (+80-106 MiB peak on Qwen2.5); decode measured from -4 to +15 % on the
    /// development VM (docs/benchmarks.md)
    #[arg(long = "no-mmap", overrides_with = "mmap")]
    pub no_mmap: bool,
    /// Without --memory: keep the weights' own layout instead of repacking them at load into
    /// interleaved row groups for the group kernels (llama.cpp's --no-repack): Q4_K 16 rows with
    /// AVX-512 VNNI (else 8), Q5_0 16 rows with AVX2 or AVX-512 VNNI. Same bytes; the repacked matrices are
    /// the process's own memory, the rest of a mapped file stays mapped
    #[arg(long = "no-repack")]
    pub no_repack: bool,
    /// Device profile the planner predicts with: a file from `sift probe -o`, or a builtin name
    /// (default: $SIFT_PROFILE, else the builtin profile of sift's development machine)
    #[arg(long = "profile")]
    pub profile: Option<String>,
    /// Highest sparsity the planner may choose when --sparsity is not given
    #[arg(long = "max-ratio", default_value_t = DEFAULT_MAX_RATIO, value_parser = crate::ranges::skip_ratio)]
    pub max_ratio: f64,
    /// A file holding the budget (e.g. "500M" or "40%"): rewrite it (or send SIGUSR1) to change
    /// the budget of the running session
    #[arg(long = "budget-file", value_name = "FILE")]
    pub budget_file: Option<std::path::PathBuf>,
    /// Follow Linux memory pressure (PSI): shrink the budget under pressure, grow it back after
    #[arg(long = "follow-pressure")]
    pub follow_pressure: bool,
    #[command(flatten)]
    pub gpu: GpuOptions,
    /// Sequences decoded together (a server's `-np`), which the planner plans the cache for
    /// (not a flag here: `sift serve -np N` sets it).
    #[arg(skip = 1usize)]
    pub sequences: usize,
}

/// The CUDA tier's flags, as llama.cpp names them (a build with `--features cuda`).
#[derive(Args, Clone, Debug, Default)]
pub struct GpuOptions {
    /// Layers to hold on the GPU, counted as llama.cpp counts them: the last N transformer
    /// layers, and the output head when N exceeds their number (99: all) (-ngl)
    #[arg(long = "gpu-layers", alias = "n-gpu-layers", value_name = "N", value_parser = crate::ranges::count_in::<0, 65536>)]
    pub gpu_layers: Option<usize>,
    /// GPU memory for weights: bytes (K/M/G) or a percentage of the model's weight matrices
    /// ("50%"); the most layers that fit go to the GPU, in -ngl's order
    #[arg(long = "gpu-memory", value_name = "BYTES|PERCENT", conflicts_with = "gpu_layers")]
    pub gpu_memory: Option<String>,
    /// The GPU to use (-mg)
    #[arg(long = "main-gpu", default_value_t = 0, value_name = "I", value_parser = crate::ranges::count_in::<0, 255>)]
    pub main_gpu: usize,
    /// Hybrid decode (KAIROX): the GPU holds groups of the FFN's sparse units within
    /// --gpu-memory and computes the active ones among them while the CPU computes the rest;
    /// how the groups follow the activations: static, eager, lru, tam, tam-adaptive (needs a
    /// .sift pack and a sparsity selector)
    #[arg(long = "gpu-policy", value_name = "POLICY", requires = "gpu_memory", value_parser = parse_gpu_policy)]
    pub gpu_policy: Option<sift_engine::balancer::BalancePolicy>,
    /// Units per group of the hybrid decode (one transfer); default: per site, from the GPU's
    /// measured transfer curve (the smallest transfer reaching 80 % of its best bandwidth)
    #[arg(long = "gpu-group-size", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub gpu_group_size: Option<u32>,
    /// Where the hybrid decode runs attention: auto (on the GPU when every layer's attention and
    /// its KV cache for the context fit --gpu-memory, KAIROX's placement; the FFN's groups get
    /// the rest), on (or an error), off (on the CPU)
    #[arg(long = "gpu-attention", value_name = "auto|on|off", default_value = "auto", value_parser = parse_gpu_attention)]
    pub gpu_attention: sift_engine::hybrid::AttentionPlacement,
}

fn parse_gpu_attention(s: &str) -> Result<sift_engine::hybrid::AttentionPlacement, String> {
    use sift_engine::hybrid::AttentionPlacement;
    AttentionPlacement::parse(s)
        .ok_or_else(|| format!("unknown --gpu-attention '{s}': use one of {}", AttentionPlacement::NAMES.join(", ")))
}

fn parse_gpu_policy(s: &str) -> Result<sift_engine::balancer::BalancePolicy, String> {
    use sift_engine::balancer::BalancePolicy;
    BalancePolicy::parse(s)
        .ok_or_else(|| format!("unknown GPU policy '{s}': use one of {}", BalancePolicy::NAMES.join(", ")))
}

impl GpuOptions {
    /// Whether any GPU flag asks for the GPU.
    pub fn requested(&self) -> bool {
        self.gpu_layers.is_some_and(|n| n > 0) || self.gpu_memory.is_some()
    }
}

/// The planner's default accuracy limit: Top-K above 0.6 costs more quality than the speed is
/// worth on the models measured (docs/sparsity.md).
pub const DEFAULT_MAX_RATIO: f64 = 0.6;

impl MemoryOptions {
    pub fn enabled(&self) -> bool {
        self.memory.is_some()
    }

    /// The tiered store's options these flags describe (the preload group: 4 unless given).
    pub fn tiered_options(&self) -> anyhow::Result<TieredOptions> {
        let policy = match Policy::parse(&self.cache_policy) {
            Some(Policy::Tam { .. }) => Policy::Tam { lambda: self.tam_lambda, eps: self.tam_eps },
            Some(Policy::AdaptiveTam { .. }) => Policy::AdaptiveTam { lambda: self.tam_lambda, eps: self.tam_eps },
            Some(p) => p,
            None => anyhow::bail!(
                "unknown --cache-policy '{}': use lfu, lru, tam, tam-adaptive, static, belady or none",
                self.cache_policy
            ),
        };
        anyhow::ensure!(
            (0.0..1.0).contains(&self.tam_lambda) && self.tam_eps >= 0.0,
            "--tam-lambda must be in [0, 1) and --tam-eps at least 0"
        );
        let tier = TierKind::parse(&self.io).with_context(|| format!("unknown --io '{}'", self.io))?;
        Ok(TieredOptions {
            policy,
            preload: self.preload.unwrap_or(4),
            tier,
            resident_embeddings: self.resident_embd,
            split: CacheSplit::parse(&self.cache_split)
                .with_context(|| format!("unknown --cache-split '{}'", self.cache_split))?,
            ..TieredOptions::default()
        })
    }

    /// Clamps engine options a budget affects (the prompt batch).
    pub fn adjust(&self, eo: &mut EngineOptions) {
        if self.enabled() {
            eo.n_batch = eo.n_batch.min(BUDGET_MAX_BATCH);
        }
    }
}

/// The session flags alone: their defaults, as the command line gives them when none is passed,
/// and flags given as text (`crate::engine_costs`' calibration runs).
#[derive(clap::Parser)]
pub(crate) struct Defaults {
    #[command(flatten)]
    pub(crate) sparsity: SparsityOptions,
    #[command(flatten)]
    pub(crate) memory: MemoryOptions,
}

impl Default for SparsityOptions {
    fn default() -> Self {
        <Defaults as clap::Parser>::parse_from(["sift"]).sparsity
    }
}

impl Default for MemoryOptions {
    /// No budget; the other settings at their flags' defaults.
    fn default() -> Self {
        <Defaults as clap::Parser>::parse_from(["sift"]).memory
    }
}
