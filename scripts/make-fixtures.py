#!/usr/bin/env python3
# Writes the llama.cpp reference fixtures in tests/fixtures/ (tokens, logits, greedy generations and
# chat-template renderings) that sift's tests compare against.
#
# Needs the reference built by scripts/build-llama-ref.sh (llama-cpp-python 0.3.36 in .ref/venv, driving
# the llama.cpp shared libraries in .ref/build/bin) and the models from scripts/fetch-model.sh. Run from
# the repository root:
#
#   LLAMA_CPP_LIB_PATH=.ref/build/bin .ref/venv/bin/python scripts/make-fixtures.py
#
# (the script sets LLAMA_CPP_LIB_PATH itself when it is unset). Options: --out DIR (default
# tests/fixtures), --no-qwen (skip the optional Qwen2.5 fixtures). It also writes spm-vocab.gguf, a tiny
# SentencePiece ("llama") vocabulary made with the vendored gguf-py, and llama.cpp's tokens for it. Output is deterministic: re-running it
# against the same reference and models rewrites identical files.
import argparse
import ctypes
import json
import os
import pathlib
import struct
import sys
import types

ROOT = pathlib.Path(__file__).resolve().parent.parent
os.environ.setdefault("LLAMA_CPP_LIB_PATH", str(ROOT / ".ref" / "build" / "bin"))

import llama_cpp  # noqa: E402  (must come after LLAMA_CPP_LIB_PATH is set)
from llama_cpp.llama_chat_format import Jinja2ChatFormatter  # noqa: E402

SMOLLM = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
QWEN = ROOT / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"

# Strings for tokens*.json. Each is tokenized with special=True and add_bos=False; the ones named in
# EXTRA_VARIANTS are also tokenized with the other flag combinations listed there.
STRINGS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "",
    " ",
    "  leading two spaces",
    "trailing spaces   ",
    "multiple    inner     spaces",
    "line one\nline two\n\nline four\n",
    "tabs\tand\t\ttabs\r\nwindows newline",
    "\n\n\n",
    "1234567890",
    "pi is 3.14159 and e is 2.71828; 1,000,000 items cost $42.50",
    "Café naïve résumé façade Ångström Straße",
    "中文分词测试：我爱北京天安门。",
    "日本語のテキスト、カタカナとひらがな。",
    "emoji 😀🎉 and ZWJ 👨‍👩‍👧‍👦 👩🏽‍💻 🏳️‍🌈",
    "مرحبا بالعالم، كيف حالك؟",
    "Привет, мир! Ελληνικά κείμενο.",
    "fn main() {\n    let x: Vec<u32> = (0..10).map(|i| i * 2).collect();\n    println!(\"{:?}\", x);\n}\n",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n\tprint(fib(10))\n",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "I'm sure we'll see, don't you think? They've said it's John's.",
    "Visit https://example.com/path?query=1&lang=en#frag or mailto:someone@example.org",
    "ALL CAPS SHOUTING and MiXeD CaSe",
    "    indented with four spaces",
    "a\u00a0non-breaking\u2003em-space\u200bzero-width",
    "<|endoftext|>plain text after special",
    "punctuation!!! ??? ... --- *** ((nested)) [brackets] {braces}",
    "   \n  \t mixed whitespace \n   ",
    "Numbers: 7 42 365 2024 100000 0.5 -3 1e10",
]

# (string index, add_bos, special) variants on top of (i, False, True).
EXTRA_VARIANTS = [
    (0, True, True),
    (1, True, True),
    (2, True, True),
    (20, False, False),
    (20, True, False),
    (26, False, False),
]

LOGIT_PROMPTS = [
    ("sentence", "The capital of France is"),
    ("code", "def add(a, b):\n    return"),
    ("chat", "<|im_start|>user\nWhat is the color of the sky?<|im_end|>\n<|im_start|>assistant\n"),
    (
        "paragraph",
        "The history of computing is a story of steadily shrinking machines and growing ambitions. "
        "Early computers filled entire rooms, consumed enormous amounts of power, and were programmed "
        "by physically rewiring their circuits. The invention of the transistor, and later the integrated "
        "circuit, made it possible to pack millions and then billions of switches onto a single chip. "
        "Today a phone in your pocket is more powerful than the machines that guided astronauts to the "
        "moon, and researchers are",
    ),
]

GREEDY_PROMPTS = [
    ("story", "Once upon a time, in a small village,"),
    ("code", "def fibonacci(n):\n"),
    ("chat", "<|im_start|>user\nName three primary colors.<|im_end|>\n<|im_start|>assistant\n"),
    ("facts", "The capital of France is Paris. The capital of Germany is"),
    ("list", "Here is a list of fruits: apple, banana,"),
    ("science", "Water boils at 100 degrees Celsius at sea level because"),
    ("howto", "<|im_start|>user\nHow do I make a cup of tea?<|im_end|>\n<|im_start|>assistant\n"),
    ("rust", "fn main() {\n    let v = vec![1, 2, 3];\n"),
]
GREEDY_TOKENS = 32

CHAT_MESSAGES = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "2 + 2 = 4."},
    {"role": "user", "content": "And  times three?  "},
]


def detokenize(llm, ids, remove_special, unparse_special):
    """llama.cpp's own llama_detokenize (llm.detokenize is a per-token loop with its own BOS rule)."""
    arr = (llama_cpp.llama_token * len(ids))(*ids)
    size = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(llm._model.vocab, arr, len(ids), buf, size, remove_special, unparse_special)
    assert 0 <= n <= size, n
    return buf.raw[:n].decode("utf-8", errors="replace")


def load(path, **kw):
    return llama_cpp.Llama(
        model_path=str(path), n_ctx=512, n_threads=2, n_batch=512, logits_all=False, verbose=False, **kw
    )


def tokens_fixture(llm, model_name):
    entries = []
    variants = [(i, False, True) for i in range(len(STRINGS))] + EXTRA_VARIANTS
    for i, add_bos, special in variants:
        text = STRINGS[i]
        ids = llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)
        entries.append(
            {
                "text": text,
                "add_special": add_bos,
                "parse_special": special,
                "ids": ids,
                # llama_detokenize(ids, remove_special=False, unparse_special=True): text with specials
                "detok_special": detokenize(llm, ids, False, True),
                # llama_detokenize(ids, remove_special=True, unparse_special=False): specials dropped
                "detok_plain": detokenize(llm, ids, True, False),
            }
        )
    return {
        "model": model_name,
        "call": "llm.tokenize(text.encode(), add_bos=add_special, special=parse_special) == "
        "llama_tokenize(vocab, text, add_special, parse_special); detok_* from "
        "llama_detokenize(vocab, ids, remove_special, unparse_special)",
        "bos_id": llm.token_bos(),
        "eos_id": llm.token_eos(),
        "add_bos_token": llm.metadata.get("tokenizer.ggml.add_bos_token"),
        "entries": entries,
    }


def last_logits(llm):
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return [ptr[j] for j in range(llm.n_vocab())]


def logits_fixture(llm, out, model_name=None, binary="logits.f32", prompts=None):
    n_vocab = llm.n_vocab()
    index = {
        "model": model_name or SMOLLM.name,
        "n_vocab": n_vocab,
        "binary": binary,
        "layout": "one row of n_vocab little-endian f32 per prompt, in prompt order; the logits of the "
        "last prompt position (llama_get_logits_ith(ctx, -1) after llm.eval(tokens))",
        "settings": "Llama(n_ctx=512, n_threads=2, n_batch=512, logits_all=False); tokens = "
        "llm.tokenize(prompt, add_bos=True, special=True)",
        "prompts": [],
    }
    blob = bytearray()
    for name, prompt in prompts or LOGIT_PROMPTS:
        llm.reset()
        toks = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
        llm.eval(toks)
        row = last_logits(llm)
        assert len(row) == n_vocab
        blob += struct.pack(f"<{n_vocab}f", *row)
        order = sorted(range(n_vocab), key=lambda j: -row[j])[:10]
        index["prompts"].append(
            {
                "name": name,
                "text": prompt,
                "tokens": toks,
                "top10_ids": order,
                "top10_logits": [round(row[j], 5) for j in order],
            }
        )
    (out / binary).write_bytes(bytes(blob))
    return index


def greedy_fixture(llm):
    eos = llm.token_eos()
    runs = []
    for name, prompt in GREEDY_PROMPTS:
        llm.reset()
        toks = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
        llm.eval(toks)
        gen, margins = [], []
        for _ in range(GREEDY_TOKENS):
            row = last_logits(llm)
            nxt = max(range(len(row)), key=lambda j: row[j])  # argmax, lowest id wins ties
            second = max(row[j] for j in range(len(row)) if j != nxt)
            gen.append(nxt)
            margins.append(round(float(row[nxt] - second), 4))
            llm.eval([nxt])
        runs.append(
            {
                "name": name,
                "text": prompt,
                "prompt_tokens": toks,
                "generated": gen,
                "top2_margin": margins,
                "eos_seen": eos in gen,
                "eog_seen": any(llama_cpp.llama_vocab_is_eog(llm._model.vocab, t) for t in gen),
                "generated_text": detokenize(llm, gen, False, True),
            }
        )
    return {
        "model": SMOLLM.name,
        "settings": "Llama(n_ctx=512, n_threads=2, n_batch=512); prompt evaluated in one llm.eval, then "
        f"{GREEDY_TOKENS} steps of argmax(llama_get_logits_ith(ctx, -1)) fed back one token at a time with "
        "llm.eval([tok]); no sampling, no repetition penalty, EOS/EOG does not stop generation",
        "eos_id": eos,
        "runs": runs,
    }


def chat_fixture(llm, model_name):
    template = llm.metadata["tokenizer.chat_template"]
    bos = llm._model.token_get_text(llm.token_bos())
    eos = llm._model.token_get_text(llm.token_eos())
    cases = []
    for add_gen in (True, False):
        fmt = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos, add_generation_prompt=add_gen)
        cases.append(
            {
                "add_generation_prompt": add_gen,
                "messages": CHAT_MESSAGES,
                "expected": fmt(messages=CHAT_MESSAGES).prompt,
            }
        )
    # Without a system message (templates often insert a default one).
    fmt = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos, add_generation_prompt=True)
    cases.append(
        {"add_generation_prompt": True, "messages": CHAT_MESSAGES[1:], "expected": fmt(messages=CHAT_MESSAGES[1:]).prompt}
    )
    return {
        "model": model_name,
        "renderer": "llama_cpp.llama_chat_format.Jinja2ChatFormatter (jinja2 sandbox, trim_blocks=True, "
        "lstrip_blocks=True)",
        "bos_token": bos,
        "eos_token": eos,
        "template": template,
        "cases": cases,
    }


SPM_WORDS = ["the", "hello", "world", "and", "in", "ing", "café", "token", "tokenizer", "is", "a", "test", "of",
             "sentence", "piece", "spaces", "new", "lines", "tab"]
SPM_STRINGS = [
    "hello world",
    "the tokenizer is a test of sentence piece",
    "",
    " leading space",
    "trailing  ",
    "multiple   spaces",
    "café tokenizer",
    "zebra quiz jumps",
    "中文 😀 ok",
    "new\nlines\tand\ttab",
    "<|user|>hello<|end|> world",
    "hello<|end|>",
    "helloworld thetest",
]


def spm_fixture(out):
    """A tiny SentencePiece ("llama") vocabulary written with gguf-py, tokenized by llama.cpp."""
    sys.path.insert(0, str(ROOT / ".ref" / "src" / "vendor" / "llama.cpp" / "gguf-py"))
    sys.modules.setdefault("yaml", types.ModuleType("yaml"))  # gguf-py imports it for model cards only
    import gguf

    toks = [("<unk>", 0.0, gguf.TokenType.UNKNOWN), ("<s>", 0.0, gguf.TokenType.CONTROL),
            ("</s>", 0.0, gguf.TokenType.CONTROL)]
    toks += [(f"<0x{b:02X}>", 0.0, gguf.TokenType.BYTE) for b in range(256)]
    toks += [("<|user|>", 0.0, gguf.TokenType.USER_DEFINED), ("<|end|>", 0.0, gguf.TokenType.CONTROL)]
    pieces = []
    for w in SPM_WORDS:
        s = "\u2581" + w
        for i in range(len(s)):
            for j in range(i + 1, len(s) + 1):
                if s[i:j] not in pieces:
                    pieces.append(s[i:j])
    for i, p in enumerate(pieces):
        # Deterministic, varied scores so that merge order matters.
        toks.append((p, -float((i * 7919) % 1009) / 10.0 - len(p), gguf.TokenType.NORMAL))
    path = out / "spm-vocab.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list([t[0] for t in toks])
    w.add_token_scores([t[1] for t in toks])
    w.add_token_types([int(t[2]) for t in toks])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {path} ({path.stat().st_size} bytes)", file=sys.stderr)

    llm = load(path, vocab_only=True)
    entries = []
    for text in SPM_STRINGS:
        for add_bos, special in ((True, True), (False, True), (True, False)):
            ids = llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)
            entries.append(
                {
                    "text": text,
                    "add_special": add_bos,
                    "parse_special": special,
                    "ids": ids,
                    "detok_special": detokenize(llm, ids, False, True),
                    "detok_plain": detokenize(llm, ids, True, False),
                }
            )
    return {
        "model": path.name,
        "call": "llm.tokenize(text.encode(), add_bos=add_special, special=parse_special); detok_* from "
        "llama_detokenize(vocab, ids, remove_special, unparse_special)",
        "bos_id": llm.token_bos(),
        "eos_id": llm.token_eos(),
        "entries": entries,
    }


def dump(path, obj):
    path.write_text(json.dumps(obj, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size} bytes)", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures"))
    ap.add_argument("--no-qwen", action="store_true")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    llm = load(SMOLLM)
    dump(out / "tokens.json", tokens_fixture(llm, SMOLLM.name))
    dump(out / "logits.json", logits_fixture(llm, out))
    dump(out / "greedy.json", greedy_fixture(llm))
    dump(out / "chat_template.json", chat_fixture(llm, SMOLLM.name))
    del llm

    dump(out / "tokens_spm.json", spm_fixture(out))

    if not args.no_qwen and QWEN.exists():
        qwen = load(QWEN, vocab_only=True)
        dump(out / "tokens_qwen2.json", tokens_fixture(qwen, QWEN.name))
        dump(out / "chat_template_qwen2.json", chat_fixture(qwen, QWEN.name))
        del qwen
        qwen = load(QWEN)
        dump(out / "logits_qwen2.json", logits_fixture(qwen, out, QWEN.name, "logits_qwen2.f32", LOGIT_PROMPTS[:2]))


if __name__ == "__main__":
    main()
