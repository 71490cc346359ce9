//! Adaptive debounce: how long to wait after a keystroke before asking the model.
//!
//! A request made while the user is still typing is thrown away by the next keystroke, and
//! on a CPU each one costs a prefill. So the wait follows the user's own rhythm: three
//! quarters of the median gap between their recent keystrokes (gaps over a second are pauses,
//! not rhythm), never less than the configured floor nor more than the ceiling. A fast typist
//! gets short waits inside bursts; a pause longer than the wait always gets a suggestion.

use std::time::{Duration, Instant};

/// Keystroke gaps seen, and the wait they suggest.
#[derive(Debug, Clone)]
pub struct Debounce {
    floor: Duration,
    ceiling: Duration,
    last: Option<Instant>,
    gaps: Vec<Duration>,
}

/// Gaps remembered.
const GAPS: usize = 16;
/// Gaps needed before the rhythm counts.
const MIN_GAPS: usize = 4;

impl Debounce {
    /// Waits between `floor` and `ceiling` (`ceiling` is raised to `floor` if lower).
    pub fn new(floor: Duration, ceiling: Duration) -> Debounce {
        Debounce { floor, ceiling: ceiling.max(floor), last: None, gaps: Vec::new() }
    }

    /// A keystroke (a document change) at `now`.
    pub fn keystroke(&mut self, now: Instant) {
        if let Some(last) = self.last {
            let gap = now.saturating_duration_since(last);
            if gap <= Duration::from_secs(1) {
                if self.gaps.len() == GAPS {
                    self.gaps.remove(0);
                }
                self.gaps.push(gap);
            }
        }
        self.last = Some(now);
    }

    /// How long to wait now.
    pub fn delay(&self) -> Duration {
        if self.gaps.len() < MIN_GAPS {
            return self.floor;
        }
        let mut sorted = self.gaps.clone();
        sorted.sort();
        let median = sorted[sorted.len() / 2];
        (median * 3 / 4).clamp(self.floor, self.ceiling)
    }
}
