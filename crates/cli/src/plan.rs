//! `sift plan`'s flags: what the planner would run a model with under a memory budget on a device
//! (sparsity, cross-layer group, cache size and the memory split, with the predicted decode
//! speed; `sift_session::planning`). `-o json` prints the settings and `predicted_tok_s`.

use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct PlanArgs {
    /// The model to plan for: a GGUF (its column file is built on first use, as `--memory` does)
    /// or a sift pack
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// Where a GGUF's column file goes (default: next to it, or the user's cache folder)
    #[arg(long = "pack-dir")]
    pub pack_dir: Option<PathBuf>,
    /// Memory budget: bytes (K/M/G) or a percentage of the model size
    #[arg(long = "memory")]
    pub memory: String,
    /// Device profile: a file from `sift probe -o` or a builtin name (default: $SIFT_PROFILE, else
    /// this machine's, probed on first use and kept in the user's cache folder)
    #[arg(long = "profile")]
    pub profile: Option<String>,
    /// Predict by simulating this trace (from `sift trace`; default: the planner's own, a short
    /// generation recorded once next to the column file)
    #[arg(long = "trace")]
    pub trace: Option<PathBuf>,
    /// Predict with the closed-form cost model instead of simulating a trace
    #[arg(long = "cost-model", conflicts_with = "trace")]
    pub cost_model: bool,
    /// Cache policy to plan for
    #[arg(long = "cache-policy", default_value = "lfu")]
    pub cache_policy: String,
    /// Highest sparsity the planner may choose
    #[arg(long = "max-ratio", default_value_t = sift_session::DEFAULT_MAX_RATIO, value_parser = sift_session::ranges::skip_ratio)]
    pub max_ratio: f64,
    /// Plan only the group size for this fixed sparsity ratio
    #[arg(long = "ratio", value_parser = sift_session::ranges::skip_ratio)]
    pub ratio: Option<f64>,
    /// Context size the run will use (KV cache)
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096, value_parser = sift_session::ranges::ctx_size)]
    pub ctx_size: usize,
    /// Sequences decoded together (a server's -np): the union of their active columns must fit
    /// the cache, and the prediction is their tokens per second together
    #[arg(long = "parallel", default_value_t = 1, value_parser = sift_session::ranges::count_in::<1, 256>)]
    pub parallel: usize,
    #[command(flatten)]
    pub kv: crate::args::KvCacheArgs,
    /// Output format: md or json
    #[arg(short = 'o', long = "output", default_value = "md", value_parser = ["md", "json"])]
    pub output: String,
}

pub fn run(a: PlanArgs) -> anyhow::Result<()> {
    sift_session::planning::PlanQuery {
        model: a.model,
        pack_dir: a.pack_dir,
        memory: a.memory,
        profile: a.profile,
        trace: a.trace,
        cost_model: a.cost_model,
        cache_policy: a.cache_policy,
        max_ratio: a.max_ratio,
        ratio: a.ratio,
        ctx_size: a.ctx_size,
        parallel: a.parallel,
        cache_type_k: a.kv.k,
        cache_type_v: a.kv.v,
        json: a.output == "json",
    }
    .run(&mut std::io::stdout().lock())
}
