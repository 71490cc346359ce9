//! Numbers as people read and write them: `12,345`, `1.5 MiB`, `90s`.

use anyhow::{Context as _, bail};
use serde::Deserialize;

/// `12345` as `12,345`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A size in B, KiB, MiB or GiB.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{v:.1} {}", UNITS[unit]) }
}

/// Parses `90s`, `3m`, `1h` or plain seconds.
pub fn parse_duration(s: &str) -> anyhow::Result<std::time::Duration> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: u64 = num.parse().with_context(|| format!("invalid duration {s:?}"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        other => bail!("invalid duration {s:?}: unknown unit {other:?} (use s, m, h or d)"),
    };
    anyhow::ensure!(secs > 0, "invalid duration {s:?}: must be positive");
    Ok(std::time::Duration::from_secs(secs))
}

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

/// Parses `1048576`, `512K`, `1M`, `1MiB`, `2G`.
pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: u64 = num.parse().with_context(|| format!("invalid size {s:?}"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => bail!("invalid size {s:?}: unknown unit {other:?}"),
    };
    n.checked_mul(mult).with_context(|| format!("size {s:?} is too large"))
}
