//! The Generator's rules one at a time, on hand-picked token streams: stop strings split across
//! tokens, held-back prefixes released, multi-byte characters, EOS, the limit, the penalty window.

use super::*;

/// Pushes `ids` one by one; returns each step's (text, end) and the finish.
fn steps(g: &mut Generator, ids: &[u32]) -> (Vec<(String, Option<StopReason>)>, String) {
    let mut out = Vec::new();
    for &id in ids {
        let s = g.push(tok(), id);
        let end = s.end;
        out.push((s.text, end));
        if end.is_some() {
            break;
        }
    }
    (out, g.finish())
}

fn pieces(ids: &[u32]) -> Vec<String> {
    ids.iter().map(|&i| String::from_utf8_lossy(tok().piece(i)).into_owned()).collect()
}

#[test]
fn stop_string_split_across_tokens_cuts_the_text() {
    let ids = ids("Hello User: hi");
    let p = pieces(&ids);
    // "User:" is more than one token: the stop string spans a token boundary.
    let first = p.iter().position(|s| s.contains("User")).unwrap();
    assert!(!p[first].contains(':'), "{p:?}");
    let mut g = Generator::new(&opts(&["User:"], None, false), &[]);
    let (s, rest) = steps(&mut g, &ids);
    let streamed: String = s.iter().map(|x| x.0.as_str()).collect();
    assert_eq!(streamed, "Hello ");
    assert_eq!(s.last().unwrap().1, Some(StopReason::StopString));
    // The token with "User" had its text held back: nothing of the stop string went out.
    assert!(s.iter().all(|x| !x.0.contains('U')), "{s:?}");
    assert_eq!(rest, "");
    assert_eq!(g.text(), "Hello ");
    assert_eq!(g.ended(), Some(StopReason::StopString));
    // The tokens up to the one completing the stop string are generated tokens.
    assert_eq!(g.tokens(), &ids[..s.len()]);
}

#[test]
fn held_back_prefix_is_released_when_no_stop_string_follows() {
    let ids = ids("Hello Use the force");
    let mut g = Generator::new(&opts(&["User:"], None, false), &[]);
    let (s, rest) = steps(&mut g, &ids);
    assert!(s.iter().all(|x| x.1.is_none()));
    let streamed: String = s.iter().map(|x| x.0.as_str()).collect::<String>() + &rest;
    assert_eq!(streamed, "Hello Use the force");
    // "Use" was held back once (a prefix of "User:"), then went out with the next piece.
    let mut g = Generator::new(&opts(&["User:"], None, false), &[]);
    let mut out = Vec::new();
    for &id in &ids {
        out.push(g.push(tok(), id).text);
        if g.text().ends_with("Use") {
            assert!(out.last().unwrap().is_empty() || !out.last().unwrap().ends_with("Use"), "{out:?}");
            assert_eq!(held_back(g.text(), &["User:".to_string()]), 3);
        }
    }
    // A prefix at the very end comes out of finish().
    let ids2 = self::ids("Hello Us");
    let mut g = Generator::new(&opts(&["User:"], None, false), &[]);
    let (s, rest) = steps(&mut g, &ids2);
    assert_eq!(s.iter().map(|x| x.0.as_str()).collect::<String>(), "Hello ");
    assert_eq!(rest, "Us");
    assert_eq!(g.text(), "Hello Us");
}

#[test]
fn multi_byte_characters_split_across_tokens_stream_whole() {
    let text = "日本語の文章と😀👍🏽の絵文字";
    let ids = ids(text);
    let mut g = Generator::new(&opts(&[], None, false), &[]);
    let mut split = 0;
    let mut out = String::new();
    for &id in &ids {
        let s = g.push(tok(), id);
        assert!(!s.text.contains('\u{FFFD}'), "{s:?}");
        split += usize::from(s.text.is_empty());
        out.push_str(&s.text);
    }
    assert!(split > 0, "no token split a character: the test proves nothing");
    out.push_str(&g.finish());
    assert_eq!(out, text);
    assert_eq!(g.text(), text);

    // A stop string made of a split character: cut before it, nothing of it streamed.
    let mut g = Generator::new(&opts(&["😀"], None, false), &[]);
    let (s, rest) = steps(&mut g, &ids);
    assert_eq!(s.iter().map(|x| x.0.as_str()).collect::<String>() + &rest, "日本語の文章と");
    assert_eq!(g.ended(), Some(StopReason::StopString));

    // Cut off mid-character (a limit), the held bytes flush as U+FFFD.
    let emoji = self::ids("😀");
    assert!(emoji.len() > 1);
    let mut g = Generator::new(&opts(&[], Some(1), false), &[]);
    assert!(!g.limit_reached());
    assert_eq!(g.push(tok(), emoji[0]).text, "");
    assert!(g.limit_reached());
    assert_eq!(g.finish(), "\u{FFFD}");
}

#[test]
fn eos_ends_without_text_unless_ignored() {
    let mut ids = ids("Hi there");
    let at = ids.len();
    ids.push(eos());
    ids.extend(self::ids(" more"));
    let mut g = Generator::new(&opts(&[], None, false), &[]);
    let (s, rest) = steps(&mut g, &ids);
    assert_eq!(s.last().unwrap(), &(String::new(), Some(StopReason::Eos)));
    assert_eq!(s.iter().map(|x| x.0.as_str()).collect::<String>() + &rest, "Hi there");
    // EOS is not a generated token, but it was sampled.
    assert_eq!(g.tokens(), &ids[..at]);
    assert_eq!(g.n_generated(), g.tokens().len());
    assert_eq!(g.n_sampled(), g.n_generated() + 1);

    let mut g = Generator::new(&opts(&[], None, true), &[]);
    let (s, rest) = steps(&mut g, &ids);
    assert!(s.iter().all(|x| x.1.is_none()));
    // The control token prints nothing (no --special), but is a generated token.
    assert_eq!(s.iter().map(|x| x.0.as_str()).collect::<String>() + &rest, "Hi there more");
    assert_eq!(g.tokens(), &ids[..]);
    assert_eq!(g.n_sampled(), ids.len());
}

#[test]
fn limit_counts_generated_tokens() {
    let ids = ids("one two three four five");
    let mut g = Generator::new(&opts(&[], Some(3), false), &[]);
    let mut n = 0;
    while !g.limit_reached() {
        assert!(g.push(tok(), ids[n]).end.is_none());
        n += 1;
    }
    assert_eq!(n, 3);
    assert_eq!(g.n_generated(), 3);
    assert_eq!(g.finish(), "");
    assert_eq!(g.text(), tok().decode(&ids[..3], true));
    assert!(Generator::new(&opts(&[], Some(0), false), &[]).limit_reached());
    assert!(!Generator::new(&opts(&[], None, false), &[]).limit_reached());
}

#[test]
fn prompt_tokens_enter_the_penalty_window() {
    // Greedy with a strong repetition penalty: the prompt's token is demoted.
    let mut logits = vec![0.0f32; 10];
    logits[3] = 3.0;
    logits[5] = 2.5;
    let o = GenerateOptions {
        sampler: SamplerOptions { repeat_penalty: 2.0, ..SamplerOptions::greedy() },
        ..GenerateOptions::default()
    };
    assert_eq!(Generator::new(&o, &[]).sample(&logits), 3);
    assert_eq!(Generator::new(&o, &[3]).sample(&logits), 5);
    // Generated tokens enter it too.
    let mut g = Generator::new(&o, &[]);
    g.push(tok(), 3);
    assert_eq!(g.sample(&logits), 5);
}
