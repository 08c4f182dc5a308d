//! Debug helper: prints the last-position logits summary for a token list.
//! `cargo run --release -p sift-engine --example logits -- MODEL 504,3575,282`
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let model = sift_model::Model::load(&a[1]).expect("model");
    let toks: Vec<u32> = a[2].split(',').map(|t| t.parse().expect("token id")).collect();
    let mut e = sift_engine::Engine::new(
        model,
        &sift_engine::EngineOptions { n_threads: 2, n_ctx: 512, n_batch: 512, ..Default::default() },
    );
    let l = e.eval(&toks, sift_engine::Logits::Last).expect("eval");
    println!("{:?}", &l[..8]);
}
