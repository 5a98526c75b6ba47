use super::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;

fn p(s: &str) -> Param {
    let v: toml::Table = format!("x = {s}").parse().unwrap();
    Param::from_value(&v["x"], Path::new("."), true).unwrap()
}

#[test]
fn extraction_first_random_skip_and_fallback() {
    let body = b"<a href=\"ViewStory?storyId=11\"> <a href=\"ViewStory?storyId=22\"> <a href=\"ViewStory?storyId=33\">";
    let mut rng = SmallRng::seed_from_u64(1);
    let w = vec!["a".to_string()];
    let mut out = String::new();
    p(r#"{ extract = 'storyId=(\d+)' }"#).value(&Env::new(&[], body, "", &w), &mut rng, &mut out).unwrap();
    assert_eq!(out, "11");
    out.clear();
    p(r#"{ extract = 'storyId=(\d+)', skip = 1 }"#).value(&Env::new(&[], body, "", &w), &mut rng, &mut out).unwrap();
    assert_eq!(out, "22");
    let mut seen = std::collections::HashSet::new();
    for _ in 0..200 {
        out.clear();
        p(r#"{ extract = 'storyId=(\d+)', pick = "random" }"#).value(&Env::new(&[], body, "", &w), &mut rng, &mut out).unwrap();
        seen.insert(out.clone());
    }
    assert_eq!(seen.len(), 3);
    assert_eq!(p(r#"{ extract = 'nope=(\d+)' }"#).value(&Env::new(&[], body, "", &w), &mut rng, &mut out), Err(Fallback::Back));
    assert_eq!(
        p(r#"{ extract = 'nope=(\d+)', otherwise = "restart" }"#).value(&Env::new(&[], body, "", &w), &mut rng, &mut out),
        Err(Fallback::Restart)
    );
    out.clear();
    p(r#"{ extract = 'nope=(\d+)', otherwise = { uniform = [5, 5] } }"#).value(&Env::new(&[], body, "", &w), &mut rng, &mut out).unwrap();
    assert_eq!(out, "5");
}

#[test]
fn text_length_and_uniform_range_and_encoding() {
    let mut rng = SmallRng::seed_from_u64(2);
    let w = crate::load::workload::builtin_words();
    for _ in 0..500 {
        let mut out = String::new();
        p("{ text = [10, 99] }").value(&Env::new(&[], b"", "", &w), &mut rng, &mut out).unwrap();
        assert!((10..=99).contains(&out.len()), "{out:?}");
        out.clear();
        p("{ uniform = [3, 7] }").value(&Env::new(&[], b"", "", &w), &mut rng, &mut out).unwrap();
        let k: i64 = out.parse().unwrap();
        assert!((3..=7).contains(&k));
    }
    let mut e = String::new();
    encode_into("a b&c=d/é", &mut e);
    assert_eq!(e, "a%20b%26c%3Dd%2F%C3%A9");
    let mut out = String::new();
    let vars = vec![(Arc::from("k"), "42".to_string())];
    p(r#""user{k}""#).value(&Env::new(&vars, b"", "", &w), &mut rng, &mut out).unwrap();
    assert_eq!(out, "user42");
}

fn val(p: &Param, vars: &[(Arc<str>, String)], body: &[u8], url: &str, rng: &mut SmallRng) -> Result<String, Fallback> {
    let w = crate::load::workload::builtin_words();
    let mut out = String::new();
    p.value(&Env::new(vars, body, url, &w), rng, &mut out)?;
    Ok(out)
}

#[test]
fn digsyl_as_tpcw_defines_it() {
    let d = |s: &str, n: usize| {
        let mut o = String::new();
        digsyl(s, n, &mut o);
        o
    };
    assert_eq!(d("12", 0), "OGAL");
    assert_eq!(d("1234567890", 0), "OGALRIRESEATULINNGBA");
    assert_eq!(d("0", 0), "");
    assert_eq!(d("007", 0), "UL");
    assert_eq!(d("12", 7), "BABABABABAOGAL");
    assert_eq!(d("0", 3), "BABABA");
    // more digits than syllables: the low digits (as the Wisconsin RBE)
    assert_eq!(d("12345678", 7), "ALRIRESEATULIN");
    assert_eq!(d("", 7), "");
    assert_eq!(d("12a", 0), "");
    let mut rng = SmallRng::seed_from_u64(1);
    let vars = vec![(Arc::from("C_ID"), "4096".to_string())];
    assert_eq!(val(&p(r#"{ digsyl = "{C_ID}" }"#), &vars, b"", "", &mut rng).unwrap(), "REBANGAT");
    assert_eq!(val(&p(r#"{ digsyl = "{C_ID}", lower = true }"#), &vars, b"", "", &mut rng).unwrap(), "rebangat");
    for _ in 0..200 {
        let s = val(&p("{ digsyl = { nurand = [63, 0, 100] }, syllables = 7 }"), &[], b"", "", &mut rng).unwrap();
        assert_eq!(s.len(), 14, "{s}");
        assert!(s.starts_with("BABABABA"), "{s}");
    }
}

/// NURand(A, x, y): the exact distribution (enumerated over both uniform draws) vs 200k
/// draws, chi-square; and it is far from uniform.
#[test]
fn nurand_matches_its_exact_distribution() {
    let (a, x, y) = (63i64, 0i64, 100i64);
    let span = (y - x + 1) as usize;
    let mut exact = vec![0f64; span];
    for r1 in 0..=a {
        for r2 in x..=y {
            exact[(((r1 | r2) % (y - x + 1)) + x - x) as usize] += 1.0;
        }
    }
    let tot: f64 = exact.iter().sum();
    for e in exact.iter_mut() {
        *e /= tot;
    }
    let mut rng = SmallRng::seed_from_u64(42);
    let n = 200_000;
    let mut counts = vec![0f64; span];
    let param = p("{ nurand = [63, 0, 100] }");
    for _ in 0..n {
        let v: i64 = val(&param, &[], b"", "", &mut rng).unwrap().parse().unwrap();
        assert!((x..=y).contains(&v));
        counts[(v - x) as usize] += 1.0;
    }
    let mut chi2 = 0.0;
    let mut df = 0;
    for i in 0..span {
        let e = exact[i] * n as f64;
        if e > 0.0 {
            chi2 += (counts[i] - e).powi(2) / e;
            df += 1;
        } else {
            assert_eq!(counts[i], 0.0);
        }
    }
    df -= 1;
    // chi-square with df ~ 100: mean df, sd sqrt(2 df) ~ 14; 5 sd
    assert!(chi2 < df as f64 + 5.0 * (2.0 * df as f64).sqrt(), "chi2 {chi2} df {df}");
    // non-uniform: 63 = 0b111111 makes values with those bits set far more likely
    assert!(exact[63] > 5.0 * exact[64], "{} vs {}", exact[63], exact[64]);
}

#[test]
fn when_blank_and_extract_from_the_url() {
    let mut rng = SmallRng::seed_from_u64(3);
    let known = vec![(Arc::from("C_ID"), "17".to_string())];
    let anon = vec![(Arc::from("C_ID"), String::new())];
    let flag = p(r#"{ when = "{C_ID}", then = "Y", else = "N" }"#);
    assert_eq!(val(&flag, &known, b"", "", &mut rng).unwrap(), "Y");
    assert_eq!(val(&flag, &anon, b"", "", &mut rng).unwrap(), "N");
    let fname = p(r#"{ when = "{C_ID}", else = { text = [8, 15] } }"#);
    assert_eq!(val(&fname, &known, b"", "", &mut rng).unwrap(), "");
    assert!(val(&fname, &anon, b"", "", &mut rng).unwrap().len() >= 8);
    // blank: the empty string with probability 0.2
    let b = p("{ nurand = [1023, 1, 2880], blank = 0.2 }");
    let n = 20_000;
    let empty = (0..n).filter(|_| val(&b, &[], b"", "", &mut rng).unwrap().is_empty()).count() as f64 / n as f64;
    assert!((empty - 0.2).abs() < 0.015, "blank share {empty}");
    // extraction over the previous request's path, with a fixed value when it matches
    let iid = p(r#"{ extract = 'ProductDetail\?I_ID=(\d+)', from = "url", otherwise = "" }"#);
    assert_eq!(val(&iid, &[], b"I_ID=5", "/tpcw/ProductDetail?I_ID=42&C_ID=1", &mut rng).unwrap(), "42");
    assert_eq!(val(&iid, &[], b"ProductDetail?I_ID=5", "/tpcw/Home?C_ID=1", &mut rng).unwrap(), "");
    let add = p(r#"{ extract = '/ProductDetail\?', from = "url", value = "Y", otherwise = "N" }"#);
    assert_eq!(val(&add, &[], b"", "/tpcw/ProductDetail?I_ID=42", &mut rng).unwrap(), "Y");
    assert_eq!(val(&add, &[], b"", "/tpcw/Home", &mut rng).unwrap(), "N");
    assert!(!iid.reads_body() && p(r#"{ extract = 'I_ID=(\d+)' }"#).reads_body());
    // a cart refresh: from Product Detail its item; from the cart a random line's item
    // (extraction nested in `otherwise` and `when`); from anywhere else nothing
    let cart = p(
        r#"{ extract = '/ProductDetail\?I_ID=(\d+)', from = "url", otherwise = { when = { extract = '/ShoppingCart\?', from = "url", value = "1", otherwise = "" }, then = { extract = 'name="I_ID" value="(\d+)"', pick = "random", otherwise = "" } } }"#,
    );
    let body = br#"<input type="hidden" name="I_ID" value="7"><input type="hidden" name="I_ID" value="9">"#;
    assert_eq!(val(&cart, &[], body, "/tpcw/ProductDetail?I_ID=42", &mut rng).unwrap(), "42");
    assert_eq!(val(&cart, &[], body, "/tpcw/Home", &mut rng).unwrap(), "");
    let lines: std::collections::HashSet<String> =
        (0..50).map(|_| val(&cart, &[], body, "/tpcw/ShoppingCart?ADD_FLAG=N", &mut rng).unwrap()).collect();
    assert_eq!(lines, ["7".to_string(), "9".to_string()].into_iter().collect());
    assert!(cart.reads_body());
    // a dry run finds "1" (or the fixed value)
    let w = crate::load::workload::builtin_words();
    let mut out = String::new();
    add.value(&Env { vars: &[], body: b"", url: "", words: &w, dry: true }, &mut rng, &mut out).unwrap();
    assert_eq!(out, "Y");
}

#[test]
fn learn_takes_the_first_match_while_empty() {
    let v: toml::Table = r#"x = { learn = 'SHOPPING_ID=(\d+)' }
y = { nurand = [1023, 1, 2880], blank = 1.0, learn = 'C_ID=(\d+)' }"#
        .parse()
        .unwrap();
    let x = Param::parse(&v["x"], Path::new("."), false, true).unwrap();
    let y = Param::parse(&v["y"], Path::new("."), false, true).unwrap();
    let mut rng = SmallRng::seed_from_u64(5);
    assert_eq!(val(&x, &[], b"", "", &mut rng).unwrap(), "");
    assert_eq!(val(&y, &[], b"", "", &mut rng).unwrap(), "");
    assert_eq!(x.learn_from(b"<a href=\"/tpcw/Home?SHOPPING_ID=77&C_ID=3\">").as_deref(), Some("77"));
    assert_eq!(y.learn_from(b"<a href=\"/tpcw/Home?SHOPPING_ID=77&C_ID=3\">").as_deref(), Some("3"));
    assert_eq!(x.learn_from(b"nothing"), None);
    assert!(x.reads_body());
}

/// The error a parameter `s` (TOML) gives, parsed as a page parameter (`allow_extract`) or a
/// session variable (`allow_learn`).
fn fail(s: &str, allow_extract: bool, allow_learn: bool) -> ParamError {
    let v: toml::Table = format!("x = {s}").parse().unwrap();
    Param::parse(&v["x"], Path::new("."), allow_extract, allow_learn).expect_err(s)
}

/// (field, expected, got) of a WrongType or OutOfRange.
fn field_of(e: &ParamError) -> (&str, &str, &str) {
    match e {
        ParamError::WrongType { field, expected, got } | ParamError::OutOfRange { field, expected, got } => (field, expected, got),
        other => panic!("not a field error: {other:?}"),
    }
}

#[test]
fn templates_with_bad_placeholders_are_refused() {
    let e = fail(r#""/view?id={id""#, true, false);
    assert!(matches!(&e, ParamError::UnclosedBrace { template } if template == "/view?id={id"), "{e:?}");
    assert_eq!(e.to_string(), "unclosed '{' in \"/view?id={id\"");
    let e = fail(r#""/view?id={a b}""#, true, false);
    assert!(matches!(&e, ParamError::BadPlaceholder { name, .. } if name == "a b"), "{e:?}");
    assert_eq!(e.to_string(), "bad placeholder {a b} in \"/view?id={a b}\" (expected {name} with letters, digits, _)");
    let e = fail(r#""{}""#, true, false);
    assert!(matches!(&e, ParamError::BadPlaceholder { name, .. } if name.is_empty()), "{e:?}");
    // an integer is a literal template
    assert_eq!(val(&p("42"), &[], b"", "", &mut SmallRng::seed_from_u64(1)).unwrap(), "42");
}

#[test]
fn a_value_that_is_no_parameter_is_refused() {
    for (s, got) in [("1.5", "1.5"), ("true", "true"), ("[1, 2]", "[1, 2]")] {
        let e = fail(s, true, false);
        assert!(matches!(&e, ParamError::NotAParameter { got: g } if g == got), "{s}: {e:?}");
        assert_eq!(e.to_string(), format!("expected a string or a table like {{ uniform = [1, 10] }}, got {got}"));
    }
    let e = fail("{ blank = 0.5 }", true, false);
    assert!(matches!(e, ParamError::NoKind), "{e:?}");
    assert_eq!(e.to_string(), "expected a string or one of { uniform, nurand, words, words_file, text, choice, extract, digsyl, when }");
    let e = fail("{ uniform = [1, 2], nurand = [1, 1, 2] }", true, false);
    assert!(matches!(&e, ParamError::SeveralKinds { kinds } if kinds == &["nurand", "uniform"]), "{e:?}");
    assert_eq!(e.to_string(), "give one of uniform, nurand, words, words_file, text, choice, extract, digsyl, when (got nurand and uniform)");
}

#[test]
fn unknown_keys_are_named_with_what_the_kind_takes() {
    let e = fail("{ uniform = [1, 2], pick = \"first\" }", true, false);
    assert!(matches!(&e, ParamError::UnknownKey { kind, key, .. } if kind == "uniform" && key == "pick"), "{e:?}");
    assert_eq!(e.to_string(), "uniform: unknown key 'pick' (expected blank, lower)");
    // a session variable may also learn
    let e = fail("{ extract = '(x)', pik = \"first\" }", true, true);
    assert_eq!(e.to_string(), "extract: unknown key 'pik' (expected pick, skip, otherwise, from, value, blank, lower, learn)");
}

#[test]
fn values_of_the_wrong_type_say_what_was_expected() {
    for (s, field, expected, got) in [
        ("{ uniform = 3 }", "uniform", "[lo, hi] (integers)", "3"),
        ("{ uniform = [1, \"9\"] }", "uniform", "[lo, hi] (integers)", "[1, \"9\"]"),
        ("{ nurand = [63, 1] }", "nurand", "[A, x, y] (integers)", "[63, 1]"),
        ("{ text = [1.5, 3] }", "text", "[lo, hi] (lengths in bytes)", "[1.5, 3]"),
        ("{ words = \"a b\" }", "words", "a list of strings", "\"a b\""),
        ("{ choice = [1, 2] }", "choice", "a list of strings", "[1, 2]"),
        ("{ words_file = 3 }", "words_file", "a path (a string)", "3"),
        ("{ uniform = [1, 2], blank = \"often\" }", "blank", "a probability in [0, 1]", "\"often\""),
        ("{ uniform = [1, 2], lower = \"yes\" }", "lower", "true or false", "\"yes\""),
        ("{ digsyl = \"{k}\", syllables = \"7\" }", "digsyl syllables", "an integer in [0, 20]", "\"7\""),
        ("{ extract = 3 }", "extract", "a regex string", "3"),
        ("{ extract = '(x)', value = 1 }", "extract value", "a string", "1"),
        ("{ extract = '(x)', pick = \"last\" }", "extract pick", "\"first\" or \"random\"", "\"last\""),
        ("{ extract = '(x)', from = \"head\" }", "extract from", "\"body\" or \"url\"", "\"head\""),
        ("{ extract = '(x)', skip = \"1\" }", "extract skip", "an integer >= 0", "\"1\""),
        ("{ learn = 3 }", "learn", "a regex string", "3"),
    ] {
        let e = fail(s, true, true);
        assert!(matches!(e, ParamError::WrongType { .. }), "{s}: {e:?}");
        assert_eq!(field_of(&e), (field, expected, got), "{s}");
        assert_eq!(e.to_string(), format!("{field}: expected {expected}, got {got}"));
    }
    // a long value is cut in the message
    let e = fail(&format!("{{ uniform = \"{}\" }}", "x".repeat(200)), true, false);
    assert!(field_of(&e).2.len() < 70 && field_of(&e).2.ends_with("..."), "{e}");
}

#[test]
fn numbers_out_of_range_are_refused() {
    for (s, field, expected, got) in [
        ("{ uniform = [1, 2], blank = 2 }", "blank", "a probability in [0, 1]", "2"),
        ("{ uniform = [1, 2], blank = -0.1 }", "blank", "a probability in [0, 1]", "-0.1"),
        ("{ digsyl = \"{k}\", syllables = -1 }", "digsyl syllables", "an integer in [0, 20]", "-1"),
        ("{ digsyl = \"{k}\", syllables = 21 }", "digsyl syllables", "an integer in [0, 20]", "21"),
        ("{ extract = '(x)', skip = -1 }", "extract skip", "an integer >= 0", "-1"),
        ("{ text = [-1, 5] }", "text", "lengths >= 0", "[-1, 5]"),
    ] {
        let e = fail(s, true, false);
        assert!(matches!(e, ParamError::OutOfRange { .. }), "{s}: {e:?}");
        assert_eq!(field_of(&e), (field, expected, got), "{s}");
    }
    let e = fail("{ uniform = [9, 1] }", true, false);
    assert!(matches!(&e, ParamError::Reversed { kind, lo: 9, hi: 1 } if kind == "uniform"), "{e:?}");
    assert_eq!(e.to_string(), "uniform: lo 9 > hi 1");
    let e = fail("{ text = [20, 10] }", true, false);
    assert!(matches!(&e, ParamError::Reversed { kind, lo: 20, hi: 10 } if kind == "text"), "{e:?}");
    for (s, a, x, y) in [("{ nurand = [63, 10, 1] }", 63, 10, 1), ("{ nurand = [-1, 0, 9] }", -1, 0, 9)] {
        let e = fail(s, true, false);
        assert!(matches!(e, ParamError::NURand { a: ea, x: ex, y: ey } if (ea, ex, ey) == (a, x, y)), "{s}: {e:?}");
    }
    assert_eq!(fail("{ nurand = [63, 10, 1] }", true, false).to_string(), "nurand: expected A >= 0 and x <= y, got [63, 10, 1]");
    // the edges are accepted
    for ok in ["{ uniform = [1, 1], blank = 1 }", "{ digsyl = \"{k}\", syllables = 20 }", "{ extract = '(x)', skip = 0 }", "{ text = [0, 0] }"] {
        let v: toml::Table = format!("x = {ok}").parse().unwrap();
        Param::parse(&v["x"], Path::new("."), true, false).expect(ok);
    }
}

#[test]
fn word_lists_must_have_words() {
    let e = fail("{ words = [] }", true, false);
    assert!(matches!(&e, ParamError::EmptyList { kind } if kind == "words"), "{e:?}");
    assert_eq!(e.to_string(), "words: the list is empty");
    assert!(matches!(&fail("{ choice = [] }", true, false), ParamError::EmptyList { kind } if kind == "choice"));
    let dir = std::env::temp_dir().join(format!("tierscope-params-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("blank.txt"), "\n  \n").unwrap();
    let parse_in = |s: &str| {
        let v: toml::Table = format!("x = {s}").parse().unwrap();
        Param::parse(&v["x"], &dir, true, false)
    };
    let e = parse_in("{ words_file = \"nope.txt\" }").unwrap_err();
    assert!(
        matches!(&e, ParamError::WordsFile { path, error } if *path == dir.join("nope.txt") && error.kind() == std::io::ErrorKind::NotFound),
        "{e:?}"
    );
    assert!(e.to_string().starts_with(&format!("words_file {}: No such file", dir.join("nope.txt").display())), "{e}");
    let e = parse_in("{ words_file = \"blank.txt\" }").unwrap_err();
    assert!(matches!(&e, ParamError::NoWords { path } if *path == dir.join("blank.txt")), "{e:?}");
    assert_eq!(e.to_string(), format!("words_file {}: no words", dir.join("blank.txt").display()));
    std::fs::write(dir.join("dict.txt"), "alpha 3\nbeta 1\n").unwrap();
    assert!(matches!(parse_in("{ words_file = \"dict.txt\" }").unwrap(), Param::Words(w) if *w == ["alpha", "beta"]));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn regexes_must_compile_and_capture() {
    let e = fail("{ extract = 'id=(\\d+' }", true, false);
    assert!(matches!(e, ParamError::BadRegex { kind: "extract", .. }), "{e:?}");
    assert!(e.to_string().starts_with("extract: bad regex: "), "{e}");
    let e = fail("{ learn = '(' }", false, true);
    assert!(matches!(e, ParamError::BadRegex { kind: "learn", .. }), "{e:?}");
    let e = fail("{ extract = 'x' }", true, false);
    assert!(matches!(&e, ParamError::NoCaptureGroup { kind: "extract", regex } if regex == "x"), "{e:?}");
    assert_eq!(e.to_string(), "extract: the regex 'x' needs a capture group (...) (or give value = \"...\")");
    let e = fail("{ learn = 'C_ID=\\d+' }", false, true);
    assert!(matches!(&e, ParamError::NoCaptureGroup { kind: "learn", regex } if regex == "C_ID=\\d+"), "{e:?}");
    assert_eq!(e.to_string(), "learn: the regex 'C_ID=\\d+' needs a capture group (...)");
    // with a fixed value, no group is needed
    let v: toml::Table = "x = { extract = 'x', value = \"Y\" }".parse().unwrap();
    Param::parse(&v["x"], Path::new("."), true, false).unwrap();
}

#[test]
fn extract_and_learn_only_where_they_can_work() {
    let e = fail("{ extract = '(x)' }", false, true);
    assert!(matches!(e, ParamError::ExtractOutsidePage), "{e:?}");
    assert_eq!(e.to_string(), "extract is only possible in page params/form (there is no previous response for a session variable)");
    let e = fail("{ learn = 'C_ID=(\\d+)' }", true, false);
    assert!(matches!(e, ParamError::LearnOutsideSession), "{e:?}");
    assert_eq!(e.to_string(), "learn is only possible for session variables ([session_vars] or a session type's vars)");
}

#[test]
fn nested_errors_say_where() {
    let e = fail("{ digsyl = { uniform = [5, 1] } }", true, false);
    assert!(matches!(&e, ParamError::Nested { within: "digsyl", .. }), "{e:?}");
    assert!(matches!(e.innermost(), ParamError::Reversed { .. }), "{e:?}");
    assert_eq!(e.to_string(), "digsyl: uniform: lo 5 > hi 1");
    let e = fail("{ when = \"{k}\", then = { extract = 'a(b)' } }", false, false);
    assert!(matches!(&e, ParamError::Nested { within: "when then", .. }), "{e:?}");
    assert!(matches!(e.innermost(), ParamError::ExtractOutsidePage));
    assert!(e.to_string().starts_with("when then: extract is only possible"), "{e}");
    let e = fail("{ when = \"{k}\", else = { text = [3] } }", true, false);
    assert_eq!(e.to_string(), "when else: text: expected [lo, hi] (lengths in bytes), got [3]");
    let e = fail("{ when = { digsyl = \"{k\" } }", true, false);
    assert_eq!(e.to_string(), "when: digsyl: unclosed '{' in \"{k\"");
    assert!(matches!(e.innermost(), ParamError::UnclosedBrace { .. }));
    let e = fail("{ extract = '(x)', otherwise = { uniform = 3 } }", true, false);
    assert!(matches!(&e, ParamError::Nested { within: "extract otherwise", .. }), "{e:?}");
    assert_eq!(e.to_string(), "extract otherwise: uniform: expected [lo, hi] (integers), got 3 (or \"back\" / \"restart\")");
}
