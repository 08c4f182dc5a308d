//! Debug helper: greedy 32-token continuations of the prompts in tests/fixtures/greedy.json.
//! `cargo run --release -p sift-engine --example greedy -- MODEL tests/fixtures/greedy.json`
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let model = sift_model::Model::load(&a[1]).expect("model");
    let fx: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&a[2]).expect("fixture")).expect("json");
    let mut e = sift_engine::Engine::new(
        model,
        &sift_engine::EngineOptions { n_threads: 2, n_ctx: 512, n_batch: 512, ..Default::default() },
    );
    for r in fx["runs"].as_array().expect("runs") {
        let prompt: Vec<u32> =
            r["prompt_tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        e.truncate(0);
        let mut next = sift_engine::sampling::argmax_logits(e.eval(&prompt, sift_engine::Logits::Last).unwrap());
        let mut got = Vec::new();
        for _ in 0..32 {
            got.push(next);
            next = sift_engine::sampling::argmax_logits(e.eval(&[next], sift_engine::Logits::Last).unwrap());
        }
        println!("{} {:?}", r["name"], got);
    }
}
