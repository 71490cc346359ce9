//! The edit's old lines matched in part: where a run of lines shares most of its tokens with
//! the edit's old lines but not all (`[(x1, y1), (x2, y2)]` where the edit had `[(x, y)]`, a
//! word more or less in a comment), each change the edit made is carried over when the
//! tokens it touched and the two around it are there, in order, side by side. Names that
//! stand where the edit's stood (`Filter` beside `= None` where the edit had `Creator`) are
//! put in the text it added. `crate::template` asks this where a place is no renaming of the
//! whole edit.

use std::collections::{HashMap, HashSet};

use crate::analogous::changes;
use crate::tokens::{Kind, put_in, tokens};

/// The tokens of `a` matched to tokens of `b`: those the longest common subsequence pairs,
/// and within a changed run as long on both sides, tokens of the same kind pairwise (a name
/// for a name, a literal for a literal).
fn pairs(a: &[(&str, Kind)], b: &[(&str, Kind)]) -> Vec<Option<usize>> {
    let (ta, tb): (Vec<&str>, Vec<&str>) = (a.iter().map(|t| t.0).collect(), b.iter().map(|t| t.0).collect());
    let mut out = vec![None; a.len()];
    let (mut i, mut j) = (0, 0);
    let mut runs = changes(&ta, &tb);
    runs.push(((a.len(), a.len()), (b.len(), b.len())));
    for ((i1, i2), (j1, j2)) in runs {
        // The tokens before the run are common.
        for (k, slot) in out.iter_mut().enumerate().take(i1).skip(i) {
            *slot = Some(j + k - i);
        }
        if i2 - i1 == j2 - j1 {
            for k in 0..i2 - i1 {
                let (x, y) = (a[i1 + k].1, b[j1 + k].1);
                if x == y && x != Kind::Other {
                    out[i1 + k] = Some(j1 + k);
                }
            }
        }
        (i, j) = (i2, j2);
    }
    out
}

/// An edit ready to be carried to places: its old and new lines' tokens and the changes
/// between them, found once for every place.
pub(crate) struct Carrier<'a> {
    old: Vec<(&'a str, Kind)>,
    new: &'a str,
    new_spans: Vec<(usize, usize)>,
    changes: Vec<((usize, usize), (usize, usize))>,
    words: HashSet<&'a str>,
}

impl<'a> Carrier<'a> {
    /// The edit of `old` into `new`; `None` when either has no token or nothing changed.
    pub(crate) fn new(old: &'a str, new: &'a str) -> Option<Carrier<'a>> {
        let (to, tn) = (tokens(old), tokens(new));
        let a: Vec<(&str, Kind)> = to.iter().map(|&(s, e, k)| (&old[s..e], k)).collect();
        let b: Vec<&str> = tn.iter().map(|&(s, e, _)| &new[s..e]).collect();
        let ta: Vec<&str> = a.iter().map(|t| t.0).collect();
        let changes = changes(&ta, &b);
        (!a.is_empty() && !b.is_empty() && !changes.is_empty()).then(|| Carrier {
            words: ta.iter().copied().collect(),
            old: a,
            new,
            new_spans: tn.iter().map(|&(s, e, _)| (s, e)).collect(),
            changes,
        })
    }

    /// `place` with the edit's changes carried over, when `place` is like the edit's old
    /// lines in part (see the module's doc); `None` where a change's tokens or its neighbours
    /// are not there side by side, or where too little of the place is the edit's.
    pub(crate) fn carry(&self, place: &str) -> Option<String> {
        let a = &self.old;
        let tp = tokens(place);
        if tp.len() > 2 * a.len() + 8 {
            return None;
        }
        // Cheaply first: most of the place's tokens are among the edit's.
        let shared = tp.iter().filter(|&&(s, e, _)| self.words.contains(&place[s..e])).count();
        if 2 * shared < tp.len() {
            return None;
        }
        let p: Vec<(&str, Kind)> = tp.iter().map(|&(s, e, k)| (&place[s..e], k)).collect();
        let at = pairs(a, &p);
        if 2 * at.iter().flatten().count() < p.len() {
            return None;
        }
        // Names standing for the edit's, consistently.
        let mut names: HashMap<&str, &str> = HashMap::new();
        for (k, j) in at.iter().enumerate() {
            if let Some(j) = *j
                && a[k].0 != p[j].0
                && *names.entry(a[k].0).or_insert(p[j].0) != p[j].0
            {
                return None;
            }
        }
        let (tn, new) = (&self.new_spans, self.new);
        let mut spans = Vec::new();
        for &((i1, i2), (j1, j2)) in &self.changes {
            // The changed tokens and one on each side (where the line has one) side by side.
            let (from, to) = (i1.saturating_sub(1), (i2 + 1).min(a.len()));
            let first = at[from]?;
            for (k, j) in at[from..to].iter().enumerate() {
                if (*j)? != first + k {
                    return None;
                }
            }
            // The place's bytes between the neighbours, and the edit's new text between its own.
            let start = if i1 > 0 { tp[at[i1 - 1]?].1 } else { 0 };
            let end = if i2 < a.len() { tp[at[i2]?].0 } else { place.len() };
            let text_start = if j1 > 0 { tn[j1 - 1].1 } else { 0 };
            let text_end = if j2 < tn.len() { tn[j2].0 } else { new.len() };
            spans.push((start, end, put_in(&new[text_start..text_end], &names)));
        }
        let mut out = place.to_owned();
        for (start, end, text) in spans.into_iter().rev() {
            out.replace_range(start..end, &text);
        }
        (out != place).then_some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::Carrier;

    fn carried(old: &str, new: &str, place: &str) -> Option<String> {
        Carrier::new(old, new)?.carry(place)
    }

    #[test]
    fn an_edit_goes_to_lines_like_its_own_in_part() {
        // A list of another length wrapped the same way.
        assert_eq!(
            carried(
                "    node.vertices = [(x1, y1), (pi - angle, angle), (x2, y2)]",
                "    node.vertices = deque([(x1, y1), (pi - angle, angle), (x2, y2)])",
                "        node.vertices = [(x, y)]",
            )
            .as_deref(),
            Some("        node.vertices = deque([(x, y)])")
        );
        // Another parameter, another type: the name standing for the edit's is its anchor.
        assert_eq!(
            carried(
                "def new(obj, path: Path, value, creator: Creator = None) -> Mapping:",
                "def new(obj, path: Path, value, creator: Creator | None = None) -> Mapping:",
                "def delete(obj, glob: Glob, afilter: Filter = None) -> int:",
            )
            .as_deref(),
            Some("def delete(obj, glob: Glob, afilter: Filter | None = None) -> int:")
        );
        // A name put in the text the edit added.
        assert_eq!(
            carried(
                "async def list(itr: AnyIterable[T]) -> List[T]:",
                "async def list(itr: AnyIterable[T]) -> builtins.list[T]:",
                "async def tuple(itr: AnyIterable[T]) -> Tuple[T, ...]:",
            )
            .as_deref(),
            Some("async def tuple(itr: AnyIterable[T]) -> builtins.tuple[T, ...]:")
        );
    }

    #[test]
    fn lines_unlike_the_edits_or_without_its_anchors_are_left() {
        let (old, new) = ("    total = price * count", "    total = price * count + tax");
        assert_eq!(carried(old, new, "    return render(template, context)"), None, "nothing alike");
        assert_eq!(carried(old, new, "    total = price"), None, "the change's left neighbour is not there");
        assert_eq!(carried(old, new, old), Some(new.to_owned()), "the same line takes the same change");
    }
}
