//! `sift`: run GGUF language models from the command line, with llama.cpp's flag names.
//!
//! Subcommands: `generate`, `chat`, `serve`, `perplexity`, `bench`, `inspect`, and more. Each lives in its own module;
//! this file parses arguments and prints errors with their context.

#![forbid(unsafe_code)]

mod args;
mod bench;
mod calibrate;
mod chat;
mod eval;
mod export_lora;
mod generate;
mod inspect;
mod pack;
mod perplexity;
mod plan;
mod probe;
mod serve;
mod session;
mod simulate;
mod sweep;
mod trace;
mod train;

use clap::{Parser, Subcommand};

/// The system allocator, holding untrusted work (a model's chat template) to a memory limit:
/// see `sift_alloc`.
#[global_allocator]
static ALLOC: sift_alloc::ScopedLimitAlloc = sift_alloc::ScopedLimitAlloc;

#[derive(Parser)]
#[command(
    name = "sift",
    version,
    about = "Run GGUF language models under a memory budget, computing only the weights each token needs"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Generate text from a prompt (streams to stdout, speed summary to stderr)
    Generate(args::GenerateArgs),
    /// Interactive chat using the model's chat template
    Chat(args::ChatArgs),
    /// OpenAI-compatible HTTP server (completions, chat, streaming, logprobs, metrics, live budget)
    Serve(serve::ServeArgs),
    /// Perplexity over a text file, llama-perplexity's method
    Perplexity(args::PerplexityArgs),
    /// Prompt-processing and generation speed, like llama-bench
    Bench(args::BenchArgs),
    /// Print a GGUF file's metadata and tensor table, like gguf-dump
    Inspect(args::InspectArgs),
    /// Multiple-choice accuracy by log-likelihood (HellaSwag, ARC, WinoGrande, OpenBookQA, MMLU), like lm-eval
    Eval(args::EvalArgs),
    /// Perplexity and decode speed over selection methods x ratios: CSV and Pareto plots
    Sweep(args::SweepArgs),
    /// Activation histograms, greedy per-site allocation and core-neuron clusters for a model
    Calibrate(args::CalibrateArgs),
    /// Write a .sift pack: the GGUF plus column / neuron-bundle layouts for sparse kernels
    Pack(args::PackArgs),
    /// Record what the selector saw and chose per decoded token, layer and site (for simulate)
    Trace(trace::TraceArgs),
    /// Replay a trace through the cache and prefetcher on a device profile: tok/s, hit rate, bytes
    Simulate(args::SimulateArgs),
    /// The planner's sparsity, preload group and cache size for a memory budget, with predicted tok/s
    Plan(plan::PlanArgs),
    /// Measure this machine (memory, disk by read size and queue depth, kernels) into a device profile
    Probe(probe::ProbeArgs),
    /// Train sift's learned parts on the CPU (`train prefill`: FastForward's expert predictor;
    /// `train distill`: LoRA adapters that recover what sparsity costs)
    Train(train::TrainArgs),
    /// Fuse LoRA adapters into the model's weights and write a new GGUF, like llama-export-lora
    ExportLora(export_lora::ExportLoraArgs),
}

fn main() {
    let cli = Cli::parse_from(args::llama_spellings(std::env::args_os()));
    let result = match cli.command {
        Command::Generate(a) => generate::run(a),
        Command::Chat(a) => chat::run(a),
        Command::Perplexity(a) => perplexity::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Inspect(a) => inspect::run(a),
        Command::Eval(a) => eval::run(a),
        Command::Sweep(a) => sweep::run(a),
        Command::Calibrate(a) => calibrate::run(a),
        Command::Pack(a) => pack::run(a),
        Command::Trace(a) => trace::run(a),
        Command::Simulate(a) => simulate::run(a),
        Command::Plan(a) => plan::run(a),
        Command::Probe(a) => probe::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Train(a) => train::run(a),
        Command::ExportLora(a) => export_lora::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        for cause in e.chain().skip(1) {
            eprintln!("  caused by: {cause}");
        }
        std::process::exit(1);
    }
}
