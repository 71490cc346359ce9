//! Tab's behaviour end to end without a model: plans, stop rules, the cache, neighbours.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::Cache;
use crate::context::{Budget, Context, Snippet, approx_tokens, assemble};
use crate::post::{Mode, Stopper, mode};
use crate::template::{Family, Template};

fn ctx() -> Context {
    Context {
        prefix: "def add(a, b):\n    ".to_owned(),
        suffix: "\n\nprint(add(1, 2))\n".to_owned(),
        path: Some("src/calc.py".to_owned()),
        repo: Some("calc".to_owned()),
        snippets: vec![Snippet {
            path: "src/util.py".to_owned(),
            text: "def twice(x):\n    return 2 * x\n".to_owned(),
        }],
        middle: String::new(),
    }
}

#[test]
fn fim_templates_per_family() {
    let c = ctx();
    assert_eq!(
        Family::QwenCoder.render(&c),
        "<|repo_name|>calc\n<|file_sep|>src/util.py\ndef twice(x):\n    return 2 * x\n<|file_sep|>src/calc.py\n\
         <|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n\nprint(add(1, 2))\n<|fim_middle|>"
    );
    assert_eq!(
        Family::StarCoder2.render(&c),
        "<repo_name>calc\n<file_sep>src/util.py\ndef twice(x):\n    return 2 * x\n<file_sep>src/calc.py\n\
         <fim_prefix>def add(a, b):\n    <fim_suffix>\n\nprint(add(1, 2))\n<fim_middle>"
    );
    assert_eq!(
        Family::DeepSeekCoder.render(&c),
        "<｜fim▁begin｜># Path: src/util.py\n# def twice(x):\n#     return 2 * x\ndef add(a, b):\n    \
         <｜fim▁hole｜>\n\nprint(add(1, 2))\n<｜fim▁end｜>"
    );
    assert_eq!(
        Family::CodeLlama.render(&c),
        "<PRE> # Path: src/util.py\n# def twice(x):\n#     return 2 * x\ndef add(a, b):\n     <SUF>\n\nprint(add(1, 2))\n <MID>"
    );
    let custom = Family::Custom(Template {
        prompt: "{context}<fill>{prefix}<hole>{suffix}<end>".to_owned(),
        stop: vec!["<eof>".to_owned()],
    });
    assert_eq!(
        custom.render(&c),
        "# Path: src/util.py\n# def twice(x):\n#     return 2 * x\n<fill>def add(a, b):\n    <hole>\n\nprint(add(1, 2))\n<end>"
    );
    assert_eq!(custom.stop(), vec!["<eof>"]);
    // Without other files or a path, the plain FIM prompt.
    let bare = Context { prefix: "a".into(), suffix: "b".into(), ..Context::default() };
    assert_eq!(Family::QwenCoder.render(&bare), "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>");
}

#[test]
fn families_are_guessed_from_model_names() {
    assert_eq!(Family::guess("qwen2.5-coder-1.5b-instruct-q4"), Some(Family::QwenCoder));
    assert_eq!(Family::guess("bigcode/starcoder2-3b"), Some(Family::StarCoder2));
    assert_eq!(Family::guess("deepseek-coder-1.3b-base"), Some(Family::DeepSeekCoder));
    assert_eq!(Family::guess("CodeLlama-7b-hf"), Some(Family::CodeLlama));
    assert_eq!(Family::guess("smollm2-135m-instruct"), None);
    assert!(Family::QwenCoder.stop().contains(&"<|endoftext|>".to_owned()));
}

#[test]
fn single_or_multi_line_from_the_cursor() {
    // Middle of a line: the rest of it only.
    assert_eq!(mode("x = foo(", "a)\n"), Mode::SingleLine);
    // Only closing brackets after the cursor: still the end of a line.
    assert_eq!(mode("x = foo(", ")\n"), Mode::SingleLine);
    // Empty line after a block opener: the body.
    assert_eq!(mode("def f(x):\n    ", "\n"), Mode::MultiLine);
    assert_eq!(mode("fn f() {\n    ", "\n}\n"), Mode::MultiLine);
    // At the end of a line that opens a block.
    assert_eq!(mode("if x > 0 {", "\n"), Mode::MultiLine);
    // Inside a statement list: one line.
    assert_eq!(mode("    a = 1\n    ", "\n    b = 2\n"), Mode::SingleLine);
    assert_eq!(mode("    a = 1\n    b", "\n"), Mode::SingleLine);
}

fn run(mode: Mode, prefix: &str, suffix: &str, chunks: &[&str]) -> (String, usize) {
    let mut s = Stopper::new(mode, prefix, suffix, Family::QwenCoder.stop());
    let mut fed = 0;
    for c in chunks {
        fed += 1;
        if s.push(c) {
            break;
        }
    }
    (s.finish(), fed)
}

#[test]
fn single_line_stops_at_the_end_of_the_line() {
    let (out, fed) = run(Mode::SingleLine, "total = ", "\n", &["sum(", "values)", "\n", "print(total)"]);
    assert_eq!(out, "sum(values)");
    assert_eq!(fed, 3, "generation stops as soon as the line ends");
    // A fresh line at once: nothing to suggest on this one.
    assert_eq!(run(Mode::SingleLine, "x = 1", "\n", &["\nfoo"]).0, "");
}

#[test]
fn stop_strings_end_the_suggestion() {
    assert_eq!(run(Mode::SingleLine, "x = ", "\n", &["42<|endoftext|>garbage"]).0, "42");
    assert_eq!(run(Mode::MultiLine, "def f():\n    ", "\n", &["return 1\n<|file_sep|>other.py\n"]).0, "return 1");
}

#[test]
fn multi_line_stops_where_the_block_ends() {
    let prefix = "def f(xs):\n    ";
    let body = "total = 0\n    for x in xs:\n        total += x\n    return total\n\ndef g():\n    pass\n";
    let (out, _) = run(Mode::MultiLine, prefix, "\n", &[body]);
    assert_eq!(out, "total = 0\n    for x in xs:\n        total += x\n    return total");
    // At the end of an opener line: the body, indented under it, and no more.
    let (out, _) = run(Mode::MultiLine, "if x:", "\n", &["\n    y = 1\n    z = 2\nprint(y)\n"]);
    assert_eq!(out, "\n    y = 1\n    z = 2");
    // Two blank lines end it too.
    let (out, _) = run(Mode::MultiLine, prefix, "\n", &["a = 1\n\n\n    b = 2\n"]);
    assert_eq!(out, "a = 1");
    // At most max_lines.
    let mut s = Stopper::new(Mode::MultiLine, prefix, "\n", vec![]).max_lines(2);
    assert!(s.push("a = 1\n    b = 2\n    c = 3\n    d = 4\n"));
    assert_eq!(s.finish(), "a = 1\n    b = 2\n    c = 3");
}

#[test]
fn a_bracket_the_suffix_closes_ends_the_suggestion() {
    // `foo(|)`: the model writes `a, b)` and more; the `)` is already there.
    let (out, fed) = run(Mode::SingleLine, "x = foo(", ")\n", &["a, ", "b)", " + 1\n"]);
    assert_eq!(out, "a, b");
    assert_eq!(fed, 2);
    // Brackets inside strings do not count.
    assert_eq!(run(Mode::SingleLine, "x = foo(", ")\n", &["\")\", b)\n"]).0, "\")\", b");
    // Balanced brackets are kept.
    assert_eq!(run(Mode::SingleLine, "x = ", "\n", &["foo(bar(1), [2])\n"]).0, "foo(bar(1), [2])");
}

#[test]
fn text_the_suffix_already_has_is_trimmed() {
    // The whole rest of the line repeated.
    assert_eq!(run(Mode::SingleLine, "let x = ", " + 1;\n", &["y + 1;\n"]).0, "y");
    // Closing punctuation repeated.
    assert_eq!(run(Mode::SingleLine, "call(\"", "\");\n", &["name\");\n"]).0, "name");
    // A partial word of the suffix is not trimmed.
    assert_eq!(run(Mode::SingleLine, "a = ", "bar\n", &["b\n"]).0, "b");
    assert_eq!(run(Mode::SingleLine, "a = ", "bar\n", &["bar\n"]).0, "");
    // Lines after the cursor written again are dropped.
    let (out, _) = run(Mode::MultiLine, "def f():\n    ", "\n    return y\n", &["y = 2\n    return y\n"]);
    assert_eq!(out, "y = 2");
}

#[test]
fn the_cache_serves_the_rest_of_a_suggestion_while_typing_it() {
    let mut cache = Cache::default();
    let prefix = "fn main() {\n    let total = ";
    cache.put("a.rs", prefix, "\n}\n", "values.iter().sum();");
    assert_eq!(cache.get("a.rs", prefix, "\n}\n").as_deref(), Some("values.iter().sum();"));
    assert_eq!(cache.get("a.rs", &format!("{prefix}val"), "\n}\n").as_deref(), Some("ues.iter().sum();"));
    // Typed something else, another document, another rest of line, typed it all: no.
    assert_eq!(cache.get("a.rs", &format!("{prefix}x"), "\n}\n"), None);
    assert_eq!(cache.get("b.rs", prefix, "\n}\n"), None);
    assert_eq!(cache.get("a.rs", prefix, ";\n}\n"), None);
    assert_eq!(cache.get("a.rs", &format!("{prefix}values.iter().sum();"), "\n}\n"), None);
    // The same prefix length elsewhere in the file is not the same place.
    let other = prefix.replace("total", "count");
    assert_eq!(cache.get("a.rs", &other, "\n}\n"), None);
    cache.forget("a.rs");
    assert_eq!(cache.get("a.rs", prefix, "\n}\n"), None);
    // Bounded: the oldest goes.
    let mut small = Cache::new(2);
    for (i, p) in ["a", "b", "c"].iter().enumerate() {
        small.put("d", p, "", &format!("s{i}"));
    }
    assert_eq!(small.get("d", "a", ""), None);
    assert_eq!(small.get("d", "c", "").as_deref(), Some("s2"));
}

#[test]
fn context_fits_the_budget_at_line_boundaries() {
    let lines: String = (0..400).map(|i| format!("    value_{i} = compute({i})\n")).collect();
    let text = format!("class Big:\n  def method(self):\n{lines}");
    let cursor = text.find("    value_200").unwrap() + 4;
    let budget = Budget { tokens: 300, suffix_share: 0.25, snippet_share: 0.25 };
    let c = assemble(&text, cursor, Some("big.py"), &[], budget, &approx_tokens);
    let used = approx_tokens(&c.prefix)
        + approx_tokens(&c.suffix)
        + c.snippets.iter().map(|s| approx_tokens(&s.text)).sum::<usize>();
    assert!(used <= 300, "{used}");
    assert!(c.prefix.ends_with("\n    ") && c.suffix.starts_with("value_200 = compute(200)\n"));
    assert!(c.prefix.starts_with("    value_"), "whole lines: {:?}", &c.prefix[..20]);
    assert!(c.suffix.ends_with('\n'));
    assert!(text[..cursor].ends_with(&c.prefix) && text[cursor..].starts_with(&c.suffix));
    // The enclosing scope's head, out of the prefix's reach, comes as a snippet.
    assert_eq!(c.snippets[0].text, "  def method(self):");
    // Other files' snippets first, the scope's head last: the prompt's head is the same for
    // every cursor in the file.
    let other = [Snippet { path: "other.py".into(), text: "x = compute(1)\n".into() }];
    let with = assemble(&text, cursor, Some("big.py"), &other, budget, &approx_tokens);
    let paths: Vec<&str> = with.snippets.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(paths, ["other.py", "big.py"]);
    // With a big budget the whole file and no scope snippet.
    let all =
        assemble(&text, cursor, Some("big.py"), &[], Budget { tokens: 100_000, ..Budget::default() }, &approx_tokens);
    assert_eq!(format!("{}{}", all.prefix, all.suffix), text);
    assert!(all.snippets.is_empty());
}

#[test]
fn snippets_fill_their_share_in_order() {
    let text = "fn main() {\n    \n}\n";
    let cursor = text.find("    \n").unwrap() + 4;
    let long: String = (0..200).map(|i| format!("pub fn helper_{i}() {{}}\n")).collect();
    let snippets = vec![
        Snippet { path: "src/a.rs".into(), text: "pub fn a() {}\n".into() },
        Snippet { path: "src/long.rs".into(), text: long },
        Snippet { path: "src/c.rs".into(), text: "pub fn c() {}\n".into() },
    ];
    let budget = Budget { tokens: 400, suffix_share: 0.25, snippet_share: 0.25 };
    let c = assemble(text, cursor, Some("src/main.rs"), &snippets, budget, &approx_tokens);
    assert_eq!(c.snippets[0].text, "pub fn a() {}\n");
    let total: usize = c.snippets.iter().map(|s| approx_tokens(&s.text) + approx_tokens(&s.path) + 2).sum();
    assert!(total <= 100, "{total}");
    assert!(c.snippets[1].text.lines().count() < 200 && c.snippets[1].text.ends_with('\n'));
    // A cursor inside a multi-byte character is moved to its start.
    let s = "é";
    let c = assemble(s, 1, None, &[], Budget::default(), &approx_tokens);
    assert_eq!((c.prefix.as_str(), c.suffix.as_str()), ("", "é"));
}

#[test]
fn neighbours_give_their_most_similar_window() {
    use crate::neighbours::{Neighbour, Picking, pick};
    // The file being written calls into `shapes.py`; `log.py` has nothing in common.
    let text = "from shapes import Rectangle\n\ndef total_area(rects):\n    return sum(r.area() for r in rects)\n\ndef fence(rect):\n    return rect.";
    let mut shapes: String = (0..40).map(|i| format!("CONSTANT_{i} = {i}\n")).collect();
    shapes.push_str("class Rectangle:\n    def __init__(self, width, height):\n        self.width = width\n        self.height = height\n\n    def area(self):\n        return self.width * self.height\n\n    def perimeter(self):\n        return 2 * (self.width + self.height)\n");
    let log = "import logging\nlogger = logging.getLogger(__name__)\n";
    let neighbours = [Neighbour { path: "log.py", text: log }, Neighbour { path: "shapes.py", text: &shapes }];
    let got = pick(text, &neighbours, Picking::default());
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].path, "shapes.py");
    assert!(got[0].text.contains("class Rectangle:") && got[0].text.contains("def area(self):"), "{}", got[0].text);
    assert!(!got[0].text.contains("CONSTANT_0 "), "the best window, not the file's head");
    // At most `max`, most similar first; nothing for a file without identifiers.
    let two = [Neighbour { path: "a.py", text: &shapes }, Neighbour { path: "b.py", text: &shapes }];
    assert_eq!(pick(text, &two, Picking { max: 1, ..Picking::default() })[0].path, "a.py");
    assert!(pick("\n\n", &neighbours, Picking::default()).is_empty());
    // The same wherever the cursor is: the file is the query (a longer file, the same pick).
    let longer = format!("{text}width\n\nimport os\nprint(os.getcwd())\n");
    assert_eq!(pick(&longer, &neighbours, Picking::default()), got);
}

#[test]
fn debounce_follows_the_typing_rhythm() {
    use std::time::{Duration, Instant};

    use crate::debounce::Debounce;
    let ms = Duration::from_millis;
    let mut d = Debounce::new(ms(25), ms(150));
    let t0 = Instant::now();
    assert_eq!(d.delay(), ms(25), "no rhythm yet: the floor");
    for i in 0..6 {
        d.keystroke(t0 + ms(100 * i));
    }
    assert_eq!(d.delay(), ms(75), "three quarters of a 100 ms rhythm");
    // A long pause is not rhythm; a slow typist is held at the ceiling; a fast one at the floor.
    d.keystroke(t0 + ms(5_000));
    assert_eq!(d.delay(), ms(75));
    let mut slow = Debounce::new(ms(25), ms(150));
    (0..6).for_each(|i| slow.keystroke(t0 + ms(400 * i)));
    assert_eq!(slow.delay(), ms(150));
    let mut fast = Debounce::new(ms(25), ms(150));
    (0..6).for_each(|i| fast.keystroke(t0 + ms(20 * i)));
    assert_eq!(fast.delay(), ms(25));
}

#[test]
fn spaces_before_the_cursor_leave_the_prompt_and_the_suggestion() {
    use crate::plan::{Limits, plan};
    let text = "def f(w, h):\n    p = \n";
    let cursor = text.find("= ").unwrap() + 2;
    let mut p = plan(text, cursor, Some("f.py"), &[], Budget::default(), Some(&Family::QwenCoder), Limits::default());
    assert!(p.prompt.ends_with("<|fim_middle|>    p ="), "{}", p.prompt);
    assert!(p.stopper.push(" 2 * (w + h)\n"));
    assert_eq!(p.stopper.finish(), "2 * (w + h)");
    // A suggestion without the space keeps what it has; indentation alone stays in the prompt.
    let mut p = plan(text, cursor, None, &[], Budget::default(), Some(&Family::QwenCoder), Limits::default());
    p.stopper.push("w\n");
    assert_eq!(p.stopper.finish(), "w");
    let indent = "def f():\n    \n";
    let p = plan(indent, 13, None, &[], Budget::default(), Some(&Family::QwenCoder), Limits::default());
    assert!(p.prompt.contains("def f():\n    <|fim_suffix|>"), "{}", p.prompt);
}

#[test]
fn a_cut_prefix_stays_put_while_typing() {
    use crate::context::ALIGN;
    let mut text: String = (0..400).map(|i| format!("value_{i} = compute({i})\n")).collect();
    let budget = Budget { tokens: 300, ..Budget::default() };
    let first_line = |text: &str, cursor: usize| {
        let c = assemble(text, cursor, None, &[], budget, &approx_tokens);
        let start = cursor - c.prefix.len();
        assert!(start == 0 || text.as_bytes()[start - 1] == b'\n');
        text[..start].matches('\n').count()
    };
    let mut cursor = text.match_indices('\n').nth(299).unwrap().0 + 1;
    let start = first_line(&text, cursor);
    assert!(start > 0 && start % ALIGN == 0, "{start}");
    // Typing on the line, then on new lines: the prefix's first line moves only in steps.
    let mut starts = Vec::new();
    for c in "total = sum(values)\nprint(total)\nreturn total\n".chars() {
        text.insert(cursor, c);
        cursor += c.len_utf8();
        starts.push(first_line(&text, cursor));
    }
    assert!(starts.iter().all(|s| s % ALIGN == 0), "{starts:?}");
    let moves = starts.windows(2).filter(|w| w[0] != w[1]).count();
    assert!(moves <= 1, "{starts:?}");
}

#[test]
fn the_cursors_line_starts_the_middle() {
    let mut c = ctx();
    c.prefix = "def add(a, b):\n".to_owned();
    c.middle = "    return a".to_owned();
    assert!(
        Family::QwenCoder
            .render(&c)
            .ends_with("<|fim_prefix|>def add(a, b):\n<|fim_suffix|>\n\nprint(add(1, 2))\n<|fim_middle|>    return a")
    );
    assert!(Family::StarCoder2.render(&c).ends_with("<fim_middle>    return a"));
    assert!(Family::DeepSeekCoder.render(&c).ends_with("<｜fim▁end｜>    return a"));
    // CodeLlama and a template without {middle}: the line ends the prefix.
    assert!(Family::CodeLlama.render(&c).contains("def add(a, b):\n    return a <SUF>"));
    let custom = Family::Custom(Template { prompt: "<p>{prefix}<s>{suffix}<m>".to_owned(), stop: vec![] });
    assert!(!custom.starts_middle());
    assert!(custom.render(&c).starts_with("<p>def add(a, b):\n    return a<s>"));
    let custom = Family::Custom(Template { prompt: "<p>{prefix}<s>{suffix}<m>{middle}".to_owned(), stop: vec![] });
    assert!(custom.render(&c).ends_with("<m>    return a"));
}

#[test]
fn typing_along_a_line_only_extends_the_prompt() {
    use crate::plan::{Limits, plan};
    let mut text = "def area(w, h):\n    \n\nprint(area(2, 3))\n".to_owned();
    let mut cursor = text.find("    \n").unwrap() + 4;
    let mut previous: Option<String> = None;
    for c in "return w * h".chars() {
        text.insert(cursor, c);
        cursor += c.len_utf8();
        let p = plan(&text, cursor, Some("a.py"), &[], Budget::default(), Some(&Family::QwenCoder), Limits::default());
        assert!(p.prompt.ends_with(text[..cursor].rsplit('\n').next().unwrap().trim_end()), "{}", p.prompt);
        if let Some(before) = &previous {
            // Everything up to the middle sentinel is the same: only the typed text is new.
            let head = |s: &str| s[..s.find("<|fim_middle|>").unwrap()].to_owned();
            assert_eq!(head(before), head(&p.prompt));
        }
        previous = Some(p.prompt);
    }
    let p = plan(&text, cursor, Some("a.py"), &[], Budget::default(), None, Limits::default());
    assert!(p.prompt.ends_with("    return w * h"));
}

#[test]
fn a_split_plan_unsplits_into_the_whole_prefix() {
    use crate::plan::{Limits, plan};
    let text = "def add(a, b):\n    total = a\n";
    let cursor = text.find(" = a").unwrap() + 4;
    let p = plan(text, cursor, Some("a.py"), &[], Budget::default(), Some(&Family::QwenCoder), Limits::default());
    assert_eq!(p.context.middle, "    total = a");
    let whole = p.unsplit(Some(&Family::QwenCoder)).unwrap();
    assert!(whole.context.middle.is_empty() && whole.context.prefix.ends_with("def add(a, b):\n    total = a"));
    assert!(whole.prompt.ends_with("    total = a<|fim_suffix|>\n<|fim_middle|>"), "{}", whole.prompt);
    assert_eq!((whole.mode, whole.max_tokens), (p.mode, p.max_tokens));
    assert!(whole.unsplit(Some(&Family::QwenCoder)).is_none(), "nothing left to unsplit");
    assert!(p.unsplit(None).is_none());
}

#[test]
fn a_models_guess_ranks_the_candidates_it_lands_near() {
    use crate::next_edit::{Prediction, Why, rank};
    let text = "a\nb\nc\nd\ne\nf\ng\nh\n";
    let at = |line: usize| text.match_indices('\n').nth(line.wrapping_sub(1)).map_or(0, |(i, _)| i + 1);
    let p = |line: usize, why| Prediction {
        path: "f".into(),
        start: at(line),
        end: at(line) + 1,
        replacement: "x".into(),
        why,
    };
    let found = vec![p(1, Why::Repeat), p(4, Why::Repeat), p(7, Why::Repeat)];
    // The guess at line 5: the candidate at line 4 goes first, the others keep their order.
    let ranked = rank(found.clone(), &p(5, Why::Model), text);
    assert_eq!(ranked.iter().map(|c| c.start).collect::<Vec<_>>(), [at(4), at(1), at(7)]);
    // Near none of them: as they were.
    let far = format!("{text}{}", "z\n".repeat(10));
    assert_eq!(rank(found.clone(), &Prediction { start: far.len() - 1, ..p(0, Why::Model) }, &far), found);
}

#[test]
fn a_rename_goes_on_in_other_open_files() {
    use crate::next_edit::{History, elsewhere};
    let mut h = History::default();
    h.open("a.py", "def mean(values):\n    return 0\n");
    let last = h.settle("a.py", "def mean(xs):\n    return 0\n").cloned().unwrap();
    let b = "from a import mean\nvalues = [1]\nprint(mean(values), values_count)\n";
    let found = elsewhere(&last, &[("a.py", "ignored"), ("b.py", b)]);
    let at: Vec<(&str, usize)> = found.iter().map(|p| (p.path.as_str(), p.start)).collect();
    assert_eq!(at, [("b.py", b.find("values =").unwrap()), ("b.py", b.find("values)").unwrap())], "whole tokens only");
    assert!(found.iter().all(|p| p.replacement == "xs"));
    // Not a rename (an insertion, punctuation): nothing elsewhere.
    let mut h = History::default();
    h.open("a.py", "f(a)\n");
    let added = h.settle("a.py", "f(a, b)\n").cloned().unwrap();
    assert!(elsewhere(&added, &[("b.py", "f(a)\n")]).is_empty());
}
