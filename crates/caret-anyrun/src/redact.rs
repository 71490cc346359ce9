//! Secret values out of everything a run reports: every string in an event or result that
//! contains a secret's value gets `[secret NAME]` in its place.

use std::collections::BTreeMap;

use serde_json::Value;

/// Values shorter than this are not redacted (they would blank out ordinary words).
const MIN_LEN: usize = 4;

/// Replaces secret values in text.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    /// (value, replacement), longest value first so that a secret containing another is
    /// replaced whole.
    pairs: Vec<(String, String)>,
}

impl Redactor {
    /// A redactor for these secrets (name → value).
    pub fn new(secrets: &BTreeMap<String, String>) -> Redactor {
        let mut pairs: Vec<(String, String)> = secrets
            .iter()
            .filter(|(_, v)| v.len() >= MIN_LEN)
            .map(|(k, v)| (v.clone(), format!("[secret {k}]")))
            .collect();
        pairs.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
        Redactor { pairs }
    }

    /// Whether there is nothing to redact.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// `text` with every secret value replaced.
    pub fn text(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for (value, with) in &self.pairs {
            if out.contains(value.as_str()) {
                out = out.replace(value.as_str(), with);
            }
        }
        out
    }

    /// Redacts every string in a JSON value, keys included.
    pub fn value(&self, v: &mut Value) {
        match v {
            Value::String(s) if self.pairs.iter().any(|(value, _)| s.contains(value.as_str())) => {
                *s = self.text(s);
            }
            Value::Array(items) => items.iter_mut().for_each(|i| self.value(i)),
            Value::Object(map) => {
                let entries = std::mem::take(map);
                for (k, mut item) in entries {
                    self.value(&mut item);
                    map.insert(self.text(&k), item);
                }
            }
            _ => {}
        }
    }

    /// A serialisable thing with every string redacted (itself when nothing is to redact).
    pub fn apply<T: serde::Serialize + serde::de::DeserializeOwned>(&self, item: T) -> T {
        if self.is_empty() {
            return item;
        }
        let Ok(mut v) = serde_json::to_value(&item) else { return item };
        self.value(&mut v);
        serde_json::from_value(v).unwrap_or(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use caret_protocol::agent::Event;

    #[test]
    fn secrets_are_replaced_in_every_string_of_an_event() {
        let secrets = BTreeMap::from([
            ("API_TOKEN".to_owned(), "tok-CANARY-12345".to_owned()),
            ("SHORT".to_owned(), "ab".to_owned()),
        ]);
        let r = Redactor::new(&secrets);
        let e = Event::ToolCallEnd {
            call_id: "c1".into(),
            name: "run_terminal_cmd".into(),
            ok: true,
            output: "echo $API_TOKEN\ntok-CANARY-12345\nab".into(),
            duration_ms: 1.0,
        };
        let Event::ToolCallEnd { output, .. } = r.apply(e) else { panic!() };
        assert_eq!(output, "echo $API_TOKEN\n[secret API_TOKEN]\nab");
        let mut v = serde_json::json!({"tok-CANARY-12345": ["x tok-CANARY-12345 y", 3]});
        r.value(&mut v);
        assert_eq!(v, serde_json::json!({"[secret API_TOKEN]": ["x [secret API_TOKEN] y", 3]}));
    }
}
