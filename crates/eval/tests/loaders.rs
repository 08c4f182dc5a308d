//! Loaders on small real excerpts (tests/fixtures, see the README there) and on malformed copies
//! of them: every bad input is an error naming the file and the line, never a panic.

use sift_eval::data::{detect_format, Format, LoadError, TaskKind};
use sift_eval::load;
use sift_eval::prompt::requests;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn read(name: &str) -> String {
    std::fs::read_to_string(fixture(name)).unwrap()
}

/// A fresh temporary directory for one test.
fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sift-eval-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Loads `text` as file `name` and expects an error mentioning `name:line`.
fn expect_error(tag: &str, name: &str, text: &str, line: usize, needle: &str) {
    let d = tmpdir(tag);
    let p = write(&d, name, text);
    let e = load(&p, None, None).expect_err("malformed input must be an error");
    let msg = e.to_string();
    eprintln!("{tag}: {msg}");
    assert!(matches!(e, LoadError::Malformed { .. }), "{msg}");
    assert!(msg.contains(&format!("{name}:{line}:")), "expected '{name}:{line}:' in: {msg}");
    assert!(msg.contains(needle), "expected '{needle}' in: {msg}");
}

#[test]
fn hellaswag_excerpt() {
    let ds = load(&fixture("hellaswag-val-first40.txt"), None, None).unwrap();
    assert_eq!(ds.format, Format::HellaSwag);
    assert_eq!(ds.task, TaskKind::HellaSwag);
    assert_eq!(ds.items.len(), 40);
    let it = &ds.items[0];
    assert_eq!(it.question, "Roof shingle removal: A man is sitting on a roof. he");
    assert_eq!(it.gold, [3]);
    assert_eq!(it.options[3], "starts pulling up roofing on a roof.");
    assert_eq!(ds.items[39].line, 235);
    let r = requests(&ds.task, it).unwrap();
    assert_eq!(r[3].context, it.question);
    assert_eq!(r[3].continuation, " starts pulling up roofing on a roof.");
    assert_eq!(r[3].norm_len, "starts pulling up roofing on a roof.".len());
    // Golds are spread over all four positions (a scorer biased to one position cannot score).
    for g in 0..4 {
        assert!(ds.items.iter().any(|i| i.gold == [g]));
    }
}

#[test]
fn mc_excerpts_and_task_detection() {
    let arc = load(&fixture("arc-easy-test-first40.jsonl"), None, None).unwrap();
    assert_eq!((arc.format, &arc.task, arc.items.len()), (Format::Mc, &TaskKind::Arc, 40));
    assert_eq!(arc.name, "arc");
    assert_eq!(arc.items[1].options[1], "breathing mask");
    assert_eq!(arc.items[1].gold, [1]);
    let r = requests(&arc.task, &arc.items[1]).unwrap();
    assert_eq!(
        r[1].context,
        "Question: Which piece of safety equipment is used to keep mold spores from entering the respiratory system?\nAnswer:"
    );
    assert_eq!(r[1].continuation, " breathing mask");

    let wg = load(&fixture("winogrande-test-first6.jsonl"), None, None).unwrap();
    assert_eq!(wg.task, TaskKind::WinoGrande);
    let r = requests(&wg.task, &wg.items[0]).unwrap();
    assert_eq!(r[0].context, "Sarah was a much better surgeon than Maria so Sarah");
    assert_eq!(r[1].context, "Sarah was a much better surgeon than Maria so Maria");
    assert_eq!(r[0].continuation, " always got the easier cases.");

    let ob = load(&fixture("openbookqa-test-first4.jsonl"), None, None).unwrap();
    assert_eq!(ob.task, TaskKind::OpenBookQa);
    let r = requests(&ob.task, &ob.items[1]).unwrap();
    assert_eq!(r[0].context, "There is most likely going to be fog around:");
    assert_eq!(r[0].continuation, " a marsh");

    let mm = load(&fixture("mmlu-high-school-biology.jsonl"), None, None).unwrap();
    assert_eq!(mm.task, TaskKind::Mmlu { subject: "high school biology".into() });
    let r = requests(&mm.task, &mm.items[0]).unwrap();
    assert!(r[0]
        .context
        .starts_with("The following are multiple choice questions (with answers) about high school biology.\n\n"));
    assert!(r[0].context.ends_with("\nAnswer:"));
    assert!(r[0].context.contains("\nA. ") && r[0].context.contains("\nD. "));
    assert_eq!(r[2].continuation, " C");
}

#[test]
fn task_from_config_yaml_and_overrides() {
    let d = tmpdir("config");
    std::fs::write(d.join("config.yaml"), "abstract: x\ntask_name: mmlu-college-physics\nversion: v1\n").unwrap();
    let p = write(&d, "test.json", &read("mmlu-high-school-biology.jsonl"));
    let ds = load(&p, None, None).unwrap();
    assert_eq!(ds.task, TaskKind::Mmlu { subject: "college physics".into() });
    assert_eq!(ds.name, "mmlu-college-physics");
    // --task wins over config.yaml.
    let ds = load(&p, None, Some(TaskKind::parse("arc", Some(&p)).unwrap())).unwrap();
    assert_eq!(ds.task, TaskKind::Arc);
    // A JSON-lines file with an unknown name and extension: detected by content, generic prompt.
    let q = write(&tmpdir("generic"), "questions.data", &read("arc-easy-test-first40.jsonl"));
    assert_eq!(detect_format(&q, &read("arc-easy-test-first40.jsonl")), Format::Mc);
    assert_eq!(load(&q, None, None).unwrap().task, TaskKind::Generic);
    // --format overrides the extension.
    let t = write(&tmpdir("fmt"), "arc-easy.txt", &read("arc-easy-test-first40.jsonl"));
    assert!(load(&t, None, None).is_err(), "a .txt file is read as HellaSwag text by default");
    assert_eq!(load(&t, Some(Format::Mc), None).unwrap().items.len(), 40);
    // The HellaSwag text format cannot hold another task.
    let e = load(&fixture("hellaswag-val-first40.txt"), None, Some(TaskKind::Arc)).unwrap_err();
    assert!(e.to_string().contains("only holds HellaSwag"), "{e}");
    assert_eq!(
        TaskKind::parse("mmlu_us_foreign_policy", None),
        Some(TaskKind::Mmlu { subject: "us foreign policy".into() })
    );
    assert_eq!(TaskKind::parse("nonsense", None), None);
}

#[test]
fn hellaswag_malformed() {
    let good = read("hellaswag-val-first40.txt");
    let lines: Vec<&str> = good.lines().collect();
    let with = |i: usize, s: &str| {
        let mut l = lines.clone();
        l[i] = s;
        l.join("\n") + "\n"
    };
    // Gold index of the 3rd task (line 14) out of range, not a number, negative.
    expect_error("hs-gold4", "hs.txt", &with(13, "4"), 14, "gold index '4'");
    expect_error("hs-goldx", "hs.txt", &with(13, "three"), 14, "gold index 'three'");
    expect_error("hs-goldneg", "hs.txt", &with(13, "-1"), 14, "gold index '-1'");
    // One line missing at the end: the last task (starting at line 235) is incomplete.
    expect_error("hs-count", "hs.txt", &(lines[..239].join("\n") + "\n"), 235, "not a multiple of 6");
    // A line missing in the middle (an ending of task 2, line 9): the count is off...
    let mut l = lines.clone();
    l.remove(8);
    expect_error("hs-shift", "hs.txt", &(l.join("\n") + "\n"), 235, "not a multiple of 6");
    // ...and with a line added at the end to hide that, task 3's "gold" (line 14) is an ending.
    let mut l = lines.clone();
    l.remove(8);
    l.push("x");
    expect_error("hs-shift2", "hs.txt", &(l.join("\n") + "\n"), 14, "gold index 'are then shown");
    // An empty ending.
    expect_error("hs-empty", "hs.txt", &with(20, "  "), 21, "ending line is empty");
    // Not UTF-8.
    let mut bytes = good.clone().into_bytes();
    bytes[300] = 0xff;
    let d = tmpdir("hs-utf8");
    std::fs::write(d.join("hs.txt"), &bytes).unwrap();
    let e = load(&d.join("hs.txt"), None, None).unwrap_err().to_string();
    assert!(e.contains("hs.txt:") && e.contains("UTF-8"), "{e}");
    // A missing file.
    let e = load(&d.join("nope.txt"), None, None).unwrap_err();
    assert!(matches!(e, LoadError::Io { .. }) && e.to_string().contains("nope.txt"), "{e}");
    // An empty file.
    let e = load(&write(&d, "empty.txt", ""), None, None).unwrap_err();
    assert!(e.to_string().contains("no items"), "{e}");
}

#[test]
fn mc_malformed() {
    let good = read("arc-easy-test-first40.jsonl");
    let lines: Vec<&str> = good.lines().collect();
    let with = |i: usize, s: &str| {
        let mut l: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
        l[i] = s.to_string();
        l.join("\n") + "\n"
    };
    let cut = &lines[4][..lines[4].len() / 2];
    expect_error("mc-json", "arc.jsonl", &with(4, cut), 5, "invalid JSON");
    expect_error("mc-notjson", "arc.jsonl", &with(4, "{not json}"), 5, "invalid JSON");
    expect_error(
        "mc-field",
        "arc.jsonl",
        &with(2, r#"{"centerpiece": "q", "options": ["a", "b"]}"#),
        3,
        "correct_options_idx",
    );
    expect_error(
        "mc-range",
        "arc.jsonl",
        &with(2, r#"{"centerpiece": "q", "options": ["a", "b"], "correct_options_idx": [2]}"#),
        3,
        "out of range",
    );
    expect_error(
        "mc-neg",
        "arc.jsonl",
        &with(2, r#"{"centerpiece": "q", "options": ["a", "b"], "correct_options_idx": [-1]}"#),
        3,
        "out of range",
    );
    expect_error(
        "mc-nogold",
        "arc.jsonl",
        &with(2, r#"{"centerpiece": "q", "options": ["a", "b"], "correct_options_idx": []}"#),
        3,
        "is empty",
    );
    expect_error(
        "mc-one",
        "arc.jsonl",
        &with(2, r#"{"centerpiece": "q", "options": ["a"], "correct_options_idx": [0]}"#),
        3,
        "at least 2",
    );
    expect_error(
        "mc-type",
        "arc.jsonl",
        &with(2, r#"{"centerpiece": "q", "options": "a b", "correct_options_idx": [0]}"#),
        3,
        "invalid JSON",
    );
    expect_error(
        "mc-emptyopt",
        "arc.jsonl",
        &with(2, r#"{"centerpiece": "q", "options": ["a", ""], "correct_options_idx": [0]}"#),
        3,
        "option 1 is empty",
    );
    // Blank lines are skipped, and line numbers still count them.
    let spaced = format!("\n{}\n\n{}\n", lines[0], "[1, 2]");
    expect_error("mc-blank", "arc.jsonl", &spaced, 4, "invalid JSON");
    // WinoGrande without a blank to fill.
    let wg = read("winogrande-test-first6.jsonl").replacen(" _ ", " he ", 1);
    expect_error("wg-nofill", "winogrande.jsonl", &wg, 1, "'_'");
}

#[test]
fn few_shot_examples_from_the_dev_split_beside_the_file() {
    use sift_eval::load_shots;
    use sift_eval::prompt::requests_with_shots;
    // MMLU's layout: SUBJECT/test.json and SUBJECT/dev.json (here both real excerpts).
    let d = tmpdir("shots").join("mmlu").join("high-school-biology");
    std::fs::create_dir_all(&d).unwrap();
    let text = read("mmlu-high-school-biology.jsonl");
    let lines: Vec<&str> = text.lines().collect();
    let p = write(&d, "test.json", &lines[3..].join("\n"));
    let ds = load(&p, None, None).unwrap();
    // No dev.json yet: the error names the file and the flag that chooses another.
    let e = load_shots(&ds, 3, None).unwrap_err().to_string();
    assert!(e.contains("dev.json") && e.contains("--shots-file"), "{e}");
    write(&d, "dev.json", &lines[..3].join("\n"));
    let shots = load_shots(&ds, 3, None).unwrap();
    assert_eq!(shots.len(), 3);
    assert!(load_shots(&ds, 0, None).unwrap().is_empty());
    let e = load_shots(&ds, 4, None).unwrap_err().to_string();
    assert!(e.contains("needs 4 examples, the file holds 3"), "{e}");
    let e = load_shots(&ds, 1, Some(&p)).unwrap_err().to_string();
    assert!(e.contains("evaluated file itself"), "{e}");
    // The 3-shot prompt: the description once, each example answered, then the question.
    let r = requests_with_shots(&ds.task, &shots, &ds.items[0]).unwrap();
    let ctx = &r[0].context;
    assert!(
        ctx.starts_with("The following are multiple choice questions (with answers) about high school biology.\n\n")
    );
    assert_eq!(ctx.matches("The following are").count(), 1);
    assert_eq!(ctx.matches("\nAnswer: ").count(), 3, "{ctx}");
    assert!(ctx.ends_with(&requests(&ds.task, &ds.items[0]).unwrap()[0].context.rsplit("\n\n").next().unwrap()));
    let gold = ["A", "B", "C", "D"][shots[0].gold[0]];
    assert!(ctx.contains(&format!("\nAnswer: {gold}\n\n")), "{ctx}");
}
