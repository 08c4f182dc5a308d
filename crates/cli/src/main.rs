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

use clap::Parser;

fn main() {
    let cli = args::Cli::parse();
    let result = match cli.command {
        args::Command::Generate(a) => generate::run(a),
        args::Command::Chat(a) => chat::run(a),
        args::Command::Perplexity(a) => perplexity::run(a),
        args::Command::Bench(a) => bench::run(a),
        args::Command::Inspect(a) => inspect::run(a),
        args::Command::Eval(a) => eval::run(a),
        args::Command::Sweep(a) => sweep::run(a),
        args::Command::Calibrate(a) => calibrate::run(a),
        args::Command::Pack(a) => pack::run(a),
        args::Command::Trace(a) => trace::run(a),
        args::Command::Simulate(a) => simulate::run(a),
        args::Command::Plan(a) => plan::run(a),
        args::Command::Probe(a) => probe::run(a),
        args::Command::Serve(a) => serve::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        for cause in e.chain().skip(1) {
            eprintln!("  caused by: {cause}");
        }
        std::process::exit(1);
    }
}
