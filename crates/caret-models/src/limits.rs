//! Token buckets and circuit breakers: pure state machines over a caller-given clock, so
//! they are tested without sleeping.

use std::time::{Duration, Instant};

/// A token bucket: `capacity` tokens, refilled at `per_second`.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    capacity: f64,
    per_second: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(capacity: f64, per_second: f64, now: Instant) -> Self {
        TokenBucket { capacity, per_second, tokens: capacity, at: now }
    }

    /// A bucket allowing `per_minute` a minute, bursting to a minute's worth.
    pub fn per_minute(per_minute: u32, now: Instant) -> Self {
        let n = f64::from(per_minute.max(1));
        TokenBucket::new(n, n / 60.0, now)
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.capacity);
        self.at = now;
    }

    /// How long until `n` tokens are there (zero: now). More than the capacity is treated as
    /// the capacity, so a large request waits for a full bucket instead of forever.
    pub fn wait_for(&mut self, n: f64, now: Instant) -> Duration {
        self.refill(now);
        let n = n.min(self.capacity);
        if self.tokens >= n || self.per_second <= 0.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64((n - self.tokens) / self.per_second)
    }

    /// Takes `n` tokens if they are there.
    pub fn try_take(&mut self, n: f64, now: Instant) -> bool {
        if self.wait_for(n, now).is_zero() {
            self.tokens -= n.min(self.capacity);
            true
        } else {
            false
        }
    }

    /// Takes `n` tokens even into debt (for usage learned after the fact).
    pub fn charge(&mut self, n: f64, now: Instant) {
        self.refill(now);
        self.tokens -= n;
    }

    /// Adds `n` tokens (up to the capacity).
    pub fn deposit(&mut self, n: f64, now: Instant) {
        self.refill(now);
        self.tokens = (self.tokens + n).min(self.capacity);
    }
}

/// A circuit breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Traffic flows.
    Closed,
    /// Failing: no traffic until the cool-down ends.
    Open,
    /// Cool-down over: one trial request at a time decides.
    HalfOpen,
}

impl BreakerState {
    /// As a metric value: 0 closed, 1 half-open, 2 open.
    pub fn gauge(self) -> u8 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::HalfOpen => 1,
            BreakerState::Open => 2,
        }
    }
}

/// Opens after `threshold` consecutive failures; stays open for a cool-down that doubles on
/// each failed trial (up to `max_cooldown`); closes after a successful trial.
#[derive(Debug, Clone)]
pub struct Breaker {
    threshold: u32,
    base_cooldown: Duration,
    max_cooldown: Duration,
    failures: u32,
    state: BreakerState,
    cooldown: Duration,
    opened_at: Option<Instant>,
    trial_in_flight: bool,
    /// When the breaker last closed after being open (slow start counts from here).
    pub recovered_at: Option<Instant>,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(threshold: u32, cooldown: Duration, max_cooldown: Duration) -> Self {
        Breaker {
            threshold: threshold.max(1),
            base_cooldown: cooldown,
            max_cooldown: max_cooldown.max(cooldown),
            failures: 0,
            state: BreakerState::Closed,
            cooldown,
            opened_at: None,
            trial_in_flight: false,
            recovered_at: None,
        }
    }

    /// The state now (an open breaker whose cool-down has passed is half-open).
    pub fn state(&mut self, now: Instant) -> BreakerState {
        if self.state == BreakerState::Open
            && self.opened_at.is_some_and(|t| now.saturating_duration_since(t) >= self.cooldown)
        {
            self.state = BreakerState::HalfOpen;
            self.trial_in_flight = false;
        }
        self.state
    }

    /// Whether a request may go now; in half-open, the first caller becomes the trial.
    pub fn allow(&mut self, now: Instant) -> bool {
        match self.state(now) {
            BreakerState::Closed => true,
            BreakerState::Open => false,
            BreakerState::HalfOpen if self.trial_in_flight => false,
            BreakerState::HalfOpen => {
                self.trial_in_flight = true;
                true
            }
        }
    }

    /// Whether a request could go now, without claiming the trial.
    pub fn would_allow(&mut self, now: Instant) -> bool {
        match self.state(now) {
            BreakerState::Closed => true,
            BreakerState::Open => false,
            BreakerState::HalfOpen => !self.trial_in_flight,
        }
    }

    /// A request succeeded.
    pub fn success(&mut self, now: Instant) {
        self.failures = 0;
        if self.state != BreakerState::Closed {
            self.state = BreakerState::Closed;
            self.cooldown = self.base_cooldown;
            self.recovered_at = Some(now);
        }
        self.trial_in_flight = false;
    }

    /// A request failed (in a way that counts against health).
    pub fn failure(&mut self, now: Instant) {
        self.failures += 1;
        match self.state(now) {
            BreakerState::HalfOpen => {
                self.cooldown = (self.cooldown * 2).min(self.max_cooldown);
                self.open(now);
            }
            BreakerState::Closed if self.failures >= self.threshold => self.open(now),
            _ => {}
        }
        self.trial_in_flight = false;
    }

    /// A trial that ended without a verdict (cancelled, rejected): let another try.
    pub fn release_trial(&mut self) {
        self.trial_in_flight = false;
    }

    /// A health probe succeeded while open: the next request is a trial now.
    pub fn probe_ok(&mut self, now: Instant) {
        if self.state(now) == BreakerState::Open {
            self.state = BreakerState::HalfOpen;
            self.trial_in_flight = false;
        }
    }

    fn open(&mut self, now: Instant) {
        self.state = BreakerState::Open;
        self.opened_at = Some(now);
        self.recovered_at = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_refills_and_tells_how_long_to_wait() {
        let t0 = Instant::now();
        let mut b = TokenBucket::per_minute(60, t0);
        for _ in 0..60 {
            assert!(b.try_take(1.0, t0));
        }
        assert!(!b.try_take(1.0, t0));
        assert_eq!(b.wait_for(1.0, t0), Duration::from_secs(1));
        assert!(b.try_take(1.0, t0 + Duration::from_secs(1)));
        // Usage charged after the fact can put it into debt.
        b.charge(10.0, t0 + Duration::from_secs(1));
        assert_eq!(b.wait_for(1.0, t0 + Duration::from_secs(1)), Duration::from_secs(11));
    }

    #[test]
    fn breaker_opens_probes_once_and_backs_off() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut b = Breaker::new(3, s(10), s(40));
        b.failure(t0);
        b.failure(t0);
        assert!(b.allow(t0));
        b.failure(t0);
        assert_eq!(b.state(t0), BreakerState::Open);
        assert!(!b.allow(t0 + s(9)));
        // Cool-down over: exactly one trial.
        assert!(b.allow(t0 + s(10)));
        assert!(!b.allow(t0 + s(10)));
        // The trial fails: open again for twice as long.
        b.failure(t0 + s(10));
        assert!(!b.allow(t0 + s(29)));
        assert!(b.allow(t0 + s(30)));
        b.success(t0 + s(31));
        assert_eq!(b.state(t0 + s(31)), BreakerState::Closed);
        assert_eq!(b.recovered_at, Some(t0 + s(31)));
        // A success in between resets the count.
        b.failure(t0 + s(32));
        b.failure(t0 + s(32));
        b.success(t0 + s(32));
        b.failure(t0 + s(32));
        assert_eq!(b.state(t0 + s(32)), BreakerState::Closed);
    }
}
