//! `sift bench`: llama-bench's tests and output shapes, markdown table or JSON array
//! (`sift_session::bench`).

use crate::args::BenchArgs;

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    let bench = sift_session::bench::Bench {
        model: a.model,
        sparsity: a.sparsity,
        memory: a.memory,
        cache_type_k: a.kv.k,
        cache_type_v: a.kv.v,
        threads: a.threads,
        poll: a.poll,
        n_prompt: a.n_prompt,
        n_gen: a.n_gen,
        n_depth: a.n_depth,
        reps: a.reps,
        batch_size: a.batch_size,
        json: a.output == "json",
    };
    bench.run(&mut std::io::stdout().lock())
}
