//! Numbers as people read and write them ([`caret_units`]), and a size as config writes it.

use serde::Deserialize;

pub use caret_units::{human_bytes, parse_duration, parse_size, thousands};

/// A byte size written as a number or a string with a K/M/G (KiB/MiB/GiB) suffix.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(try_from = "toml::Value")]
pub struct Size(pub u64);

impl TryFrom<toml::Value> for Size {
    type Error = String;
    fn try_from(v: toml::Value) -> Result<Self, String> {
        match v {
            toml::Value::Integer(n) => u64::try_from(n).map(Size).map_err(|_| format!("size {n} is negative")),
            toml::Value::String(s) => parse_size(&s).map(Size).map_err(|e| e.to_string()),
            other => Err(format!("expected a size, found {other}")),
        }
    }
}
