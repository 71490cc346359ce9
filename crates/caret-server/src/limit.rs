//! Request rate limits: a token bucket per key (an API token, a client address).
//!
//! One replica alone decides from its own buckets. Replicas of one service share each
//! bucket through the database (see `cluster`): a replica admits on its own while the
//! bucket, as it last learned it, holds plenty even if every replica took as much as it did
//! since ([`Decision::Admit`]); when it runs low, it takes from the shared bucket itself,
//! with what it admitted on its own since ([`Decision::Shared`]), so the limit holds for the
//! tenant across replicas, not per replica. Every moment the replicas settle what they took
//! alone, so each one's view stays close.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

    fn burst(self) -> f64 {
        f64::from(self.burst.max(1))
    }

    /// Seconds until `missing` tokens have refilled (at least one).
    fn wait(self, missing: f64) -> u64 {
        (missing / self.per_second.max(f64::MIN_POSITIVE)).ceil().max(1.0) as u64
    }
}

/// What a replica among others does with a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decision {
    /// Admitted here.
    Admit,
    /// Refused: seconds to wait.
    Refuse(u64),
    /// Take `cost` tokens from the shared bucket (this request and those admitted here since
    /// the last settlement), then [`Limiter::took`].
    Shared {
        /// Tokens to take.
        cost: f64,
    },
}

/// Token buckets by key.
#[derive(Debug)]
pub struct Limiter {
    limit: RateLimit,
    buckets: Mutex<HashMap<String, Bucket>>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// The level when last computed (alone: exact; among replicas: the shared level last
    /// learned).
    tokens: f64,
    last: Instant,
    /// Admitted here since the last settlement (among replicas).
    spent: f64,
    /// Carried by asks of the shared bucket still in flight (they settle it themselves, so
    /// neither a settlement nor another ask counts it again).
    asking: f64,
}

/// Keys not used for this long are no longer settled (and are forgotten later).
const ACTIVE: Duration = Duration::from_secs(60);

impl Limiter {
    /// A limiter with the given limit.
    pub fn new(limit: RateLimit) -> Self {
        Limiter { limit, buckets: Mutex::new(HashMap::new()) }
    }

    /// The limit.
    pub fn limit(&self) -> RateLimit {
        self.limit
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Bucket>> {
        self.buckets.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether `key`'s bucket is empty now (`Some(seconds)` to wait), without taking from it.
    pub fn exhausted(&self, key: &str, now: Instant) -> Option<u64> {
        let buckets = self.lock();
        let b = buckets.get(key)?;
        let tokens = (b.tokens + now.saturating_duration_since(b.last).as_secs_f64() * self.limit.per_second)
            .min(self.limit.burst())
            - b.spent;
        (tokens < 1.0).then(|| self.limit.wait(1.0 - tokens))
    }

    /// Takes one request from `key`'s bucket, deciding alone; `Err(seconds)` to wait when it
    /// is empty.
    pub fn check(&self, key: &str, now: Instant) -> Result<(), u64> {
        match self.decide(key, now, 1) {
            // Alone, the shared bucket is never asked.
            Decision::Admit | Decision::Shared { .. } => Ok(()),
            Decision::Refuse(wait) => Err(wait),
        }
    }

    /// Decides a request of `key` on a replica among `replicas` (1: alone, exact).
    pub fn decide(&self, key: &str, now: Instant, replicas: usize) -> Decision {
        let limit = self.limit;
        let mut buckets = self.lock();
        let b = buckets.entry(key.to_owned()).or_insert(Bucket {
            tokens: limit.burst(),
            last: now,
            spent: 0.0,
            asking: 0.0,
        });
        b.tokens =
            (b.tokens + now.saturating_duration_since(b.last).as_secs_f64() * limit.per_second).min(limit.burst());
        b.last = now;
        if replicas <= 1 {
            if b.tokens >= 1.0 {
                b.tokens -= 1.0;
                return Decision::Admit;
            }
            return Decision::Refuse(limit.wait(1.0 - b.tokens));
        }
        // Plenty left even if every replica took as much as this one since the last
        // settlement: no need to ask.
        if b.tokens - (b.spent + b.asking + 1.0) * replicas as f64 >= limit.burst() / 2.0 {
            b.spent += 1.0;
            return Decision::Admit;
        }
        // The ask carries what was admitted here so far, and nothing else does.
        let cost = std::mem::take(&mut b.spent) + 1.0;
        b.asking += cost;
        Decision::Shared { cost }
    }

    /// What the shared bucket said after taking `cost` for `key` (`admitted`: this request's
    /// token was there): the level it holds now.
    pub fn took(&self, key: &str, cost: f64, level: f64, admitted: bool, now: Instant) -> Result<(), u64> {
        let mut buckets = self.lock();
        if let Some(b) = buckets.get_mut(key) {
            b.asking = (b.asking - cost).max(0.0);
            b.tokens = level;
            b.last = now;
        }
        if admitted { Ok(()) } else { Err(self.limit.wait(1.0 - level)) }
    }

    /// The shared bucket could not be asked for `cost` (the request went through on this
    /// replica's view): the cost is settled later instead.
    pub fn unasked(&self, key: &str, cost: f64) {
        if let Some(b) = self.lock().get_mut(key) {
            b.asking = (b.asking - cost).max(0.0);
            b.spent += cost;
        }
    }

    /// What each key used lately admitted here since the last call (zero for keys used within
    /// a minute but not since: their level is still worth learning), for settling with the
    /// other replicas. Keys idle for ten minutes are forgotten.
    pub fn take_spent(&self, now: Instant) -> Vec<(String, f64)> {
        let mut buckets = self.lock();
        buckets.retain(|_, b| now.saturating_duration_since(b.last) < ACTIVE * 10);
        buckets
            .iter_mut()
            .filter(|(_, b)| b.spent > 0.0 || now.saturating_duration_since(b.last) < ACTIVE)
            .map(|(k, b)| (k.clone(), std::mem::take(&mut b.spent)))
            .collect()
    }

    /// Sets `key`'s level to the shared bucket's after a settlement (what was admitted here
    /// since [`Limiter::take_spent`] stays to settle next time).
    pub fn settle(&self, key: &str, level: f64, now: Instant) {
        if let Some(b) = self.lock().get_mut(key) {
            b.tokens = level;
            b.last = now;
        }
    }
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn among_replicas_plenty_is_decided_here_and_scarcity_in_the_shared_bucket() {
        let l = Limiter::new(RateLimit { per_second: 1.0, burst: 20 });
        let t = Instant::now();
        // 20 known, 2 replicas: admitted here while 20 - 2 × (taken + 1) ≥ 10.
        for _ in 0..5 {
            assert_eq!(l.decide("a", t, 2), Decision::Admit);
        }
        assert_eq!(l.decide("a", t, 2), Decision::Shared { cost: 6.0 }, "the five admitted here go with it");
        assert_eq!(l.take_spent(t), vec![("a".to_owned(), 0.0)], "the ask in flight carries them: not settled twice");
        assert_eq!(l.decide("a", t, 2), Decision::Shared { cost: 1.0 }, "nor asked twice");
        assert_eq!(l.took("a", 1.0, 12.0, true, t), Ok(()));
        // The shared bucket had 13 left after the other replica's takings: 13 - 6 = 7.
        assert_eq!(l.took("a", 6.0, 7.0, true, t), Ok(()));
        assert_eq!(l.decide("a", t, 2), Decision::Shared { cost: 1.0 }, "7 is not plenty");
        assert_eq!(l.took("a", 1.0, 0.5, false, t), Err(1), "empty: refused, the wait from the level");
        // Settlements: what was admitted here is reported once, then the level learned.
        let l = Limiter::new(RateLimit { per_second: 1.0, burst: 100 });
        assert_eq!(l.decide("b", t, 3), Decision::Admit);
        assert_eq!(l.decide("b", t, 3), Decision::Admit);
        assert_eq!(l.take_spent(t), vec![("b".to_owned(), 2.0)]);
        assert_eq!(l.take_spent(t), vec![("b".to_owned(), 0.0)], "still active: its level is learned");
        l.settle("b", 40.0, t);
        assert_eq!(l.decide("b", t, 3), Decision::Shared { cost: 1.0 }, "40 - 3 < 50");
        assert!(l.take_spent(t + Duration::from_secs(700)).is_empty(), "idle keys are forgotten");
        // An ask that cannot reach the shared bucket leaves its cost to the next settlement.
        let l = Limiter::new(RateLimit { per_second: 1.0, burst: 2 });
        assert_eq!(l.decide("c", t, 2), Decision::Shared { cost: 1.0 });
        l.unasked("c", 1.0);
        assert_eq!(l.take_spent(t), vec![("c".to_owned(), 1.0)]);
    }
}
