//! `sift serve` under hostile requests (issue 22's request probe, kept as a test): every field of
//! every endpoint's body set to hostile values (wrong types, 2^64, 1e308, deep nesting, long
//! strings, NUL), fields removed or added, seeded random byte mutations of valid bodies, and
//! malformed HTTP (garbage, lying `Content-Length`, bad chunked encoding, huge headers, unknown
//! methods, HTTP/2's preface). Each must get an answer that is not a 5xx (or, for bytes that are
//! not HTTP, a closed connection), within the time limit; afterwards the server is alive, healthy
//! and still gives the same greedy completion it gave before.

mod common;
use common::*;

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

/// xorshift64*: a seeded generator, so a failure repeats.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Sends `bytes` as they are and reads the answer: its status, or `None` when the server closed
/// the connection without one. With `close`, the writing side is closed after the bytes (the
/// server then sees the end of a request that lies about its length; a complete request is not
/// closed, since the server takes a closed connection for a client that left and cancels it).
fn send_raw(addr: &str, bytes: &[u8], close: bool) -> Option<u16> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let _ = s.write_all(bytes);
    if close {
        let _ = s.shutdown(Shutdown::Write);
    }
    let mut raw = Vec::new();
    if let Err(e) = s.read_to_end(&mut raw) {
        assert!(
            !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
            "no answer within 60 s to {:?}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
        );
    }
    let text = String::from_utf8_lossy(&raw[..raw.len().min(64)]).into_owned();
    let status = text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok();
    assert!(status.is_some(), "not an HTTP answer: {text:?}");
    status
}

fn post_raw(addr: &str, path: &str, body: &[u8]) -> Option<u16> {
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    send_raw(addr, &req, false)
}

/// A body as JSON text, with `field` set to `value` given as raw JSON text (so that numbers
/// serde_json would not write, 2^64 or 1e400, reach the server as a client could send them).
fn with_field(body: &Value, field: &str, value: &str) -> Vec<u8> {
    let mut v = body.clone();
    v[field] = json!("@@HOSTILE@@");
    v.to_string().replace("\"@@HOSTILE@@\"", value).into_bytes()
}

fn hostile_values() -> Vec<String> {
    let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    vec![
        "null".into(),
        "true".into(),
        "-1".into(),
        "0".into(),
        "1.5".into(),
        "1e308".into(),
        "-1e308".into(),
        "1e400".into(),
        "18446744073709551616".into(),
        "9007199254740993".into(),
        "\"\"".into(),
        "\"\\u0000\"".into(),
        "\"\\ud800\"".into(),
        format!("\"{}\"", "x".repeat(20_000)),
        "[]".into(),
        "[1, 2, 3]".into(),
        "[\"a\", null, {}]".into(),
        "{}".into(),
        "{\"role\": 5}".into(),
        deep,
    ]
}

#[test]
fn hostile_requests_get_answers_and_leave_the_server_well() {
    let srv = Server::start(&["-c", "256", "--max-body", "64K", "--max-tokens-limit", "4", "--timeout", "5"]);
    let a = srv.addr.as_str();
    let before = completion(a, "The capital of France is", 4);
    let bodies: [(&str, Value); 5] = [
        (
            "/v1/completions",
            json!({"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0, "top_k": 40,
                   "top_p": 0.9, "min_p": 0.05, "seed": 7, "stop": ["\n"], "logprobs": 2, "echo": false,
                   "stream": false, "repeat_penalty": 1.1, "presence_penalty": 0.1, "logit_bias": {"13": 1.0},
                   "n": 1}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0,
                   "logprobs": true, "top_logprobs": 2, "stream": true, "stop": "x", "seed": 1}),
        ),
        ("/tokenize", json!({"content": "Hello world", "add_special": true, "with_pieces": true})),
        ("/detokenize", json!({"tokens": [1, 2, 3]})),
        ("/admin/memory", json!({"budget": "200M"})),
    ];
    let mut rng = Rng(0x5eed_2222);
    let (mut n, mut statuses) = (0usize, std::collections::BTreeMap::<u16, usize>::new());
    let t0 = Instant::now();
    let mut check = |what: &str, status: Option<u16>, may_close: bool| {
        n += 1;
        match status {
            Some(s) => {
                assert!(s < 500, "{what}: status {s}\n{}", srv.log());
                *statuses.entry(s).or_default() += 1;
            }
            None => assert!(may_close, "{what}: the connection closed without an answer\n{}", srv.log()),
        }
    };
    for (path, body) in &bodies {
        // The valid body is served (the admin endpoint: a GGUF has no budget to change).
        let ok = post_raw(a, path, body.to_string().as_bytes());
        assert_eq!(ok, Some(if *path == "/admin/memory" { 400 } else { 200 }), "{path}: {body}");
        let fields: Vec<String> = body.as_object().unwrap().keys().cloned().collect();
        for f in &fields {
            for v in hostile_values() {
                let b = with_field(body, f, &v);
                check(&format!("{path} {f} = {}", &v[..v.len().min(40)]), post_raw(a, path, &b), false);
            }
            let mut without = body.clone();
            without.as_object_mut().unwrap().remove(f);
            check(&format!("{path} without {f}"), post_raw(a, path, without.to_string().as_bytes()), false);
        }
        check(&format!("{path} with an unknown field"), post_raw(a, path, &with_field(body, "zzz", "1e400")), false);
        // Seeded byte mutations of the valid body: flips, deletions, insertions, cuts.
        let valid = body.to_string().into_bytes();
        for _ in 0..40 {
            let mut b = valid.clone();
            for _ in 0..1 + rng.below(4) {
                if b.is_empty() {
                    break;
                }
                let i = rng.below(b.len());
                match rng.below(4) {
                    0 => b[i] ^= 1 << rng.below(8),
                    1 => {
                        b.remove(i);
                    }
                    2 => b.insert(i, rng.next() as u8),
                    _ => b.truncate(i),
                }
            }
            check(&format!("{path} mutated {:?}", String::from_utf8_lossy(&b)), post_raw(a, path, &b), false);
        }
    }
    // Malformed HTTP.
    let host = format!("Host: {a}\r\n");
    let crafted: Vec<Vec<u8>> = vec![
        b"\r\n\r\n".to_vec(),
        b"GET\r\n\r\n".to_vec(),
        b"GET / HTTP/9.9\r\n\r\n".to_vec(),
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(),
        format!("FOO /health HTTP/1.1\r\n{host}\r\n").into_bytes(),
        format!("GET /../../etc/passwd HTTP/1.1\r\n{host}\r\n").into_bytes(),
        format!("GET /health?x=%00%ff HTTP/1.1\r\n{host}\r\n").into_bytes(),
        format!("GET /{} HTTP/1.1\r\n{host}\r\n", "a".repeat(100_000)).into_bytes(),
        format!("GET /health HTTP/1.1\r\n{host}X-Big: {}\r\n\r\n", "b".repeat(200_000)).into_bytes(),
        format!("GET /health HTTP/1.1\r\n{host}{}\r\n", "X-H: 1\r\n".repeat(5000)).into_bytes(),
        format!("POST /tokenize HTTP/1.1\r\n{host}Content-Length: 100\r\n\r\n{{\"content\": \"x\"}}").into_bytes(),
        format!("POST /tokenize HTTP/1.1\r\n{host}Content-Length: -5\r\n\r\n{{}}").into_bytes(),
        format!("POST /tokenize HTTP/1.1\r\n{host}Content-Length: 18446744073709551616\r\n\r\n{{}}").into_bytes(),
        format!("POST /tokenize HTTP/1.1\r\n{host}Content-Length: 2\r\nContent-Length: 9\r\n\r\n{{}}").into_bytes(),
        format!("POST /tokenize HTTP/1.1\r\n{host}Transfer-Encoding: chunked\r\n\r\nzz\r\n{{}}\r\n0\r\n\r\n").into_bytes(),
        format!("POST /tokenize HTTP/1.1\r\n{host}Transfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n{{}}").into_bytes(),
        format!("POST /tokenize HTTP/1.1\r\n{host}Transfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n2\r\n{{}}\r\n0\r\n\r\n")
            .into_bytes(),
        format!("POST /v1/completions HTTP/1.1\r\n{host}Content-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi").into_bytes(),
        [format!("POST /v1/completions HTTP/1.1\r\n{host}Content-Length: 4\r\n\r\n").into_bytes(), vec![0xff, 0xfe, 0, 1]]
            .concat(),
        [format!("GET /health HTTP/1.1\r\n{host}X-Bin: ").into_bytes(), vec![0xff, 0x00, 0xc3], b"\r\n\r\n".to_vec()].concat(),
    ];
    for c in &crafted {
        check(&format!("raw {:?}", String::from_utf8_lossy(&c[..c.len().min(80)])), send_raw(a, c, true), true);
    }
    for _ in 0..40 {
        let len = rng.below(2000);
        let junk: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        check("random bytes", send_raw(a, &junk, true), true);
    }
    eprintln!("{n} hostile requests in {:.1} s, answered by status: {statuses:?}", t0.elapsed().as_secs_f64());
    assert_eq!(get(a, "/health").status, 200);
    assert_eq!(completion(a, "The capital of France is", 4), before, "the server's answers changed");
    let mut srv = srv;
    assert!(srv.child.try_wait().unwrap().is_none(), "the server exited");
}
