#!/usr/bin/env python3
"""`sift serve` through the official `openai` Python package, unchanged.

Usage: serve_openai.py BASE_URL MODEL   (e.g. http://127.0.0.1:8080/v1 SmolLM2-135M-Instruct.Q4_1)
Run by crates/cli/tests/serve.rs; prints "openai client: ok" when every check passes.
"""
import math
import sys

import openai

base_url, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)

# Models.
assert model in [m.id for m in client.models.list().data]

# Chat, non-streaming.
msgs = [{"role": "user", "content": "Name a primary color."}]
r = client.chat.completions.create(model=model, messages=msgs, max_tokens=16, temperature=0)
text = r.choices[0].message.content
assert r.choices[0].message.role == "assistant" and text, r
assert r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0, r.usage

# Chat, streaming: the same greedy text.
chunks = client.chat.completions.create(model=model, messages=msgs, max_tokens=16, temperature=0, stream=True)
streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
assert streamed == text, (streamed, text)

# Chat logprobs.
r = client.chat.completions.create(model=model, messages=msgs, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2)
lp = r.choices[0].logprobs.content
assert len(lp) == r.usage.completion_tokens and all(t.logprob <= 0 for t in lp), lp
assert all(len(t.top_logprobs) == 2 for t in lp)

# Completions with logprobs, and echo of the prompt's log-probabilities (lm-eval's loglikelihood).
r = client.completions.create(model=model, prompt="The capital of France is", max_tokens=5, temperature=0, logprobs=3)
c = r.choices[0]
assert c.text and len(c.logprobs.tokens) == r.usage.completion_tokens, c
assert all(len(t) >= 3 for t in c.logprobs.top_logprobs)
r = client.completions.create(model=model, prompt="The capital of France is Paris", max_tokens=0, echo=True, logprobs=1)
c = r.choices[0]
assert c.text == "The capital of France is Paris", c.text
assert c.logprobs.token_logprobs[0] is None
assert all(math.isfinite(x) and x <= 0 for x in c.logprobs.token_logprobs[1:])

# Completions, streaming.
s = client.completions.create(model=model, prompt="The capital of France is", max_tokens=5, temperature=0, stream=True)
assert "".join(x.choices[0].text for x in s if x.choices) == client.completions.create(
    model=model, prompt="The capital of France is", max_tokens=5, temperature=0
).choices[0].text

# Errors arrive as the package's exceptions.
try:
    client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    raise SystemExit("unknown model accepted")
except openai.NotFoundError:
    pass
try:
    client.completions.create(model=model, prompt="x", max_tokens=-1)
    raise SystemExit("negative max_tokens accepted")
except openai.BadRequestError:
    pass

print("openai client: ok")
