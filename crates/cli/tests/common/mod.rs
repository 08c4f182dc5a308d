//! Helpers the server tests share: `sift serve` started on a loopback port with the real
//! SmolLM2-135M model, and a minimal HTTP client over std's `TcpStream`.
#![allow(dead_code)]

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// The sift binary, with the builtin development-machine profile (tests do not probe the
/// machine they run on, nor learn from their runs: `machine_profile_*` tests that part).
pub fn sift_cmd() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sift"));
    c.env("SIFT_PROFILE", "sift-dev-2core");
    c
}

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn model() -> PathBuf {
    let p = std::env::var_os("SIFT_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    assert!(p.exists(), "{} missing: run scripts/fetch-model.sh first", p.display());
    p
}

pub struct Server {
    pub child: Child,
    pub addr: String,
    pub log: Arc<Mutex<String>>,
}

impl Server {
    pub fn start(args: &[&str]) -> Server {
        let m = model();
        let mut cmd = sift_cmd();
        cmd.args(["serve", "--port", "0", "-t", "2"]);
        if !args.contains(&"-m") {
            cmd.args(["-m", m.to_str().unwrap()]);
        }
        Server::spawn(cmd.args(args))
    }

    /// A server started by another command line (`argv[0]` and its arguments).
    pub fn start_command(argv: &[&str]) -> Server {
        let mut cmd = Command::new(argv[0]);
        cmd.env("SIFT_PROFILE", "sift-dev-2core").args(&argv[1..]);
        Server::spawn(&mut cmd)
    }

    pub fn spawn(cmd: &mut Command) -> Server {
        let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("run sift serve");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let l2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(a) = line.strip_prefix("sift: listening on http://") {
                    let _ = tx.send(a.split(' ').next().unwrap_or_default().to_string());
                }
                let mut g = l2.lock().unwrap();
                g.push_str(&line);
                g.push('\n');
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                panic!("the server did not start:\n{}", log.lock().unwrap());
            }
        };
        Server { child, addr, log }
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: String,
    pub body: String,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// The `data:` payloads of an SSE body.
    pub fn events(&self) -> Vec<String> {
        self.body.lines().filter_map(|l| l.strip_prefix("data: ")).map(String::from).collect()
    }
}

pub fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let n = usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        let start = eol + 2;
        out.extend_from_slice(&b[start..(start + n).min(b.len())]);
        b = &b[(start + n + 2).min(b.len())..];
    }
    out
}

pub fn parse(raw: &[u8]) -> Resp {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or_else(|| {
        panic!("no HTTP response: {:?}", String::from_utf8_lossy(raw));
    });
    let headers = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = headers.split(' ').nth(1).unwrap().parse().unwrap();
    let body = &raw[split + 4..];
    let body =
        if headers.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(body) } else { body.to_vec() };
    Resp { status, headers, body: String::from_utf8_lossy(&body).into_owned() }
}

pub fn connect(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if !body.is_empty() {
        head.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len()));
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = s.write_all(head.as_bytes());
    let _ = s.write_all(body);
    s
}

pub fn request(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    let mut s = connect(addr, method, path, headers, body);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    parse(&raw)
}

pub fn post(addr: &str, path: &str, body: &Value) -> Resp {
    request(addr, "POST", path, &[], body.to_string().as_bytes())
}

pub fn get(addr: &str, path: &str) -> Resp {
    request(addr, "GET", path, &[], b"")
}

pub fn assert_error(r: &Resp, status: u16, code_or_type: &str) {
    assert_eq!(r.status, status, "{r:?}");
    let v = r.json();
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
    assert!(e["code"] == code_or_type || e["type"] == code_or_type, "expected {code_or_type}: {v}");
}

pub fn completion(addr: &str, prompt: &str, n: usize) -> String {
    let r = post(addr, "/v1/completions", &json!({"prompt": prompt, "max_tokens": n, "temperature": 0}));
    assert_eq!(r.status, 200, "{r:?}");
    r.json()["choices"][0]["text"].as_str().unwrap().to_string()
}

pub fn metric(addr: &str, name: &str) -> f64 {
    let t = get(addr, "/metrics").body;
    t.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in {t}"))
        .parse()
        .unwrap()
}
