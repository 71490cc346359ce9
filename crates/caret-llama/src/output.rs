//! Turning a local model's tokens into events: whole UTF-8 characters, stop sequences cut off
//! before they are sent, and Qwen-style `<tool_call>{…}</tool_call>` blocks as tool calls.

use caret_models::Event;

/// Bytes of token pieces in, whole UTF-8 text out (a character may span tokens).
#[derive(Debug, Default)]
pub struct Utf8Joiner {
    pending: Vec<u8>,
}

impl Utf8Joiner {
    /// Adds a token's bytes; returns the text that is now complete.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The first `valid` bytes are whole characters.
                    out.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match e.error_len() {
                        // An incomplete character at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        // Invalid bytes: replace and go on.
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + n);
                        }
                    }
                }
            }
        }
    }

    /// What is left at the end (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

/// Holds back text that might be the start of a stop sequence.
#[derive(Debug)]
pub struct StopScan {
    stops: Vec<String>,
    held: String,
}

impl StopScan {
    /// Scans for these stop sequences (empty ones are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        StopScan { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), held: String::new() }
    }

    /// Adds text; returns what can be sent and whether a stop sequence was hit (the text
    /// returned then ends before it, and generation must stop).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            let out = self.held[..at].to_owned();
            self.held.clear();
            return (out, true);
        }
        // Keep the longest tail that is a proper prefix of some stop sequence.
        let keep = self
            .stops
            .iter()
            .flat_map(|s| (1..s.len()).filter(|&n| s.is_char_boundary(n)).map(move |n| &s[..n]))
            .filter(|prefix| self.held.ends_with(prefix))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_owned();
        self.held.drain(..cut);
        (out, false)
    }

    /// The held-back text at the end of generation (it was not a stop sequence after all).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// Splits generated text into plain text and tool calls.
///
/// Calls come as `<tool_call>{"name": …, "arguments": …}</tool_call>` (Qwen's template). Small
/// models also answer with the bare JSON object, often in a code fence: an answer that starts
/// with `{` or a fence is held to the end and becomes tool calls when it is nothing but calls
/// of offered tools, else text.
#[derive(Debug, Default)]
pub struct ToolCallParser {
    /// The offered tools' names.
    names: Vec<String>,
    /// `None` until the first non-blank text shows whether the answer may be bare JSON calls.
    bare: Option<bool>,
    /// The whole answer so far while it may be bare JSON calls.
    held: String,
    buf: String,
    in_call: bool,
    calls: u32,
    /// Whitespace after text, sent only if more text follows (so an answer that is only tool
    /// calls has no content).
    trailing_ws: String,
}

impl ToolCallParser {
    /// A parser for an answer that may call these tools.
    pub fn new(names: Vec<String>) -> Self {
        ToolCallParser { names, ..ToolCallParser::default() }
    }

    /// How many tool calls were parsed.
    pub fn calls(&self) -> u32 {
        self.calls
    }

    /// Adds generated text; returns the events it completes.
    pub fn push(&mut self, text: &str) -> Vec<Event> {
        if self.bare != Some(false) {
            self.held.push_str(text);
            let start = self.held.trim_start();
            if start.is_empty() || "```".starts_with(start) {
                return Vec::new();
            }
            if self.bare == Some(true) && could_be_bare_calls(start) {
                return Vec::new();
            }
            if could_be_bare_calls(start) {
                self.bare = Some(true);
                return Vec::new();
            }
            self.bare = Some(false);
            let held = std::mem::take(&mut self.held);
            return self.scan(&held);
        }
        self.scan(text)
    }

    fn scan(&mut self, text: &str) -> Vec<Event> {
        self.buf.push_str(text);
        let mut events = Vec::new();
        loop {
            if self.in_call {
                let Some(end) = self.buf.find(CLOSE) else { break };
                let body = self.buf[..end].to_owned();
                self.buf.drain(..end + CLOSE.len());
                self.in_call = false;
                self.call(&body, &mut events);
            } else if let Some(start) = self.buf.find(OPEN) {
                let before = self.buf[..start].to_owned();
                self.text(&before, &mut events);
                self.buf.drain(..start + OPEN.len());
                self.in_call = true;
            } else {
                // Send all but a tail that could begin `<tool_call>`.
                let keep = (1..OPEN.len()).rev().find(|&n| self.buf.ends_with(&OPEN[..n])).unwrap_or(0);
                let cut = self.buf.len() - keep;
                let text = self.buf[..cut].to_owned();
                self.buf.drain(..cut);
                self.text(&text, &mut events);
                break;
            }
        }
        events
    }

    /// The end of generation: an unclosed call is parsed if its JSON is whole, else sent as text.
    pub fn finish(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        if self.bare != Some(false) {
            self.bare = Some(false);
            let held = std::mem::take(&mut self.held);
            match bare_calls(&held, &self.names) {
                Some(calls) => {
                    for (name, arguments) in calls {
                        self.push_call(name, arguments, &mut events);
                    }
                    return events;
                }
                None => events = self.scan(&held),
            }
        }
        let rest = std::mem::take(&mut self.buf);
        if self.in_call {
            self.in_call = false;
            if parse_call(&rest).is_some() {
                self.call(&rest, &mut events);
            } else {
                self.text(&format!("{OPEN}{rest}"), &mut events);
            }
        } else {
            self.text(&rest, &mut events);
        }
        if self.calls == 0 && !self.trailing_ws.is_empty() {
            events.push(Event::Text(std::mem::take(&mut self.trailing_ws)));
        }
        events
    }

    fn text(&mut self, text: &str, events: &mut Vec<Event>) {
        if text.is_empty() {
            return;
        }
        let body = text.trim_end();
        if body.is_empty() {
            self.trailing_ws.push_str(text);
            return;
        }
        let ws = &text[body.len()..];
        let mut out = std::mem::take(&mut self.trailing_ws);
        out.push_str(body);
        events.push(Event::Text(out));
        self.trailing_ws.push_str(ws);
    }

    fn call(&mut self, body: &str, events: &mut Vec<Event>) {
        match parse_call(body) {
            Some((name, arguments)) => self.push_call(name, arguments, events),
            // Not a call after all: nothing is lost, it goes out as text.
            None => self.text(&format!("{OPEN}{body}{CLOSE}"), events),
        }
    }

    fn push_call(&mut self, name: String, arguments: String, events: &mut Vec<Event>) {
        // Whitespace between text and a call is not content.
        self.trailing_ws.clear();
        events.push(Event::ToolCall {
            index: self.calls,
            id: Some(format!("call_{:016x}", fastrand::u64(..))),
            name: Some(name),
            arguments,
        });
        self.calls += 1;
    }
}

/// A chat-template turn marker small models sometimes write out before a call.
const TURN_START: &str = "<|im_start|>";

/// What follows a turn marker written out as text (`<|im_start|>`, maybe with the `assistant`
/// role) at the start of `text`, if it starts with one.
fn after_turn_marker(text: &str) -> Option<&str> {
    let rest = text.strip_prefix(TURN_START)?.trim_start();
    Some(rest.strip_prefix("assistant").unwrap_or(rest).trim_start())
}

/// Whether an answer that starts so may still be nothing but bare JSON calls: `{`, `[`, or a
/// code fence tagged `json` (or untagged) whose body starts with one of them.
fn could_be_bare_calls(start: &str) -> bool {
    if TURN_START.starts_with(start) {
        return true;
    }
    if let Some(rest) = after_turn_marker(start) {
        // `assistant` may still be coming.
        return "assistant".starts_with(rest) || could_be_bare_calls(rest);
    }
    let Some(fenced) = start.strip_prefix("```") else {
        return start.starts_with(['{', '[']);
    };
    let Some((tag, body)) = fenced.split_once('\n') else {
        return true;
    };
    let body = body.trim_start();
    matches!(tag.trim(), "" | "json") && (body.is_empty() || body.starts_with(['{', '[']))
}

/// A whole answer that is only calls of offered tools — one object, several, or an array,
/// optionally in a code fence — as (name, arguments) pairs.
fn bare_calls(answer: &str, names: &[String]) -> Option<Vec<(String, String)>> {
    let mut body = answer.trim();
    if let Some(rest) = after_turn_marker(body) {
        body = rest;
    }
    if let Some(fenced) = body.strip_prefix("```") {
        let fenced = fenced.strip_suffix("```")?;
        // The fence's language tag runs to the first newline.
        body = fenced.split_once('\n').map_or(fenced, |(tag, rest)| if tag.contains('{') { fenced } else { rest });
    } else if let Some(open) = body.strip_suffix("```") {
        // A closing fence without its opening (small models write one after bare calls).
        body = open.trim_end();
    }
    let mut calls = Vec::new();
    for value in serde_json::Deserializer::from_str(body).into_iter::<serde_json::Value>() {
        let value = value.ok()?;
        let items = match value {
            serde_json::Value::Array(items) => items,
            one => vec![one],
        };
        for item in items {
            let (name, arguments) = call_of(&item)?;
            if !names.contains(&name) {
                return None;
            }
            calls.push((name, arguments));
        }
    }
    (!calls.is_empty()).then_some(calls)
}

/// `{"name": "...", "arguments": {...}}` → (name, arguments as a JSON string).
fn parse_call(body: &str) -> Option<(String, String)> {
    call_of(&serde_json::from_str(body.trim()).ok()?)
}

fn call_of(v: &serde_json::Value) -> Option<(String, String)> {
    let name = v.get("name")?.as_str()?.to_owned();
    let arguments = match v.get("arguments") {
        None | Some(serde_json::Value::Null) => "{}".to_owned(),
        // Some models write the arguments as a JSON string already.
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(args) => args.to_string(),
    };
    Some((name, arguments))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parser() -> ToolCallParser {
        ToolCallParser::new(vec!["read_file".to_owned(), "grep".to_owned(), "ls".to_owned()])
    }

    fn feed_all(parser: &mut ToolCallParser, pieces: &[&str]) -> Vec<Event> {
        let mut events: Vec<Event> = pieces.iter().flat_map(|p| parser.push(p)).collect();
        events.extend(parser.finish());
        events
    }

    fn texts(events: &[Event]) -> String {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }

    fn calls(events: &[Event]) -> Vec<(u32, String, String)> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::ToolCall { index, name, arguments, .. } => {
                    Some((*index, name.clone().unwrap_or_default(), arguments.clone()))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn bare_calls_followed_by_a_stray_closing_fence_are_calls() {
        let answer = "{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.py\"}}\n\
                      {\"name\": \"grep\", \"arguments\": {\"pattern\": \"def\"}}\n```";
        let events = feed_all(&mut parser(), &[answer]);
        assert_eq!(calls(&events).len(), 2, "{events:?}");
        assert_eq!(texts(&events), "");
    }

    #[test]
    fn a_turn_marker_written_before_bare_calls_is_dropped() {
        let pieces = ["<|im_", "start|>\n{\"name\": \"read_file\", ", "\"arguments\": {\"path\": \"a.py\"}}"];
        let events = feed_all(&mut parser(), &pieces);
        assert_eq!(calls(&events), [(0, "read_file".to_owned(), "{\"path\":\"a.py\"}".to_owned())], "{events:?}");
        assert_eq!(texts(&events), "");
        let events = feed_all(&mut parser(), &["<|im_start|>assistant\n{\"name\": \"grep\"}"]);
        assert_eq!(calls(&events).len(), 1, "{events:?}");
        for answer in ["<div>hi</div>", "<|im_start|>hello"] {
            let events = feed_all(&mut parser(), &[answer]);
            assert_eq!((calls(&events).len(), texts(&events)), (0, answer.to_owned()));
        }
    }

    #[test]
    fn utf8_characters_split_across_tokens_come_out_whole() {
        let mut j = Utf8Joiner::default();
        let bytes = "é→🦀".as_bytes();
        let mut out = String::new();
        for b in bytes {
            out.push_str(&j.push(&[*b]));
        }
        assert_eq!(out, "é→🦀");
        assert_eq!(j.push(&[0xff, b'a']), "\u{fffd}a");
        assert_eq!(j.push(&[0xe2, 0x86]), "");
        assert_eq!(j.finish(), "\u{fffd}");
    }

    #[test]
    fn stop_sequences_are_cut_even_when_split_across_pieces() {
        let mut s = StopScan::new(vec!["\n\n".to_owned(), "END".to_owned()]);
        assert_eq!(s.push("fn a() {}\n"), ("fn a() {}".to_owned(), false));
        assert_eq!(s.push("x"), ("\nx".to_owned(), false));
        assert_eq!(s.push("E"), (String::new(), false));
        assert_eq!(s.push("NDmore"), (String::new(), true));
        let mut s = StopScan::new(vec!["END".to_owned()]);
        assert_eq!(s.push("almost EN"), ("almost ".to_owned(), false));
        assert_eq!(s.finish(), "EN");
    }

    #[test]
    fn tool_calls_are_parsed_at_any_split_and_text_around_them_is_kept() {
        let answer = "Let me look.\n<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.rs\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"grep\", \"arguments\": {\"pattern\": \"<tool_call>?\"}}\n</tool_call>";
        for split in 1..answer.len() {
            if !answer.is_char_boundary(split) {
                continue;
            }
            let events = feed_all(&mut parser(), &[&answer[..split], &answer[split..]]);
            assert_eq!(texts(&events), "Let me look.", "split at {split}");
            assert_eq!(
                calls(&events),
                vec![
                    (0, "read_file".to_owned(), "{\"path\":\"a.rs\"}".to_owned()),
                    (1, "grep".to_owned(), "{\"pattern\":\"<tool_call>?\"}".to_owned())
                ],
                "split at {split}"
            );
        }
        // Token by token too.
        let pieces: Vec<String> = answer.chars().map(String::from).collect();
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        assert_eq!(calls(&feed_all(&mut parser(), &refs)).len(), 2);
    }

    #[test]
    fn a_call_without_text_has_no_content_and_broken_calls_stay_text() {
        let mut p = parser();
        let events = feed_all(&mut p, &["<tool_call>\n{\"name\": \"ls\"}\n</tool_call>\n"]);
        assert_eq!(texts(&events), "");
        assert_eq!(calls(&events), vec![(0, "ls".to_owned(), "{}".to_owned())]);

        // The model stopped before closing the tag: the JSON is whole, so it is a call.
        let events = feed_all(&mut parser(), &["<tool_call>\n{\"name\": \"ls\", \"arguments\": {}}"]);
        assert_eq!(calls(&events).len(), 1);

        // Not JSON: nothing is lost.
        let events = feed_all(&mut parser(), &["a <tool_call>oops</tool_call> b <tool_call>{\"na"]);
        assert_eq!(texts(&events), "a <tool_call>oops</tool_call> b <tool_call>{\"na");
        assert!(calls(&events).is_empty());

        // A model that answers with bare JSON (fenced or not) called a tool too, if it is one.
        let fenced = "```json\n{\n  \"name\": \"read_file\",\n  \"arguments\": {\"path\": \"a.rs\"}\n}\n```";
        for split in 1..fenced.len() {
            let events = feed_all(&mut parser(), &[&fenced[..split], &fenced[split..]]);
            assert_eq!(calls(&events), vec![(0, "read_file".to_owned(), "{\"path\":\"a.rs\"}".to_owned())]);
            assert_eq!(texts(&events), "", "split at {split}");
        }
        let two = " {\"name\": \"ls\", \"arguments\": {}}\n{\"name\": \"grep\", \"arguments\": {\"pattern\": \"x\"}}";
        assert_eq!(calls(&feed_all(&mut parser(), &[two])).len(), 2);
        // JSON that is not a call of an offered tool is an answer.
        for answer in ["{\"name\": \"rm_rf\", \"arguments\": {}}", "```rust\nfn main() {}\n```", "{\"a\": 1}"] {
            let events = feed_all(&mut parser(), &[answer]);
            assert_eq!(texts(&events), answer);
            assert!(calls(&events).is_empty());
        }
        // A code block that cannot be calls streams as soon as its first line shows it.
        let mut p = parser();
        assert!(p.push("```rust").is_empty());
        assert_eq!(texts(&p.push("\nfn")), "```rust\nfn");

        // Plain text with a trailing newline keeps it.
        let events = feed_all(&mut parser(), &["hello <tool", "bar\n"]);
        assert_eq!(texts(&events), "hello <toolbar\n");
    }
}
