//! Speculative drafts from text the answer is expected to repeat.
//!
//! A request may carry a prediction (the original region of a file a model is asked to
//! rewrite). The drafter follows the answer through that prediction: while the answer keeps
//! matching, the next tokens of the prediction are proposed for verification in one forward
//! pass. After a divergence (the model writes something new), the last few tokens of the
//! answer are looked up again — forward in the prediction first (the answer moves through it
//! in order), then anywhere in it, then in the prompt (new code usually comes from the edit
//! the prompt holds) — and drafting resumes where they are found.

/// Draft length after a fresh lookup, and the bounds it moves within.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DraftLengths {
    /// Proposed after a lookup found a place.
    pub start: usize,
    /// The least proposed.
    pub min: usize,
    /// The most proposed in one pass.
    pub max: usize,
}

impl Default for DraftLengths {
    fn default() -> Self {
        DraftLengths { start: 8, min: 4, max: 48 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Prediction,
    Prompt,
}

/// Where the answer is believed to be in a source: the next token expected is at `pos`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cursor {
    source: Source,
    pos: usize,
}

/// Longest run of recent tokens used to find the answer's place again.
const KEY_MAX: usize = 4;
/// Shortest run: a single token finds too many places to be worth a pass.
const KEY_MIN: usize = 2;

/// Proposes draft tokens from a prediction and a prompt.
#[derive(Debug)]
pub(crate) struct Drafter<T> {
    prediction: Vec<T>,
    prompt: Vec<T>,
    recent: Vec<T>,
    cursor: Option<Cursor>,
    /// Where the answer last was in the prediction: forward lookups start here.
    last_in_prediction: usize,
    len: usize,
    lengths: DraftLengths,
}

impl<T: Copy + Eq> Drafter<T> {
    /// A drafter at the start of `prediction`.
    pub fn new(prediction: Vec<T>, prompt: Vec<T>, lengths: DraftLengths) -> Self {
        let cursor = (!prediction.is_empty()).then_some(Cursor { source: Source::Prediction, pos: 0 });
        Drafter {
            prediction,
            prompt,
            recent: Vec::with_capacity(KEY_MAX + 1),
            cursor,
            last_in_prediction: 0,
            len: lengths.start,
            lengths,
        }
    }

    fn source(&self, source: Source) -> &[T] {
        match source {
            Source::Prediction => &self.prediction,
            Source::Prompt => &self.prompt,
        }
    }

    /// Follows one token of the answer.
    pub fn advance(&mut self, token: T) {
        if self.recent.len() == KEY_MAX {
            self.recent.remove(0);
        }
        self.recent.push(token);
        if let Some(c) = self.cursor
            && self.source(c.source).get(c.pos) == Some(&token)
        {
            let next = Cursor { pos: c.pos + 1, ..c };
            self.moved_to(next);
            self.cursor = Some(next);
            return;
        }
        self.cursor = self.lookup();
        if let Some(c) = self.cursor {
            self.moved_to(c);
            self.len = self.lengths.start;
        }
    }

    fn moved_to(&mut self, c: Cursor) {
        if c.source == Source::Prediction {
            self.last_in_prediction = c.pos;
        }
    }

    /// Finds the place the recent tokens come from.
    fn lookup(&self) -> Option<Cursor> {
        for n in (KEY_MIN..=KEY_MAX.min(self.recent.len())).rev() {
            let key = &self.recent[self.recent.len() - n..];
            let found = |hay: &[T], from: usize| {
                hay.get(from..).and_then(|h| h.windows(n).position(|w| w == key)).map(|i| from + i + n)
            };
            let start = self.last_in_prediction.saturating_sub(n);
            let place = found(&self.prediction, start)
                .map(|pos| Cursor { source: Source::Prediction, pos })
                .or_else(|| found(&self.prediction, 0).map(|pos| Cursor { source: Source::Prediction, pos }))
                .or_else(|| {
                    self.prompt
                        .windows(n)
                        .rposition(|w| w == key)
                        .map(|i| Cursor { source: Source::Prompt, pos: i + n })
                });
            if let Some(c) = place.filter(|c| c.pos < self.source(c.source).len()) {
                return Some(c);
            }
        }
        None
    }

    /// The tokens to verify next (none when the answer's place is unknown), at most `room`.
    pub fn propose(&self, room: usize) -> &[T] {
        match self.cursor {
            Some(c) => {
                let src = self.source(c.source);
                let end = (c.pos + self.len.min(room)).min(src.len());
                &src[c.pos.min(end)..end]
            }
            None => &[],
        }
    }

    /// Adapts the draft length: longer while whole drafts are accepted, shorter after misses.
    pub fn feedback(&mut self, accepted: usize, proposed: usize) {
        if proposed == 0 {
            return;
        }
        self.len = if accepted == proposed {
            (self.len * 2).min(self.lengths.max)
        } else {
            (accepted + 1).max(self.len / 2).max(self.lengths.min)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lengths() -> DraftLengths {
        DraftLengths { start: 3, min: 2, max: 8 }
    }

    #[test]
    fn follows_the_prediction_and_grows_while_it_is_accepted() {
        let mut d = Drafter::new((0..20).collect(), Vec::new(), lengths());
        assert_eq!(d.propose(100), &[0, 1, 2]);
        for t in 0..3 {
            d.advance(t);
        }
        d.feedback(3, 3);
        assert_eq!(d.propose(100), &[3, 4, 5, 6, 7, 8]);
        assert_eq!(d.propose(2), &[3, 4], "never more than there is room for");
    }

    #[test]
    fn finds_its_place_again_after_an_insertion_and_a_deletion() {
        let prediction: Vec<u32> = (0..40).collect();
        let mut d = Drafter::new(prediction, Vec::new(), lengths());
        for t in [0, 1, 2, 100, 101] {
            d.advance(t);
        }
        assert!(d.propose(10).is_empty(), "new tokens found nowhere: nothing to propose");
        // The answer goes on from 3 after the insertion.
        for t in [3, 4] {
            d.advance(t);
        }
        assert_eq!(d.propose(10), &[5, 6, 7]);
        // It skips 5..=19 (a deletion); two tokens of the answer find the place again.
        for t in [20, 21] {
            d.advance(t);
        }
        assert_eq!(d.propose(10), &[22, 23, 24]);
    }

    #[test]
    fn prefers_the_next_occurrence_forward_of_a_repeated_run() {
        // 7 8 occurs at 2..4 and at 10..12; the answer is past the first.
        let prediction = vec![1, 2, 7, 8, 3, 4, 5, 6, 9, 9, 7, 8, 50, 51];
        let mut d = Drafter::new(prediction, Vec::new(), lengths());
        for t in [1, 2, 7, 8, 3, 4, 5, 6, 9, 9, 42, 7, 8] {
            d.advance(t);
        }
        assert_eq!(d.propose(10), &[50, 51]);
    }

    #[test]
    fn new_code_is_drafted_from_the_prompt() {
        let prompt = vec![90, 91, 92, 93, 94, 95];
        let mut d = Drafter::new(vec![1, 2, 3], prompt, lengths());
        for t in [1, 91, 92] {
            d.advance(t);
        }
        assert_eq!(d.propose(10), &[93, 94, 95]);
    }

    #[test]
    fn shrinks_after_a_miss_but_not_below_the_minimum() {
        let mut d = Drafter::new((0..100).collect::<Vec<u32>>(), Vec::new(), lengths());
        d.feedback(3, 3);
        d.feedback(6, 6);
        assert_eq!(d.propose(100).len(), 8);
        d.feedback(0, 8);
        assert_eq!(d.propose(100).len(), 4);
        d.feedback(0, 4);
        d.feedback(0, 2);
        assert_eq!(d.propose(100).len(), 2);
    }
}
