//! A choice's prompt: its text tokenized (held to the context) and, when a request asks for the
//! prompt's own log-probabilities (`echo` with `logprobs`), read in one go with every position's
//! logits. Ordinary prompts are read by the scheduler a chunk per step (`scheduler.rs`).

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
                let per = self.per_slot();
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

    /// Reads the whole prompt of a choice on slot `s` (the slot in use) with every position's
    /// logits, for its own log-probabilities: the slot's cache is dropped first. Leaves the last
    /// position's logits in `self.logits`.
    pub(super) fn echo_prompt(
        &mut self,
        s: usize,
        job: &Job,
        tokens: &[u32],
        k: Option<usize>,
    ) -> Result<Vec<TokenLogprob>, Stop> {
        self.reset_slot(s);
        let mut echo = vec![TokenLogprob {
            id: tokens[0],
            bytes: self.l.session.tok.piece(tokens[0]).to_vec(),
            logprob: None,
            top: vec![],
        }];
        let n_vocab = self.l.session.engine.config().n_vocab;
        let sparse = self.l.session.engine.sparse_prefill();
        // With sparse prefill, whole blocks per chunk (a block split between two calls would
        // run dense).
        let size = if sparse { PREFILL_BLOCK } else { ECHO_CHUNK };
        let mut start = 0;
        for r in prompt_chunks(0, tokens.len(), size, sparse) {
            let chunk = &tokens[r];
            if self.cancelled(job) {
                self.reset_slot(s);
                return Err(Stop::Cancelled);
            }
            let logits = match self.l.session.engine.eval_prompt_part(chunk, Logits::All, tokens.len()) {
                Ok(l) => l,
                Err(e) => {
                    self.reset_slot(s);
                    return Err(Stop::Failed(ApiError::internal(format!("the engine failed: {e}"))));
                }
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
            self.slots[s].cached.tokens.extend_from_slice(chunk);
            start += chunk.len();
            self.poll();
        }
        self.slots[s].cached.prompt_read(tokens.len(), sparse);
        Ok(echo)
    }
}
