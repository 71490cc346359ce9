//! What names a docs source and where it comes from: its name, a site as its origin, and its
//! refresh interval — checked the same way on a machine and on a team server.

use std::time::Duration;

use anyhow::Context as _;
use caret_docs::pages::Origin;

/// Whether `name` can name a source: letters, digits, `.`, `_` and `-`, at most 64, not
/// starting with a dot.
pub fn check_name(name: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        !name.is_empty()
            && name.len() <= 64
            && !name.starts_with('.')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)),
        "a docs source's name is letters, digits, `.`, `_` and `-` (at most 64), not {name:?}"
    );
    Ok(())
}

/// A docs site as a source's origin: `url` (http or https) crawled under `prefix` (default:
/// its directory), `depth` links deep, `max_pages` at most, `rate` requests a second.
pub fn site(url: &str, prefix: Option<String>, depth: u32, max_pages: usize, rate: f64) -> anyhow::Result<Origin> {
    let url = url::Url::parse(url).with_context(|| format!("reading the URL {url}"))?;
    anyhow::ensure!(matches!(url.scheme(), "http" | "https"), "{url} is not an http(s) URL");
    let prefix = prefix.unwrap_or_else(|| caret_docs::crawl::default_prefix(&url));
    anyhow::ensure!(url.as_str().starts_with(&prefix), "the URL {url} does not start with its prefix {prefix}");
    anyhow::ensure!((0.01..=1000.0).contains(&rate), "the rate is 0.01 to 1,000 requests a second, not {rate}");
    Ok(Origin::Site { url: url.to_string(), prefix, depth, max_pages, rate })
}

/// A source's `refresh` (`90s`, `12h`, `7d`) as an interval.
pub fn refresh_interval(refresh: &str) -> anyhow::Result<Duration> {
    caret_units::parse_duration(refresh)
}

/// Whether a source refreshed every `refresh` and last updated at `updated_at` (Unix seconds;
/// none: never) is due at `now` (a refresh that does not read is never due).
pub fn is_due(refresh: Option<&str>, updated_at: Option<u64>, now: u64) -> bool {
    let Some(every) = refresh.and_then(|r| refresh_interval(r).ok()) else { return false };
    updated_at.is_none_or(|t| now.saturating_sub(t) >= every.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain_and_short() {
        for good in ["rust-std", "tokio_1.40", "a"] {
            check_name(good).unwrap();
        }
        for bad in ["", ".hidden", "a/b", "../x", "sp ace", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?} was taken");
        }
    }

    #[test]
    fn a_site_is_http_under_its_prefix() {
        let Origin::Site { prefix, .. } = site("https://docs.rs/tokio/latest/tokio/", None, 3, 10, 5.0).unwrap() else {
            panic!("not a site")
        };
        assert_eq!(prefix, "https://docs.rs/tokio/latest/tokio/");
        assert!(site("ftp://example.com/", None, 3, 10, 5.0).is_err());
        assert!(site("https://a.example/docs/", Some("https://b.example/".into()), 3, 10, 5.0).is_err());
        assert!(site("https://a.example/docs/", None, 3, 10, 0.0).is_err());
    }

    #[test]
    fn due_when_the_interval_has_passed() {
        assert!(is_due(Some("1h"), None, 100));
        assert!(!is_due(Some("1h"), Some(1000), 1000 + 3599));
        assert!(is_due(Some("1h"), Some(1000), 1000 + 3600));
        assert!(!is_due(None, None, 100));
        assert!(!is_due(Some("often"), None, 100));
    }
}
