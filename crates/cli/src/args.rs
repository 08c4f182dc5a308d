//! Command-line arguments shared by the subcommands, named as llama.cpp names them (`-m`, `-p`, `-n`, `-c`, `-t`, `-s`, ...).

use clap::Args;
use sift_engine::{EngineOptions, GenerateOptions, KvType, SamplerOptions};
use std::path::PathBuf;

/// The default model, fetched by `scripts/fetch-model.sh`.
pub const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// Most threads `-t` accepts (the pool starts that many; more is a typo, not a machine).
pub const MAX_THREADS: usize = 1024;
/// Largest prompt batch `-b` accepts (a batch's activations are allocated up front).
pub const MAX_BATCH: usize = 1 << 20;

/// `-t`: a thread count in `1..=MAX_THREADS`, with an error naming the range otherwise.
pub(crate) fn threads_in_range(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|e| format!("'{s}' is not a thread count: {e}"))?;
    if (1..=MAX_THREADS).contains(&n) {
        Ok(n)
    } else {
        Err(format!("{n} threads: use 1 to {MAX_THREADS}"))
    }
}

/// `-b`: a batch size in `1..=MAX_BATCH`.
fn batch_in_range(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|e| format!("'{s}' is not a batch size: {e}"))?;
    if (1..=MAX_BATCH).contains(&n) {
        Ok(n)
    } else {
        Err(format!("batch size {n}: use 1 to {MAX_BATCH} tokens"))
    }
}

#[derive(Args, Clone)]
pub struct ModelArgs {
    /// Model file (.gguf)
    #[arg(short = 'm', long = "model", default_value = DEFAULT_MODEL)]
    pub model: PathBuf,
    /// Threads to compute with (default: all cores)
    #[arg(short = 't', long = "threads", value_parser = threads_in_range)]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub threading: ThreadingArgs,
    /// Context size in tokens (0 = the model's training context)
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096, value_parser = sift_session::ranges::ctx_size)]
    pub ctx_size: usize,
    /// Tokens per forward batch while reading a prompt
    #[arg(short = 'b', long = "batch-size", default_value_t = 512, value_parser = batch_in_range)]
    pub batch_size: usize,
    #[command(flatten)]
    pub kv: KvCacheArgs,
}

/// llama.cpp's other threading flags: `-tb` (threads for prompt batches) and `--poll`.
#[derive(Args, Clone, Copy, Debug)]
pub struct ThreadingArgs {
    /// Threads for prompt batches (-tb; default: the same as --threads)
    #[arg(long = "threads-batch", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads_batch: Option<u16>,
    /// How long idle threads poll for work before they sleep, 0-100 (0: sleep at once, which
    /// leaves a busy machine's cores to the other processes)
    #[arg(long = "poll", default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub poll: u8,
}

impl ThreadingArgs {
    /// `eo` with these settings.
    pub fn apply(&self, eo: EngineOptions) -> EngineOptions {
        EngineOptions { n_threads_batch: self.threads_batch.map_or(0, usize::from), poll: self.poll, ..eo }
    }
}

/// Storage types of the KV cache, as llama.cpp names them (`-ctk` / `-ctv` are accepted too).
#[derive(Args, Clone, Copy, Debug)]
pub struct KvCacheArgs {
    /// KV cache type for K: f16, q8_0 or f32 (-ctk)
    #[arg(long = "cache-type-k", default_value = "f16", value_parser = KvType::parse)]
    pub k: KvType,
    /// KV cache type for V: f16, q8_0 or f32 (-ctv)
    #[arg(long = "cache-type-v", default_value = "f16", value_parser = KvType::parse)]
    pub v: KvType,
}

impl KvCacheArgs {
    /// `eo` with these cache types.
    pub fn apply(&self, eo: EngineOptions) -> EngineOptions {
        EngineOptions { cache_type_k: self.k, cache_type_v: self.v, ..eo }
    }
}

/// llama.cpp's multi-letter short flags, spelled as sift's long ones: `-ctk X` is
/// `--cache-type-k X`, `-ctv X` is `--cache-type-v X`, `-tb N` is `--threads-batch N`, `-ngl N` is
/// `--gpu-layers N`, `-mg I` is `--main-gpu I`, `-np N` is `--parallel N`, `-ub N` is
/// `--ubatch-size N` (also with `=X`).
pub fn llama_spellings(args: impl IntoIterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    const SPELLINGS: [(&str, &str); 7] = [
        ("-ctk", "--cache-type-k"),
        ("-ctv", "--cache-type-v"),
        ("-tb", "--threads-batch"),
        ("-ngl", "--gpu-layers"),
        ("-mg", "--main-gpu"),
        ("-np", "--parallel"),
        ("-ub", "--ubatch-size"),
    ];
    args.into_iter()
        .map(|a| {
            let Some(s) = a.to_str() else { return a };
            for (short, long) in SPELLINGS {
                if s == short {
                    return long.into();
                }
                if let Some(v) = s.strip_prefix(short).and_then(|r| r.strip_prefix('=')) {
                    return format!("{long}={v}").into();
                }
            }
            a
        })
        .collect()
}

impl ModelArgs {
    pub fn engine_options(&self) -> EngineOptions {
        self.threading.apply(self.kv.apply(EngineOptions {
            n_threads: self.threads.unwrap_or_else(sift_engine::default_threads).max(1),
            n_ctx: self.ctx_size,
            n_batch: self.batch_size.max(1),
            sparse_head: 0.0,
            column_kernels: true,
            all_columns: false,
            ..Default::default()
        }))
    }
}

#[derive(Args, Clone)]
pub struct SamplingArgs {
    /// Tokens to generate (-1 = until end of text or a full context)
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    pub n_predict: i64,
    /// Temperature (0 = greedy)
    #[arg(long = "temp", default_value_t = 0.8, allow_negative_numbers = true, value_parser = sift_session::ranges::signed_weight_f32)]
    pub temp: f32,
    /// Top-k sampling (0 = off)
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Top-p sampling (1.0 = off)
    #[arg(long = "top-p", default_value_t = 0.95, value_parser = sift_session::ranges::fraction_f32)]
    pub top_p: f32,
    /// Min-p sampling (0.0 = off)
    #[arg(long = "min-p", default_value_t = 0.05, value_parser = sift_session::ranges::fraction_f32)]
    pub min_p: f32,
    /// Penalty for repeating recent tokens (1.0 = off)
    #[arg(long = "repeat-penalty", default_value_t = 1.0, value_parser = sift_session::ranges::positive_weight_f32)]
    pub repeat_penalty: f32,
    /// Subtracted from the logit of every token in the last --repeat-last-n (0.0 = off)
    #[arg(long = "presence-penalty", default_value_t = 0.0, allow_negative_numbers = true, value_parser = sift_session::ranges::signed_weight_f32)]
    pub presence_penalty: f32,
    /// Subtracted from a recent token's logit once per occurrence (0.0 = off)
    #[arg(long = "frequency-penalty", default_value_t = 0.0, allow_negative_numbers = true, value_parser = sift_session::ranges::signed_weight_f32)]
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties consider
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Random seed (-1 = random)
    #[arg(short = 's', long = "seed", default_value_t = -1, allow_negative_numbers = true)]
    pub seed: i64,
    /// Stop when this text appears (repeatable)
    #[arg(short = 'r', long = "reverse-prompt")]
    pub stop: Vec<String>,
    /// Keep generating after the end-of-text token
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,
}

impl SamplingArgs {
    pub fn generate_options(&self) -> anyhow::Result<GenerateOptions> {
        anyhow::ensure!(self.temp.is_finite(), "--temp must be a number");
        anyhow::ensure!((0.0..=1.0).contains(&self.top_p), "--top-p must be between 0 and 1, got {}", self.top_p);
        anyhow::ensure!((0.0..=1.0).contains(&self.min_p), "--min-p must be between 0 and 1, got {}", self.min_p);
        anyhow::ensure!(self.repeat_penalty > 0.0, "--repeat-penalty must be positive, got {}", self.repeat_penalty);
        for (flag, v) in
            [("--presence-penalty", self.presence_penalty), ("--frequency-penalty", self.frequency_penalty)]
        {
            anyhow::ensure!(v.is_finite() && (-2.0..=2.0).contains(&v), "{flag} must be between -2 and 2, got {v}");
        }
        Ok(GenerateOptions {
            n_predict: usize::try_from(self.n_predict).ok(),
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
            sampler: SamplerOptions {
                temp: self.temp,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                repeat_penalty: self.repeat_penalty,
                presence_penalty: self.presence_penalty,
                frequency_penalty: self.frequency_penalty,
                repeat_last_n: self.repeat_last_n,
                seed: u64::try_from(self.seed).ok(),
            },
        })
    }
}

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub sparsity: sift_session::SparsityOptions,
    #[command(flatten)]
    pub memory: sift_session::MemoryOptions,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Prompt text
    #[arg(short = 'p', long = "prompt", conflicts_with = "file")]
    pub prompt: Option<String>,
    /// Read the prompt from a file
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Do not echo the prompt before the generated text
    #[arg(long = "no-display-prompt")]
    pub no_display_prompt: bool,
    /// Wrap the prompt as one user turn with the model's chat template
    #[arg(long = "chat-template")]
    pub chat: bool,
    /// Under --memory: also report the decode against its bound (must-read bytes at the disk's
    /// best bandwidth, read amplification, hit rate by bytes; see docs/simulator.md)
    #[arg(short = 'v', long = "verbose")]
    pub verbose: bool,
}

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub sparsity: sift_session::SparsityOptions,
    #[command(flatten)]
    pub memory: sift_session::MemoryOptions,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// System prompt
    #[arg(long = "system-prompt", visible_alias = "sys")]
    pub system: Option<String>,
}

#[derive(Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub sparsity: sift_session::SparsityOptions,
    #[command(flatten)]
    pub memory: sift_session::MemoryOptions,
    #[command(flatten)]
    pub kv: KvCacheArgs,
    /// Model file (.gguf)
    #[arg(short = 'm', long = "model", default_value = DEFAULT_MODEL)]
    pub model: PathBuf,
    /// Text file to score
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Window size in tokens
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512, value_parser = sift_session::ranges::ctx_size)]
    pub ctx_size: usize,
    /// Score at most this many windows (-1 = all)
    #[arg(long = "chunks", default_value_t = -1, allow_negative_numbers = true)]
    pub chunks: i64,
    /// Score the last N tokens of each window, after a prompt of the rest (sparse prefill applies
    /// to the prompt only; FastForward's protocol: -c 2304 --score-last 256). Default: the second
    /// half, as llama-perplexity
    #[arg(long = "score-last")]
    pub score_last: Option<usize>,
    /// Threads to compute with (default: all cores)
    #[arg(short = 't', long = "threads", value_parser = threads_in_range)]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub threading: ThreadingArgs,
    /// Tokens per forward batch
    #[arg(short = 'b', long = "batch-size", default_value_t = 512, value_parser = batch_in_range)]
    pub batch_size: usize,
}

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub sparsity: sift_session::SparsityOptions,
    #[command(flatten)]
    pub memory: sift_session::MemoryOptions,
    #[command(flatten)]
    pub kv: KvCacheArgs,
    /// Model file (.gguf)
    #[arg(short = 'm', long = "model", default_value = DEFAULT_MODEL)]
    pub model: PathBuf,
    /// Threads (comma-separated list allowed)
    #[arg(short = 't', long = "threads", value_delimiter = ',', value_parser = threads_in_range)]
    pub threads: Vec<usize>,
    /// How long idle threads poll for work before they sleep, 0-100 (as llama-bench's --poll)
    #[arg(long = "poll", default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub poll: u8,
    /// Prompt lengths to test (comma-separated; 0 skips the pp test)
    #[arg(short = 'p', long = "n-prompt", value_delimiter = ',', default_value = "512", value_parser = sift_session::ranges::ctx_size)]
    pub n_prompt: Vec<usize>,
    /// Generation lengths to test (comma-separated; 0 skips the tg test)
    #[arg(short = 'n', long = "n-gen", value_delimiter = ',', default_value = "128", value_parser = sift_session::ranges::ctx_size)]
    pub n_gen: Vec<usize>,
    /// Tokens of context before each test (comma-separated, as llama-bench's -d: every test runs
    /// at every depth; the context is filled once per test, not timed)
    #[arg(short = 'd', long = "n-depth", value_delimiter = ',', default_value = "0", value_parser = sift_session::ranges::ctx_size)]
    pub n_depth: Vec<usize>,
    /// Repetitions of each test
    #[arg(short = 'r', long = "repetitions", default_value_t = 5, value_parser = sift_session::ranges::count_in::<1, 1000>)]
    pub reps: usize,
    /// Batch size for prompt processing
    #[arg(short = 'b', long = "batch-size", default_value_t = 512, value_parser = batch_in_range)]
    pub batch_size: usize,
    /// Output format: md or json
    #[arg(short = 'o', long = "output", default_value = "md", value_parser = ["md", "json"])]
    pub output: String,
}

#[derive(Args)]
pub struct InspectArgs {
    /// Model file (.gguf)
    pub model: PathBuf,
    /// Print every element of long arrays (tokens, merges)
    #[arg(long)]
    pub full: bool,
}

#[derive(Args)]
pub struct SweepArgs {
    /// Model file (.gguf)
    #[arg(short = 'm', long = "model", default_value = DEFAULT_MODEL)]
    pub model: PathBuf,
    /// Text file for perplexity
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Perplexity window in tokens
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512, value_parser = sift_session::ranges::ctx_size)]
    pub ctx_size: usize,
    /// Perplexity windows per run
    #[arg(long = "chunks", default_value_t = 40, value_parser = sift_session::ranges::count_in::<1, { 1 << 24 }>)]
    pub chunks: usize,
    /// Methods to sweep (comma-separated)
    #[arg(long = "methods", value_delimiter = ',', default_value = "topk,dip,dip-ca,glu,core")]
    pub methods: Vec<sift_engine::sparsity::Method>,
    /// Ratios to sweep (comma-separated; 0 runs dense once)
    #[arg(long = "ratios", value_delimiter = ',', default_value = "0,0.3,0.4,0.5,0.6,0.7", value_parser = sift_session::ranges::skip_ratio)]
    pub ratios: Vec<f64>,
    /// Calibration file (needed by threshold and core-sim)
    #[arg(long = "calib")]
    pub calib: Option<PathBuf>,
    /// DIP-CA's gamma
    #[arg(long = "gamma", default_value_t = 0.2, value_parser = sift_session::ranges::weight_f32)]
    pub gamma: f32,
    /// SparseInfer's alpha
    #[arg(long = "alpha", default_value_t = 0.4, value_parser = sift_session::ranges::fraction_f32)]
    pub alpha: f32,
    /// Decode steps timed per run (0 = skip the speed measurement)
    #[arg(long = "tg", default_value_t = 0, value_parser = sift_session::ranges::ctx_size)]
    pub tg: usize,
    /// Threads
    #[arg(short = 't', long = "threads", value_parser = threads_in_range)]
    pub threads: Option<usize>,
    /// Output directory for sweep.csv and the SVG plots
    #[arg(short = 'o', long = "out", default_value = "sweep-out")]
    pub out: PathBuf,
    /// With a .sift pack: time decoding on dense kernels with masked inputs
    #[arg(long = "dense-kernels")]
    pub dense_kernels: bool,
    /// Multiple-choice set to score per run (HellaSwag text or mc/ JSON lines)
    #[arg(long = "eval")]
    pub eval: Option<PathBuf>,
    /// Items of the eval set per run
    #[arg(long = "eval-limit", default_value_t = 200, value_parser = sift_session::ranges::count_in::<1, { 1 << 24 }>)]
    pub eval_limit: usize,
}

#[derive(Args)]
pub struct EvalArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sparsity: sift_session::SparsityOptions,
    /// Evaluation file: HellaSwag text (6 lines per task) or JSON lines (centerpiece, options, correct_options_idx)
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// File format (default: from the extension, then the content)
    #[arg(long = "format", value_parser = ["hellaswag", "mc"])]
    pub format: Option<String>,
    /// Prompt style: hellaswag, arc, openbookqa, winogrande, mmlu[-SUBJECT], generic (default: from config.yaml or the path)
    #[arg(long = "task")]
    pub task: Option<String>,
    /// Score at most this many items
    #[arg(long = "limit")]
    pub limit: Option<usize>,
    /// Few-shot examples before every item (lm-eval's num_fewshot; MMLU's is 5): the first N items
    /// of --shots-file
    #[arg(long = "shots", default_value_t = 0, value_parser = sift_session::ranges::count_in::<0, 64>)]
    pub shots: usize,
    /// The few-shot examples' file (default: dev.json beside --file, MMLU's layout)
    #[arg(long = "shots-file")]
    pub shots_file: Option<PathBuf>,
    /// Skip this many items first
    #[arg(long = "offset", default_value_t = 0)]
    pub offset: usize,
    /// Output format: text or json
    #[arg(short = 'o', long = "output", default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
}

#[derive(Args)]
pub struct CalibrateArgs {
    /// Model file (.gguf); also accepted as -m
    #[arg(value_name = "MODEL")]
    pub model_pos: Option<PathBuf>,
    #[arg(short = 'm', long = "model", conflicts_with = "model_pos")]
    pub model: Option<PathBuf>,
    /// Calibration text
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Overall ratios to allocate across sites (comma-separated)
    #[arg(long = "target", value_delimiter = ',', default_value = "0.3,0.4,0.5,0.6,0.7", value_parser = sift_session::ranges::skip_ratio_f32)]
    pub targets: Vec<f32>,
    /// Output calibration file (JSON)
    #[arg(short = 'o', long = "output")]
    pub out: PathBuf,
    /// Tokens to skip at the start of the text (keep calibration text apart from evaluation text)
    #[arg(long = "skip", default_value_t = 0, value_parser = sift_session::ranges::count_in::<0, { 1 << 32 }>)]
    pub skip: usize,
    /// Tokens for the activation histograms
    #[arg(long = "tokens", default_value_t = 8192, value_parser = sift_session::ranges::count_in::<1, { 1 << 24 }>)]
    pub n_tokens: usize,
    /// Window length for the histogram passes
    #[arg(long = "window", default_value_t = 512, value_parser = sift_session::ranges::count_in::<2, 65536>)]
    pub window: usize,
    /// Tokens the greedy allocation evaluates each layer on
    #[arg(long = "greedy-tokens", default_value_t = 256, value_parser = sift_session::ranges::count_in::<1, 65536>)]
    pub greedy_tokens: usize,
    /// Ratio increment per greedy step
    #[arg(long = "step", default_value_t = 0.05, value_parser = sift_session::ranges::step_f32)]
    pub step: f32,
    /// Core-neuron clusters for --sparsity core-sim (0 = none)
    #[arg(long = "clusters", default_value_t = 0, value_parser = sift_session::ranges::count_in::<0, 4096>)]
    pub clusters: usize,
    /// Passages clustered
    #[arg(long = "cluster-passages", default_value_t = 128, value_parser = sift_session::ranges::count_in::<1, 65536>)]
    pub cluster_passages: usize,
    /// Tokens per clustered passage
    #[arg(long = "cluster-len", default_value_t = 64, value_parser = sift_session::ranges::count_in::<2, 65536>)]
    pub cluster_len: usize,
    /// SparseInfer's alpha for the clusters
    #[arg(long = "alpha", default_value_t = 0.4, value_parser = sift_session::ranges::fraction_f32)]
    pub alpha: f32,
    /// Threads
    #[arg(short = 't', long = "threads", value_parser = threads_in_range)]
    pub threads: Option<usize>,
    /// Replace the output file if it exists (without it, an existing file is an error)
    #[arg(long = "force")]
    pub force: bool,
}

#[derive(Args)]
pub struct PackArgs {
    /// Source model (.gguf)
    #[arg(value_name = "MODEL")]
    pub model: PathBuf,
    /// Output pack (default: MODEL with extension .sift)
    #[arg(short = 'o', long = "output")]
    pub out: Option<PathBuf>,
    /// Column format: auto (the GGUF's own values, exact; float sources re-quantized to Q8_0),
    /// wide (the same, 5/6-bit sources stored one byte per value: faster sparse decoding from
    /// memory on CPUs without AVX-512 VNNI, more bytes to read under --memory), or re-quantize
    /// every op to Q4_1, Q5_0 or Q8_0 (lossy, for comparison)
    #[arg(long = "col-type", default_value = "auto")]
    pub col_type: String,
    /// Also write cross-layer interleaved records of N layers for preloading under --memory
    /// (a second copy of the q/k/v/gate/up columns; 0: none)
    #[arg(long, default_value_t = 0)]
    pub group: usize,
    /// Store each site's units in an order learnt from an activation trace of this model
    /// (`sift trace`) instead of the model's: see --grouping. Experimental (docs/benchmarks.md)
    #[arg(long = "unit-order", value_name = "TRACE")]
    pub unit_order: Option<PathBuf>,
    /// How --unit-order orders units: coactivation (a chain of units active on the same tokens,
    /// KAIROX §5), metis (the co-activation graph partitioned into groups by METIS; needs a build
    /// with `--features metis`) or frequency (hottest first, the baseline)
    #[arg(long = "grouping", default_value = "coactivation", value_parser = ["coactivation", "metis", "frequency"])]
    pub grouping: String,
    /// Units per group for --grouping metis
    #[arg(long = "group-units", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub group_units: u32,
    /// Also write neuron bundles (per FFN neuron its gate row, up row and down column in one
    /// record), which --sparsity cats then computes a token's chosen neurons from: a pack about a
    /// third larger, and so far slower than without (docs/benchmarks.md, issue 59 step 2)
    #[arg(long = "bundles")]
    pub bundles: bool,
    /// Replace the output file if it exists (without it, an existing file is an error)
    #[arg(long = "force")]
    pub force: bool,
}

/// `sift simulate`'s flags (`simulate.rs` maps them onto `sift_session::simulate::Simulation`).
#[derive(Args)]
pub struct SimulateArgs {
    /// Trace from `sift trace`
    #[arg(long = "trace")]
    pub trace: PathBuf,
    /// The pack the trace was recorded on
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// Device profile: a file from `sift probe -o`, or a builtin name (`sift probe --list`)
    #[arg(long = "profile")]
    pub profile: Option<String>,
    /// Memory budgets (bytes with K/M/G, or % of the model), comma-separated
    #[arg(long = "memory", value_delimiter = ',', required_unless_present = "gpu")]
    pub memory: Vec<String>,
    /// Simulate KAIROX's GPU–CPU hybrid decode instead, on this GPU profile: a file from
    /// `sift probe --gpu -o FILE`, or rtx3080ti-pcie3, rtx4090-pcie4: FFN neuron groups on the
    /// GPU under each --gpu-policy
    #[arg(long = "gpu", value_name = "PROFILE")]
    pub gpu: Option<String>,
    /// With --gpu: GPU memory budgets (bytes with K/M/G, or % of the model's matrices)
    #[arg(long = "gpu-memory", value_delimiter = ',', default_value = "25%,50%,75%")]
    pub gpu_memory: Vec<String>,
    /// With --gpu: balancing policies: static, eager, lru, tam, tam-adaptive, layers (llama.cpp's
    /// layer split), oracle (the bound)
    #[arg(
        long = "gpu-policy",
        value_delimiter = ',',
        default_value = "oracle,layers,static,eager,lru,tam,tam-adaptive"
    )]
    pub gpu_policy: Vec<String>,
    /// With --gpu: neurons per group (the unit of transfer); default 16, or with a profile that
    /// holds the engine's costs, the engine's own choice (from the transfer curve)
    #[arg(long = "group-size", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub group_size: Option<u32>,
    /// With --gpu and the engine's costs: where attention runs (auto, on, off; as
    /// --gpu-attention of generate)
    #[arg(long = "gpu-attention", value_name = "auto|on|off", default_value = "auto", value_parser = ["auto", "on", "off"])]
    pub gpu_attention: String,
    /// Cache policies, comma-separated: lfu, lru, tam, static, belady, none
    #[arg(long = "policy", value_delimiter = ',', default_value = "lfu")]
    pub policy: Vec<String>,
    /// Selections replayed, comma-separated: recorded (the trace's own choices, exact) or a
    /// method run on the recorded inputs (topk, dip, dip-ca, glu, threshold, ...)
    #[arg(long = "sparsity", value_delimiter = ',', default_value = "recorded")]
    pub sparsity: Vec<String>,
    /// Ratio for --sparsity METHOD
    #[arg(long = "ratio", default_value_t = 0.5, value_parser = sift_session::ranges::skip_ratio)]
    pub ratio: f64,
    /// DIP-CA penalty for units not in cache
    #[arg(long = "gamma", default_value_t = 0.2, value_parser = sift_session::ranges::weight_f32)]
    pub gamma: f32,
    /// Calibration file (threshold, core-sim; static's hot set — else ranked from the trace itself)
    #[arg(long = "calib")]
    pub calib: Option<PathBuf>,
    /// Layers per cross-layer preload group
    #[arg(long = "preload", default_value_t = 4, value_parser = sift_session::ranges::count_in::<0, 4096>)]
    pub preload: usize,
    /// Cache split among ops: read-cost or uniform
    #[arg(long = "cache-split", default_value = "read-cost", value_parser = ["read-cost", "uniform"])]
    pub cache_split: String,
    /// TAM decay λ and margin ε
    #[arg(long = "tam-lambda", default_value_t = sift_store::cache::TAM_DEFAULT_LAMBDA, value_parser = sift_session::ranges::skip_ratio_f32)]
    pub tam_lambda: f32,
    #[arg(long = "tam-eps", default_value_t = sift_store::cache::TAM_DEFAULT_EPS, value_parser = sift_session::ranges::fraction_f32)]
    pub tam_eps: f32,
    /// Override the runtime memory the trace recorded (bytes with K/M/G)
    #[arg(long = "runtime")]
    pub runtime: Option<String>,
    /// Override the context size the trace recorded (it sizes the KV cache in the plan)
    #[arg(short = 'c', long = "ctx-size", value_parser = sift_session::ranges::ctx_size)]
    pub ctx_size: Option<usize>,
    /// Write results.csv, hitrate.svg, tps.svg and reads.svg into this directory (with
    /// tam-adaptive: lambda-N.svg and loads-N.svg, λ and loads per token of run N)
    #[arg(long = "sweep")]
    pub sweep: Option<PathBuf>,
    /// Output format: md or json
    #[arg(short = 'o', long = "output", default_value = "md", value_parser = ["md", "json"])]
    pub output: String,
}
