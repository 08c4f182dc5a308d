//! One request on the single-sequence worker: its prompt tokenized (held to the context), the
//! part the KV cache does not already hold evaluated in batches (with the prompt's own
//! log-probabilities when asked), then one choice generated and streamed token by token.

use super::*;

impl Worker {
    pub(super) fn tokenize(&self, p: &PromptInput) -> Result<(Vec<u32>, String), ApiError> {
        let tok = &self.l.session.tok;
        let bad = |e: String| ApiError::invalid_param("prompt", e);
        // Tokenized only up to the context size: a longer prompt is refused without holding
        // all its ids.
        let n_ctx = self.l.session.engine.n_ctx();
        let encode = |text: &str, special: bool| match tok.encode_at_most(text, true, special, n_ctx) {
            Err(sift_model::tokenizer::TokenizerError::TooManyTokens { limit }) => {
                let per = if self.slots.len() > 1 { " per slot (-c divided by -np)" } else { "" };
                Err(ApiError::context_length(format!(
                    "This model's maximum context length is {limit} tokens{per}; the prompt has more"
                )))
            }
            r => r.map_err(|e| bad(e.to_string())),
        };
        let (tokens, text) = match p {
            PromptInput::Text(s) => (encode(s, false)?, s.clone()),
            PromptInput::Tokens(t) => {
                if let Some(&id) = t.iter().find(|&&id| id as usize >= self.l.session.engine.config().n_vocab) {
                    return Err(bad(format!(
                        "token id {id} is outside the vocabulary of {} tokens",
                        self.l.session.engine.config().n_vocab
                    )));
                }
                (t.clone(), String::from_utf8_lossy(&tok.decode_bytes(t, false)).into_owned())
            }
            PromptInput::Chat(m) => {
                let t = self
                    .l
                    .template
                    .as_ref()
                    .ok_or_else(|| ApiError::invalid("this model has no chat template: use /v1/completions"))?;
                let text = t.apply(m, true).map_err(|e| ApiError::invalid_param("messages", e.to_string()))?;
                (encode(&text, true)?, String::new())
            }
        };
        if tokens.is_empty() {
            return Err(bad("the prompt is empty after tokenization".into()));
        }
        Ok((tokens, text))
    }

    /// Drops the KV cache after an engine error (its contents are unknown).
    pub(super) fn reset(&mut self) {
        self.l.session.engine.truncate(0);
        self.cached.clear();
    }

    pub(super) fn engine_error(&mut self, e: sift_engine::EvalError) -> Stop {
        self.reset();
        Stop::Failed(ApiError::internal(format!("the engine failed: {e}")))
    }

    /// Evaluates the prompt; leaves the last position's logits in `self.logits`.
    pub(super) fn prompt(&mut self, job: &Job, tokens: &[u32], k: Option<usize>) -> Result<Vec<TokenLogprob>, Stop> {
        let echo_lp = job.req.echo && k.is_some();
        let mut echo = Vec::new();
        if echo_lp {
            // Every position's logits: the whole sequence is evaluated again, in bounded chunks.
            self.reset();
            echo.push(TokenLogprob {
                id: tokens[0],
                bytes: self.l.session.tok.piece(tokens[0]).to_vec(),
                logprob: None,
                top: vec![],
            });
            let n_vocab = self.l.session.engine.config().n_vocab;
            let sparse = self.l.session.engine.sparse_prefill();
            // With sparse prefill, whole blocks per chunk (a block split between two calls
            // would run dense).
            let size = if sparse { PREFILL_BLOCK } else { ECHO_CHUNK };
            let mut start = 0;
            for r in prompt_chunks(0, tokens.len(), size, sparse) {
                let chunk = &tokens[r];
                if self.cancelled(job) {
                    self.reset();
                    return Err(Stop::Cancelled);
                }
                let logits = match self.l.session.engine.eval_prompt_part(chunk, Logits::All, tokens.len()) {
                    Ok(l) => l,
                    Err(e) => return Err(self.engine_error(e)),
                };
                for (r, row) in logits.chunks(n_vocab).enumerate() {
                    let p = start + r;
                    if p + 1 < tokens.len() {
                        echo.push(token_logprob(&self.l.session.tok, row, tokens[p + 1], k.unwrap_or(0)));
                    } else {
                        self.logits.clear();
                        self.logits.extend_from_slice(row);
                    }
                }
                self.cached.tokens.extend_from_slice(chunk);
                start += chunk.len();
                self.poll();
            }
            self.cached.prompt_read(tokens.len(), sparse);
            return Ok(echo);
        }
        // The common prefix stays (see `Cached::reusable`: the same request gives the same text
        // whether or not its prefix was cached).
        let sparse = self.l.session.engine.sparse_prefill();
        let common = self.cached.reusable(tokens, sparse);
        self.l.session.engine.truncate(common);
        self.cached.truncate(common);
        for r in prompt_chunks(common, tokens.len(), PROMPT_CHUNK, sparse) {
            let chunk = &tokens[r];
            if self.cancelled(job) {
                self.reset();
                return Err(Stop::Cancelled);
            }
            match self.l.session.engine.eval_prompt_part(chunk, Logits::Last, tokens.len()) {
                Ok(l) => {
                    self.logits.clear();
                    self.logits.extend_from_slice(l);
                }
                Err(e) => return Err(self.engine_error(e)),
            }
            self.cached.tokens.extend_from_slice(chunk);
            self.poll();
        }
        self.cached.prompt_read(tokens.len(), sparse);
        Ok(echo)
    }

    /// Runs one prompt and its generation (one choice).
    pub(super) fn choice(&mut self, job: &Job, index: usize, p: &PromptInput) -> Result<(), Stop> {
        let req = &job.req;
        let (tokens, prompt_text) = self.tokenize(p).map_err(Stop::Failed)?;
        let n_ctx = self.l.session.engine.n_ctx();
        let need = tokens.len() + usize::from(req.max_tokens > 0);
        if need > n_ctx {
            return Err(Stop::Failed(ApiError::context_length(format!(
                "This model's maximum context length is {n_ctx} tokens; the prompt has {} tokens{}",
                tokens.len(),
                if req.max_tokens > 0 { " and at least one more is needed to generate" } else { "" }
            ))));
        }
        // The whole prompt's KV cache from the budget first: a prompt the budget cannot hold is
        // refused now, not after the part that fits was computed (the prompt runs in chunks).
        if let Err(e) = self.l.session.engine.reserve_kv(need) {
            return Err(Stop::Failed(ApiError::context_length(e.to_string())));
        }
        let k = req.logprobs;
        let t_prompt = Instant::now();
        // The prompt's tokens reused from the KV cache (as `prompt` counts them).
        let cached_before = self.cached.reusable(&tokens, self.l.session.engine.sparse_prefill());
        let echo = self.prompt(job, &tokens, k)?;
        let prompt_s = t_prompt.elapsed().as_secs_f64();
        Metrics::inc(&self.metrics.prompt_tokens, tokens.len() as u64);
        let echo_text = if req.echo { prompt_text } else { String::new() };
        if job.events.send(Event::Prompt { index, n_prompt: tokens.len(), echo_text, echo }).is_err() {
            return Err(Stop::Cancelled);
        }
        let max = req.max_tokens.min(n_ctx - tokens.len());
        let opts = GenerateOptions {
            n_predict: Some(max),
            stop: req.stop.clone(),
            ignore_eos: req.ignore_eos,
            sampler: req.sampler.clone(),
        };
        // Under --memory the decode is measured against its bound (a tracer left by a cancelled
        // request is replaced).
        self.l.session.engine.set_tracer(None);
        let probe = match &self.profile {
            Some(_) => DecodeProbe::start(&mut self.l.session.engine)
                .map_err(|e| Stop::Failed(ApiError::internal(e.to_string())))?,
            None => None,
        };
        let t_decode = Instant::now();
        // Sampling, stop strings and UTF-8-safe pieces: the engine's one generation step.
        let mut g = Generator::new(&opts, &tokens);
        let mut pending: Vec<TokenLogprob> = Vec::new();
        let mut last = Instant::now();
        let send = |text: &str, lps: &mut Vec<TokenLogprob>| {
            job.events.send(Event::Text { index, text: text.to_string(), logprobs: std::mem::take(lps) }).is_ok()
        };
        let (finish, mut tail) = loop {
            if g.limit_reached() {
                break ("length", String::new());
            }
            if self.cancelled(job) {
                return Err(Stop::Cancelled);
            }
            let next = g.sample(&self.logits);
            if let Some(k) = k {
                pending.push(token_logprob(&self.l.session.tok, &self.logits, next, k));
            }
            Metrics::inc(&self.metrics.generated_tokens, 1);
            let now = Instant::now();
            if g.n_sampled() == 0 {
                self.metrics.observe_ttft((now - job.received).as_secs_f64());
            } else {
                self.metrics.observe_itl((now - last).as_secs_f64());
            }
            last = now;
            let step = g.push(&self.l.session.tok, next);
            if step.end.is_some() {
                // The end-of-text token adds no text but counts as generated, and its
                // log-probability is reported (as vLLM does): a client that asks for one token
                // with `echo` (lm-eval's loglikelihood) drops the last entry and must find
                // exactly the prompt's tokens before it. A stop string's text before the cut
                // goes out with the final piece.
                break ("stop", step.text);
            }
            if !step.text.is_empty() && !send(&step.text, &mut pending) {
                return Err(Stop::Cancelled);
            }
            if self.l.session.engine.n_past() >= n_ctx {
                break ("length", String::new());
            }
            match self.l.session.engine.eval(&[next], Logits::Last) {
                Ok(l) => {
                    self.logits.clear();
                    self.logits.extend_from_slice(l);
                }
                Err(e) => return Err(self.engine_error(e)),
            }
            self.cached.tokens.push(next);
            self.poll();
        };
        tail.push_str(&g.finish());
        if (!tail.is_empty() || !pending.is_empty()) && !send(&tail, &mut pending) {
            return Err(Stop::Cancelled);
        }
        let n_gen = g.n_sampled();
        let decode_s = t_decode.elapsed().as_secs_f64();
        let cache_n = cached_before.min(tokens.len());
        let mut timings = Timings::new(cache_n, tokens.len() - cache_n, prompt_s, n_gen, decode_s);
        if let (Some(p), Some(profile)) = (probe, &self.profile) {
            match p.finish(&mut self.l.session.engine, decode_s, profile) {
                Ok(t) => {
                    self.metrics.set_decode(&t);
                    timings.decode = Some(t);
                }
                Err(e) => eprintln!("sift: the decode's bound: {e}"),
            }
        }
        if job.events.send(Event::Done { index, finish, n_gen, timings }).is_err() {
            return Err(Stop::Cancelled);
        }
        Ok(())
    }
}
