//! Per-token request rate limits: a token bucket per API token.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// Requests per second and burst size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Sustained requests per second.
    pub per_second: f64,
    /// Requests allowed at once after a quiet period.
    pub burst: u32,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit { per_second: 50.0, burst: 200 }
    }
}

impl RateLimit {
    /// The default per client address: above one token's, since several people may share an
    /// address, yet bounding what one host can make the server do (token lookups included).
    pub fn per_address() -> Self {
        RateLimit { per_second: 200.0, burst: 800 }
    }
}

/// Token buckets by key.
#[derive(Debug)]
pub struct Limiter {
    limit: RateLimit,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl Limiter {
    /// A limiter with the given limit.
    pub fn new(limit: RateLimit) -> Self {
        Limiter { limit, buckets: Mutex::new(HashMap::new()) }
    }

    /// Whether `key`'s bucket is empty now (`Some(seconds)` to wait), without taking from it.
    pub fn exhausted(&self, key: &str, now: Instant) -> Option<u64> {
        let buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let (tokens, last) = buckets.get(key)?;
        let tokens = (tokens + now.saturating_duration_since(*last).as_secs_f64() * self.limit.per_second)
            .min(f64::from(self.limit.burst.max(1)));
        (tokens < 1.0).then(|| ((1.0 - tokens) / self.limit.per_second.max(f64::MIN_POSITIVE)).ceil().max(1.0) as u64)
    }

    /// Takes one request from `key`'s bucket; `Err(seconds)` to wait when it is empty.
    pub fn check(&self, key: &str, now: Instant) -> Result<(), u64> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let burst = f64::from(self.limit.burst.max(1));
        let (tokens, last) = buckets.entry(key.to_owned()).or_insert((burst, now));
        let elapsed = now.saturating_duration_since(*last).as_secs_f64();
        *tokens = (*tokens + elapsed * self.limit.per_second).min(burst);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            let wait = (1.0 - *tokens) / self.limit.per_second.max(f64::MIN_POSITIVE);
            Err(wait.ceil().max(1.0) as u64)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn bucket_allows_burst_then_refills() {
        let l = Limiter::new(RateLimit { per_second: 2.0, burst: 3 });
        let t = Instant::now();
        assert!((0..3).all(|_| l.check("a", t).is_ok()));
        assert_eq!(l.check("a", t), Err(1));
        assert!(l.check("b", t).is_ok(), "buckets are per key");
        assert!(l.check("a", t + Duration::from_millis(600)).is_ok(), "refilled after 0.5 s");
        assert!(l.check("a", t + Duration::from_millis(600)).is_err());
        assert_eq!(l.exhausted("a", t + Duration::from_millis(600)), Some(1));
        assert_eq!(l.exhausted("a", t + Duration::from_millis(1200)), None, "refilled; looking takes nothing");
        assert_eq!(l.exhausted("a", t + Duration::from_millis(1200)), None);
        assert_eq!(l.exhausted("c", t), None, "an unseen key has its whole burst");
    }
}
