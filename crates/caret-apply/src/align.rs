//! Semi-global alignment of a snippet's lines with the file's lines after an anchor.
//!
//! Lines are compared by id (equal ids = equal lines, as the caller decides), and by a
//! second id for lines that are versions of each other (equal but for a trailing comment, as
//! the caller decides): such a line agrees nearly as well. Every snippet line is consumed; the file side may stop anywhere (what follows is kept). Agreeing lines
//! score their weight (the caller gives distinctive lines more than blank lines and
//! braces), a snippet line in place of a different one is a change; a snippet line with no
//! partner is an insertion and a skipped file line a
//! deletion, each with affine gap costs: a block of inserted code or a removed method costs
//! little more than one line, but opening a gap costs, so look-alike lines scattered through
//! the file do not pull the alignment apart. The best score wins; among equal scores, the
//! shortest file span.

/// Score of a snippet line in place of a different file line (a changed line): cheaper than
/// a deletion and an insertion, dearer than an insertion alone.
pub const CHANGE: i32 = -150;
/// What a snippet line in place of a file line equal to it but for a comment loses of its
/// weight: it agrees nearly as well as an equal line.
pub const NEAR_CHANGE: i32 = 30;
/// Score of opening an insertion gap (snippet lines without partner).
pub const INSERT_OPEN: i32 = -100;
/// Score of each further inserted line.
pub const INSERT_EXTEND: i32 = -50;
/// Score of opening a deletion gap (file lines the snippet drops).
pub const DELETE_OPEN: i32 = -200;
/// Score of each further deleted line.
pub const DELETE_EXTEND: i32 = -3;

const NONE: i32 = i32::MIN / 4;

/// The best alignment found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Alignment {
    /// Total score.
    pub score: i32,
    /// File lines covered (from the start of `file`).
    pub end: usize,
    /// Snippet lines equal to the file lines they are laid over.
    pub matched: usize,
    /// File lines dropped between agreeing lines.
    pub deleted: usize,
    /// Snippet lines after the last one laid over a file line (inserted at the end).
    pub trailing: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Match,
    Insert,
    Delete,
}

fn best(options: [(i32, State); 3]) -> (i32, State) {
    options.into_iter().fold((NONE, State::Match), |a, b| if b.0 > a.0 { b } else { a })
}

/// A line's ids: equal lines, and lines equal but for a comment.
pub type Key = (u32, u32);

/// Aligns `seg` (every line consumed) with a prefix of `file`; `weight[i]` is what agreeing
/// on `seg[i]` is worth.
pub fn align(seg: &[Key], weight: &[i32], file: &[Key]) -> Alignment {
    let (n, m) = (seg.len(), file.len());
    let w = m + 1;
    let cells = (n + 1) * w;
    let mut score = [vec![NONE; cells], vec![NONE; cells], vec![NONE; cells]];
    let mut from = [vec![State::Match; cells], vec![State::Match; cells], vec![State::Match; cells]];
    score[0][0] = 0;
    for i in 0..=n {
        for j in 0..=m {
            let k = i * w + j;
            if i > 0 && j > 0 {
                let p = k - w - 1;
                let (s, st) =
                    best([(score[0][p], State::Match), (score[1][p], State::Insert), (score[2][p], State::Delete)]);
                if s > NONE {
                    let (a, b) = (seg[i - 1], file[j - 1]);
                    score[0][k] = s + if a.0 == b.0 {
                        weight[i - 1]
                    } else if a.1 == b.1 {
                        weight[i - 1] - NEAR_CHANGE
                    } else {
                        CHANGE
                    };
                    from[0][k] = st;
                }
            }
            if i > 0 {
                let p = k - w;
                let (s, st) = best([
                    (score[0][p] + INSERT_OPEN, State::Match),
                    (score[1][p] + INSERT_EXTEND, State::Insert),
                    (score[2][p] + INSERT_OPEN, State::Delete),
                ]);
                if s > NONE {
                    score[1][k] = s;
                    from[1][k] = st;
                }
            }
            if j > 0 {
                let p = k - 1;
                let (s, st) = best([
                    (score[0][p] + DELETE_OPEN, State::Match),
                    (score[1][p] + DELETE_OPEN, State::Insert),
                    (score[2][p] + DELETE_EXTEND, State::Delete),
                ]);
                if s > NONE {
                    score[2][k] = s;
                    from[2][k] = st;
                }
            }
        }
    }
    // The end: every snippet line consumed, ending on an agreement or an insertion (trailing
    // deletions only lose score); ties go to the shorter span.
    let mut end = (NONE, 0, State::Match);
    for j in 0..=m {
        let k = n * w + j;
        for (s, st) in [(score[0][k], State::Match), (score[1][k], State::Insert)] {
            if s > end.0 {
                end = (s, j, st);
            }
        }
    }
    let (total, end_j, mut state) = end;
    let mut out = Alignment { score: total, end: end_j, matched: 0, deleted: 0, trailing: 0 };
    let (mut i, mut j) = (n, end_j);
    let mut trailing = true;
    while i > 0 || j > 0 {
        let k = i * w + j;
        let idx = state as usize;
        let prev = from[idx][k];
        match state {
            State::Match => {
                out.matched += usize::from(seg[i - 1].0 == file[j - 1].0);
                trailing = false;
                i -= 1;
                j -= 1;
            }
            State::Insert => {
                if trailing {
                    out.trailing += 1;
                }
                i -= 1;
            }
            State::Delete => {
                out.deleted += 1;
                trailing = false;
                j -= 1;
            }
        }
        state = prev;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(s: &str) -> Vec<Key> {
        s.bytes().map(|b| (u32::from(b), u32::from(b))).collect()
    }

    fn run(seg: &str, file: &str) -> Alignment {
        let seg = ids(seg);
        align(&seg, &vec![300; seg.len()], &ids(file))
    }

    #[test]
    fn agreeing_lines_extend_the_span_and_the_rest_of_the_file_is_kept() {
        let a = run("abc", "abcxyz");
        assert_eq!((a.end, a.matched, a.deleted, a.trailing), (3, 3, 0, 0));
    }

    #[test]
    fn an_inserted_block_then_context_and_a_dropped_block() {
        // "XY" inserted before c; "q" dropped between c and d.
        let a = run("abXYcd", "abcqdz");
        assert_eq!((a.end, a.matched, a.deleted, a.trailing), (5, 4, 1, 0));
    }

    #[test]
    fn new_lines_at_the_end_do_not_reach_for_a_far_look_alike() {
        // The trailing "c" is new code: matching the file's far "c" would drop four lines.
        let seg = ids("abXc");
        let weight = [300, 300, 300, 50];
        let a = align(&seg, &weight, &ids("abpqrsc"));
        assert_eq!((a.end, a.matched, a.trailing), (2, 2, 2));
    }

    #[test]
    fn nothing_agrees() {
        let a = run("xyz", "abc");
        assert_eq!((a.end, a.matched, a.trailing), (0, 0, 3));
    }
}
