//! Opening a session: the model and its tokenizer (under a budget only its resident parts, after
//! checking they fit), the engine with its selector, and under `--memory` the planner's settings,
//! the tiered store (with a static hot set pinned) and the live-budget sources.

use crate::budget::{mib, parse_budget, runtime_bytes};
use crate::live::{BudgetControl, ControlOptions};
use crate::machine::MachineProfile;
use crate::options::{GpuOptions, MemoryOptions, SessionOptions, SparsityOptions};
use crate::profile::machine_or_named;
use anyhow::Context;
use sift_engine::gpu::{GpuLayers, GpuPlacement};
use sift_engine::sparsity::{Method, Site, SiteDims};
use sift_engine::{BudgetChange, Engine, EngineOptions};
use sift_model::tokenizer::Tokenizer;
use sift_model::Model;
use sift_sim::planner::{self, PlanRequest};
use sift_sim::profile::DeviceProfile;
use sift_store::cache::Policy;
use sift_store::tiered::{open_budgeted_checked, resident_bytes, PlanInputs, TieredOptions, TieredStore};
use sift_store::OpKind;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A model ready to run with everything its options asked for.
pub struct Session {
    pub engine: Engine,
    /// Shared with whoever tokenizes beside the engine (the server's handlers).
    pub tok: Arc<Tokenizer>,
    /// The GGUF's size inside the file: what a budget given in percent is a percentage of.
    pub model_size: u64,
    /// What the planner chose, when it chose (one line for the user).
    pub planned: Option<String>,
    /// The live budget sources, when `--budget-file` or `--follow-pressure` asked for them.
    pub live: Option<LiveBudget>,
    /// Under `--memory`: the device profile the plan and the bound use (this machine's cached
    /// one unless `--profile` named another; [`crate::machine`]).
    pub profile: Option<MachineProfile>,
}

/// The watcher of `--budget-file` / `--follow-pressure` and the engine's handle.
pub struct LiveBudget {
    control: BudgetControl,
    handle: sift_engine::BudgetHandle,
}

impl LiveBudget {
    /// Passes a budget the sources ask for to the engine, which applies it before its next token.
    pub fn poll(&self) {
        if let Some(b) = self.control.take_change() {
            self.handle.request(b);
        }
    }
}

impl Session {
    /// Opens the model of `opts` and builds the engine as the options say.
    pub fn open(opts: &SessionOptions) -> anyhow::Result<Session> {
        let eo = opts.engine_options();
        let (model, tok) = load(&opts.model, &eo, &opts.memory)?;
        Session::build(model, Arc::new(tok), opts)
    }

    /// [`Session::open`] on a model and tokenizer already loaded (by [`load`]).
    pub fn build(model: Model, tok: Arc<Tokenizer>, opts: &SessionOptions) -> anyhow::Result<Session> {
        opts.sparsity.validate()?;
        opts.check_flags()?;
        let eo = opts.engine_options();
        let model_size = model.columns.as_ref().map_or(0, |p| p.gguf_len);
        let (engine, planned, profile) = build_engine(model, &opts.model, &eo, &opts.sparsity, &opts.memory)?;
        let mut session = Session { engine, tok, model_size, planned, live: None, profile };
        session.live = session.start_live(&opts.memory)?;
        Ok(session)
    }

    /// The same model with other options (threads, say): the engine is rebuilt around it.
    pub fn rebuild(self, opts: &SessionOptions) -> anyhow::Result<Session> {
        Session::build(self.engine.model, self.tok, opts)
    }

    /// Parses a budget as `--memory` does ("300M", "60%" of this model).
    pub fn parse_budget(&self, spec: &str) -> anyhow::Result<u64> {
        parse_budget(spec, self.model_size)
    }

    /// Between tokens: passes a budget the live sources ask for to the engine (applied before
    /// its next token) and returns the changes applied since the last call.
    pub fn poll(&mut self) -> Vec<BudgetChange> {
        if let Some(l) = &self.live {
            l.poll();
        }
        self.engine.take_budget_log()
    }

    /// Starts watching the budget file and memory pressure, if asked (needs a budget).
    fn start_live(&self, m: &MemoryOptions) -> anyhow::Result<Option<LiveBudget>> {
        if m.budget_file.is_none() && !m.follow_pressure {
            return Ok(None);
        }
        let store = self.engine.memory().context("--budget-file and --follow-pressure need --memory")?;
        let model_size = self.model_size;
        let control = BudgetControl::start(ControlOptions {
            initial: store.plan().budget,
            floor: store.plan().fixed(),
            control_file: m.budget_file.clone(),
            follow_pressure: m.follow_pressure,
            parse: Box::new(move |t| parse_budget(t, model_size).map_err(|e| e.to_string())),
        })
        .context("--follow-pressure needs Linux pressure stall information (PSI)")?;
        Ok(Some(LiveBudget { control, handle: self.engine.budget_handle() }))
    }
}

/// Loads the expert predictor sparse prefill uses: `--prefill-predictor`, else the side file
/// beside the model (or beside a pack's GGUF). With `--prefill-masks auto` a model without one
/// keeps the oracle masks; with `predicted` a missing or unusable one is an error. (Loaded before
/// a budget is planned: its memory is counted with the runtime's.)
fn load_prefill_predictor(
    model: &Model,
    path: &Path,
    sparsity: &SparsityOptions,
) -> anyhow::Result<Option<(PathBuf, sift_engine::predictor::ExpertPredictors)>> {
    use sift_engine::predictor::{default_path, ExpertPredictors};
    use sift_engine::prefill::PrefillMasks;
    let wanted = sparsity.prefill_masks;
    // Oracle or random masks use a file only when one is named or its compensator asked for.
    if sparsity.prefill_sparsity <= 0.0
        || !(matches!(wanted, None | Some(PrefillMasks::Predicted))
            || sparsity.prefill_predictor.is_some()
            || sparsity.prefill_compensator == Some(true))
    {
        return Ok(None);
    }
    let found = match &sparsity.prefill_predictor {
        Some(p) => Some(p.clone()),
        None => [default_path(path), default_path(model.file.path())].into_iter().find(|p| p.exists()),
    };
    let Some(file) = found else {
        anyhow::ensure!(
            sparsity.prefill_compensator != Some(true),
            "--prefill-compensator on: the error compensator is part of an expert predictor file, and there is none beside '{}'; train one with `sift train prefill -m {} -f TEXT` (its compensator by default) or pass --prefill-predictor FILE",
            path.display(),
            path.display()
        );
        anyhow::ensure!(
            wanted.is_none(),
            "--prefill-masks predicted: no expert predictor beside '{}'; train one with `sift train prefill -m {} -f TEXT` (or pass --prefill-predictor FILE)",
            path.display(),
            path.display()
        );
        return Ok(None);
    };
    let p = ExpertPredictors::load(&file, model)?;
    Ok(Some((file, p)))
}

/// Puts a predictor [`load_prefill_predictor`] found on the engine, with its compensator and
/// schedule as the flags say, and says so.
fn attach_prefill_predictor(
    engine: &mut Engine,
    loaded: Option<(PathBuf, sift_engine::predictor::ExpertPredictors)>,
    sparsity: &SparsityOptions,
) -> anyhow::Result<()> {
    use sift_engine::prefill::PrefillMasks;
    let Some((file, p)) = loaded else {
        return Ok(());
    };
    let wanted = sparsity.prefill_masks;
    anyhow::ensure!(
        sparsity.prefill_compensator != Some(true) || p.has_compensator(),
        "--prefill-compensator on: '{}' holds no error compensator (it was trained with --compensator-steps 0); train one with `sift train prefill`, or drop the flag",
        file.display()
    );
    let on = sparsity.prefill_compensator.unwrap_or(p.header.comp_on);
    engine.set_prefill_compensator(on);
    let why = match (sparsity.prefill_compensator, p.header.comp_check) {
        (Some(_), _) => " (--prefill-compensator)".to_string(),
        (None, Some((with, without))) => format!(" (held-out perplexity {with:.3} with it, {without:.3} without)"),
        (None, None) => String::new(),
    };
    let comp = match (p.has_compensator(), on) {
        (false, _) => String::new(),
        (true, true) => format!(
            "; its error compensator (r' = {}, {} steps) corrects sparse blocks{why}",
            p.header.comp_rank, p.header.comp_steps
        ),
        (true, false) => format!("; its error compensator is off{why}"),
    };
    let masks = wanted.unwrap_or(PrefillMasks::Predicted);
    let schedule = if sparsity.prefill_schedule == "layerwise" && !p.header.attn_mass.is_empty() {
        let keep = sift_engine::prefill::linear_schedule(&p.header.attn_mass, 1.0 - sparsity.prefill_sparsity);
        let (lo, hi) = keep.iter().fold((f32::MAX, f32::MIN), |(a, b), &k| (a.min(k), b.max(k)));
        let mean = keep.iter().map(|&k| k as f64).sum::<f64>() / keep.len().max(1) as f64;
        let line = format!(
            "; layerwise schedule: layers keep {:.0}% to {:.0}%, {:.1}% on average",
            100.0 * lo,
            100.0 * hi,
            100.0 * mean
        );
        engine.set_prefill_schedule(Some(keep));
        line
    } else {
        String::new()
    };
    let how = if masks == PrefillMasks::Predicted { "chooses neurons with" } else { "uses" };
    eprintln!(
        "sift: sparse prefill {how} the expert predictor '{}' ({} steps on {} blocks){comp}{schedule}",
        file.display(),
        p.header.steps,
        p.header.blocks
    );
    engine.set_prefill_predictor(Some(std::sync::Arc::new(p)));
    engine.set_prefill_masks(masks);
    Ok(())
}

/// Says so when a sparse run from memory reads a pack's 5- or 6-bit columns in the narrow layout
/// on a CPU that computes the wide one faster (`sift pack --col-type wide`; the narrow layout is
/// the default because it reads fewer bytes under `--memory`).
fn note_wide_columns(engine: &Engine, sparsity: &SparsityOptions, eo: &EngineOptions) {
    let sparse = sparsity.method.is_some_and(|m| m != sift_engine::sparsity::Method::Dense);
    let Some(cols) = engine.model.columns.as_ref().filter(|_| sparse && eo.column_kernels) else {
        return;
    };
    let narrow = |t: &sift_model::layout::ColumnTensor| match t.ty {
        sift_quant::ColFormat::Exact(f) => !f.is_wide() && sift_quant::ExactFormat::wide(f.src).is_some(),
        sift_quant::ColFormat::Requant(_) => false,
    };
    let n = cols
        .layers
        .iter()
        .flat_map(|l| sift_model::layout::OpKind::ALL.map(|op| narrow(l.op(op))))
        .filter(|&b| b)
        .count();
    if n > 0 && sift_quant::exact::wide_is_faster() {
        eprintln!(
            "sift: note: {n} of this pack's column tensors hold 5- or 6-bit values; on this CPU (no AVX-512 VNNI) a pack made with `sift pack --col-type wide` decodes them ~1.4x faster (about 10 % a token on Qwen2.5-1.5B), for more bytes read under --memory"
        );
    }
}

/// Makes the 8-bit copy of the down projections sparse prompt blocks read (`--prefill-down copy`,
/// with `--prefill-sparsity`).
fn attach_prefill_down(engine: &mut Engine, sparsity: &SparsityOptions) -> anyhow::Result<()> {
    if sparsity.prefill_sparsity <= 0.0 || sparsity.prefill_down != "copy" {
        return Ok(());
    }
    // The copy is an extra byte per weight: never where the machine cannot hold it (with room
    // to spare for the rest of the run).
    let need = sift_engine::prefill::DownCopy::bytes_for(&engine.model);
    if let Some(free) = crate::budget::available_bytes().filter(|&free| need > free / 2) {
        eprintln!(
            "sift: sparse prefill reads the pack's columns: the 8-bit copy of the down projections ({}) would take more than half of the {} this machine has available",
            mib(need),
            mib(free)
        );
        return Ok(());
    }
    let t = std::time::Instant::now();
    let bytes = engine.set_prefill_down_copy(true).context("--prefill-down copy")?;
    if bytes > 0 {
        eprintln!(
            "sift: sparse prefill reads down projections from an 8-bit neuron-major copy ({:.0} MiB, made in {:.1} s; --prefill-down columns uses the pack's columns instead)",
            bytes as f64 / (1 << 20) as f64,
            t.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// Puts the layers the GPU flags ask for on the GPU (nothing when none is given).
fn attach_gpu(engine: &mut Engine, gpu: &GpuOptions) -> anyhow::Result<()> {
    if !gpu.requested() {
        return Ok(());
    }
    let model = &engine.model;
    let n_layer = model.layers.len();
    if let Some(policy) = gpu.gpu_policy {
        let spec = gpu.gpu_memory.as_deref().expect("clap requires --gpu-memory with --gpu-policy");
        let all = GpuPlacement::from_layers(n_layer + 1, n_layer).bytes(model, 0);
        let gpu_bytes = parse_budget(spec, all).context("--gpu-memory")?;
        anyhow::ensure!(
            !engine.selector().is_dense(),
            "--gpu-policy splits the active units of a sparsity selector between the GPU and the CPU: add --sparsity (topk, threshold, ...) or use -ngl for dense layers"
        );
        let mut dev = sift_gpu::GpuDevice::open(gpu.main_gpu).context("cannot use the GPU (--gpu-policy)")?;
        let attention = sift_engine::gpu::attention_bytes(model, engine.n_ctx());
        let head = sift_engine::gpu::head_bytes(model);
        let dense = sift_engine::hybrid::place_attention(gpu.gpu_attention, attention, head, gpu_bytes)
            .map_err(|e| anyhow::anyhow!("--gpu-attention: {e}"))?;
        let o = sift_engine::hybrid::HybridOptions {
            policy,
            group_size: gpu.gpu_group_size.map(|g| g as usize),
            gpu_bytes: dense.group_bytes,
        };
        engine.attach_hybrid(&mut dev, &o).context("cannot set up hybrid decode")?;
        if let Some(h) = engine.hybrid_mut() {
            (h.attention_on_gpu, h.head_on_gpu) = (dense.attention, dense.attention && dense.head);
        }
        if dense.attention {
            let layers = GpuLayers::upload_attention(&engine.model, dev, engine.n_ctx(), dense.head)
                .context("cannot put the layers' attention on the GPU (--gpu-attention off runs it on the CPU)")?;
            eprintln!("sift: {}", layers.summary());
            engine.attach_gpu(layers);
        } else {
            eprintln!(
                "sift: attention on the CPU{}",
                if gpu.gpu_attention == sift_engine::hybrid::AttentionPlacement::Cpu {
                    String::new()
                } else {
                    format!(
                        " (with its KV cache for -c {} it takes {:.1} MiB, more than --gpu-memory's {:.1} MiB)",
                        engine.n_ctx(),
                        attention as f64 / (1 << 20) as f64,
                        gpu_bytes as f64 / (1 << 20) as f64
                    )
                }
            );
        }
        eprintln!("sift: {}", engine.hybrid().expect("attached").summary());
        return Ok(());
    }
    let placement = match (&gpu.gpu_memory, gpu.gpu_layers) {
        (Some(spec), _) => {
            // A percentage is of the model's matrices (what -ngl 99 puts on the GPU, KV aside).
            let all = GpuPlacement::from_layers(n_layer + 1, n_layer).bytes(model, 0);
            let budget = parse_budget(spec, all).context("--gpu-memory")?;
            GpuPlacement::fit(model, budget, engine.n_ctx())
        }
        (None, Some(n)) => GpuPlacement::from_layers(n, n_layer),
        (None, None) => unreachable!("requested() needs one"),
    };
    let dev = sift_gpu::GpuDevice::open(gpu.main_gpu).context("cannot use the GPU (--gpu-layers / --gpu-memory)")?;
    let layers =
        GpuLayers::upload(model, dev, placement, engine.n_ctx()).context("cannot put the model's layers on the GPU")?;
    eprintln!("sift: {}", layers.summary());
    engine.attach_gpu(layers);
    Ok(())
}

/// Loads a model and its tokenizer: in full without a budget (memory-mapped, or with
/// `--no-mmap` copied into huge-page-backed memory; either way Q4_K and Q5_0 matrices repacked, in the
/// process's own pages, unless `--no-repack`), else only its resident parts — after checking, before reading them, that they, the tokenizer and the KV
/// cache for `eo` fit the budget.
pub fn load(path: &Path, eo: &EngineOptions, memory: &MemoryOptions) -> anyhow::Result<(Model, Tokenizer)> {
    if !path.exists() {
        anyhow::bail!(
            "model file '{}' not found; fetch the default model with scripts/fetch-model.sh or pass -m PATH",
            path.display()
        );
    }
    let Some(spec) = &memory.memory else {
        let mut model =
            sift_store::open_model(path).with_context(|| format!("cannot load model '{}'", path.display()))?;
        if memory.no_mmap {
            model.load_into_memory(!memory.no_repack).with_context(|| {
                format!("cannot load the weights of '{}' into memory (drop --no-mmap)", path.display())
            })?;
        } else if !memory.no_repack {
            model.repack_mapped().with_context(|| {
                format!("cannot repack the weights of '{}' (--no-repack keeps their layout)", path.display())
            })?;
        }
        let tok = Tokenizer::from_gguf(&model.file.gguf)
            .with_context(|| format!("cannot build the tokenizer of '{}'", path.display()))?;
        drop_tokenizer_tables(&mut model);
        return Ok((model, tok));
    };
    let opts = memory.tiered_options()?;
    let model_size = sift_store::read_toc(path)?.map_or(0, |t| t.gguf_len());
    let budget = parse_budget(spec, model_size)?;
    let tok = std::cell::RefCell::new(None);
    let precheck = |g: &sift_gguf::Gguf, resident: u64| -> Result<(), String> {
        // The tokenizer first: it is part of the process the budget must hold.
        let t = Tokenizer::from_gguf(g).map_err(|e| format!("cannot build the tokenizer: {e}"))?;
        *tok.borrow_mut() = Some(t);
        let runtime = runtime_bytes(&[path], 0);
        let kv = sift_model::Config::from_gguf(g)
            .map(|c| Engine::kv_and_scratch_bytes_for(&c, eo))
            .map_err(|e| e.to_string())?;
        if runtime + resident + kv > budget {
            return Err(format!(
                "--memory {} is too small to run this model: the process with its tokenizer takes {}, the resident weights (output head, norms) {} and the KV cache and activations {} before any cache or buffer; raise --memory, or lower -c / -b",
                mib(budget),
                mib(runtime),
                mib(resident),
                mib(kv)
            ));
        }
        Ok(())
    };
    let mut model = open_budgeted_checked(path, &opts, precheck)
        .with_context(|| format!("cannot load model '{}'", path.display()))?;
    let tok = match tok.into_inner() {
        Some(t) => t,
        None => Tokenizer::from_gguf(&model.file.gguf)
            .with_context(|| format!("cannot build the tokenizer of '{}'", path.display()))?,
    };
    drop_tokenizer_tables(&mut model);
    Ok((model, tok))
}

/// Gives back the GGUF metadata's copies of the tables the tokenizer has built its own from
/// (vocabulary, token types, scores, merges), which nothing reads again: a few MB that a
/// budget would otherwise count twice.
pub fn drop_tokenizer_tables(model: &mut Model) {
    for key in Tokenizer::SOURCE_TABLES {
        model.file.gguf.take_metadata(key);
    }
    crate::budget::trim_heap();
}

/// The engine with the selector `sparsity` asks for, and under a budget the tiered store attached.
/// Settings not given (`--sparsity`, `--preload`) come from the planner; `static` pins the hot set
/// of the calibration file `--calib`. Returns the planner's line when it chose, and under a
/// budget the device profile (this machine's, probed on first use).
fn build_engine(
    model: Model,
    path: &Path,
    eo: &EngineOptions,
    sparsity: &SparsityOptions,
    memory: &MemoryOptions,
) -> anyhow::Result<(Engine, Option<String>, Option<MachineProfile>)> {
    for (flag, t) in [("--cache-type-k", eo.cache_type_k), ("--cache-type-v", eo.cache_type_v)] {
        t.check_head_dim(model.config.head_dim).map_err(|e| anyhow::anyhow!("{flag}: {e}"))?;
    }
    // Adapters first: under a budget the memory they take is counted with the runtime.
    let lora = match &sparsity.lora {
        Some(p) => {
            let l = sift_engine::lora::LoraAdapters::load(p, &model)?;
            if l.info.qat {
                eprintln!(
                    "sift: note: '{}' was trained quantization-aware, to be fused onto the weights' grid (`sift export-lora -m MODEL --lora FILE`, or the fused GGUF `sift train distill` wrote beside it); beside the weights it does not compute what was trained",
                    p.display()
                );
            }
            Some(std::sync::Arc::new(l))
        }
        None => None,
    };
    let predictor = load_prefill_predictor(&model, path, sparsity)?;
    let Some(spec) = &memory.memory else {
        let mut engine = Engine::new(model, eo);
        engine.set_lora(lora);
        sparsity.apply(&mut engine)?;
        attach_prefill_predictor(&mut engine, predictor, sparsity)?;
        attach_prefill_down(&mut engine, sparsity)?;
        attach_gpu(&mut engine, &memory.gpu)?;
        note_wide_columns(&engine, sparsity, eo);
        return Ok((engine, None, None));
    };
    anyhow::ensure!(
        !memory.gpu.requested(),
        "--gpu-layers / --gpu-memory with --memory: the GPU tier does not take weights from the budgeted store yet; drop one of them"
    );
    let mut opts = memory.tiered_options()?;
    let mut sparsity = sparsity.clone();
    let model_size = model.columns.as_ref().map_or(0, |p| p.gguf_len);
    let budget = parse_budget(spec, model_size)?;
    let runtime = runtime_bytes(&[path], resident_bytes(&model, opts.resident_embeddings));
    let inputs = PlanInputs { budget, runtime, kv_and_scratch: Engine::kv_and_scratch_bytes(&model, eo) };
    // The probe (first use only) runs before the cache exists: its buffers get half of what
    // the budget has left beside the resident parts.
    let free = budget.saturating_sub(inputs.runtime + inputs.kv_and_scratch);
    let profile =
        machine_or_named(memory.profile.as_deref(), path, eo.n_threads, Some((free / 2) as usize), &mut |l| {
            eprintln!("{l}")
        })?;
    let mut planned = None;
    if sparsity.method.is_none() || memory.preload.is_none() {
        planned = Some(plan(&model, path, &profile.profile, memory, &inputs, &mut opts, &mut sparsity)?);
    }
    let mut store = TieredStore::new(&model, path, &opts, &inputs)?;
    if opts.policy == Policy::Static {
        pin_hot_set(&model, &mut store, sparsity.calib.as_deref())?;
    }
    if let Some((file, p)) = &predictor {
        // Counted with the runtime (it was loaded before the runtime was measured): said, so
        // that a small cache or a KV cache that does not fit later is not a surprise.
        eprintln!(
            "sift: the expert predictor '{}' holds {} and sparse blocks' scratch {} of the {} budget; the column cache gets {}",
            file.display(),
            mib(p.bytes() as u64),
            mib(Engine::sparse_block_bytes(&model, eo)),
            mib(store.plan.budget),
            mib(store.plan.cache)
        );
    }
    let mut engine = Engine::new(model, eo);
    engine.set_lora(lora);
    engine.attach_store(store)?;
    sparsity.apply(&mut engine)?;
    attach_prefill_predictor(&mut engine, predictor, &sparsity)?;
    Ok((engine, planned, Some(profile)))
}

/// `--cache-policy static`: pins each op's hottest channels measured by `sift calibrate`.
fn pin_hot_set(model: &Model, store: &mut TieredStore, calib: Option<&Path>) -> anyhow::Result<()> {
    let file = calib.context(
        "--cache-policy static pins the hot channels measured by `sift calibrate`: pass its file with --calib",
    )?;
    let c = sift_engine::sparsity::Calibration::load(file)?;
    let cfg = &model.config;
    c.check_dims(SiteDims::of(cfg)).with_context(|| format!("--calib {}", file.display()))?;
    for l in 0..cfg.n_layer {
        for op in OpKind::ALL {
            let ranking = c.hot_ranking(l, Site::ALL[op.site_index()]).with_context(|| {
                format!(
                    "{} has no per-channel magnitudes (made by an older sift); run `sift calibrate` again",
                    file.display()
                )
            })?;
            store.set_hot(l, op, &ranking)?;
        }
    }
    Ok(())
}

/// Fills in what the user left to the planner: the sparsity (Top-K at the planned ratio) when
/// `--sparsity` is absent, the preload group when `--preload` is. Returns a line saying so.
fn plan(
    model: &Model,
    path: &Path,
    profile: &DeviceProfile,
    memory: &MemoryOptions,
    inputs: &PlanInputs,
    opts: &mut TieredOptions,
    sparsity: &mut SparsityOptions,
) -> anyhow::Result<String> {
    let fixed_ratio = sparsity.method.map(|m| if m == Method::Dense { 0.0 } else { sparsity.ratio });
    anyhow::ensure!((0.0..1.0).contains(&memory.max_ratio), "--max-ratio must be in [0, 1)");
    let req = PlanRequest {
        inputs: inputs.clone(),
        policy: opts.policy,
        max_ratio: memory.max_ratio,
        min_ratio: 0.0,
        fixed_ratio,
        base: opts.clone(),
        sequences: memory.sequences,
    };
    // The cost model: a trace to simulate would take its size (~1 MB per token for a 1.5B
    // model) out of the very budget being planned; `sift plan` simulates.
    let p = planner::plan(model, path, profile, &req, None)?;
    if memory.preload.is_none() {
        opts.preload = p.preload;
    }
    if sparsity.method.is_none() {
        if p.ratio > 0.0 {
            sparsity.method = Some(Method::TopK);
            sparsity.ratio = p.ratio;
        } else {
            sparsity.method = Some(Method::Dense);
        }
    }
    Ok(format!(
        "sift: planner (profile {}): --sparsity {} --ratio {:.2} --preload {} -> predicted {:.2} tok/s ({}); give --sparsity / --preload to choose yourself",
        profile.name,
        sparsity.method().name(),
        if sparsity.method() == Method::Dense { 0.0 } else { sparsity.ratio },
        opts.preload,
        p.predicted_tok_s,
        p.predicted_by
    ))
}
