//! Lazy snippets: the new code with unchanged stretches elided by marker comments —
//! `// ... existing code ...`, `# ...`, `/* ... */`, `<!-- ... -->` — in the file's syntax.
//!
//! The snippet is cut at its markers into segments. Each segment is placed in the file by
//! two anchors: its first and its last line worth anchoring on (distinctive, not a lone
//! keyword) that the file holds. Every place holding either is scored by aligning the
//! segment with the file around it ([`crate::align`]: agreeing lines score, less for lines
//! the file repeats, the segment's first and last lines — its context — more; inserted and
//! dropped lines cost, in blocks); the best place wins. A segment with two places scoring
//! the same is decided by order once the segments around it are placed; if more than one
//! order remains it is ambiguous. The segment then replaces the file's lines it covers,
//! widened over changed lines at either end (a renamed signature above the first agreeing
//! line, say) when the file's lines there look like them. What markers elide is kept. What
//! is not elided is not there: a snippet without a closing marker ends the file, and one
//! without any marker is the whole file, unless so much lies outside it that a forgotten
//! marker is likelier (see [`reaches_edge`]).

use std::collections::HashMap;

use crate::align::Key;
use crate::matcher::Shift;
use crate::text::edit_lines;
use crate::{Error, Result, Text};

/// Whether a line is an elision marker: a short comment that opens with `...` or `…`
/// (`// ... existing code ...`, `# ...`), or that has one and says what it elides
/// (`// rest of the file ...`). A comment of the file's own that trails off (`# Default
/// case...`, `# Note... the set`) is not one.
pub fn is_marker(line: &str) -> bool {
    let t = line.trim();
    let body = ["//", "#", "--", "/*", "<!--", ";", "{/*", "*"].iter().find_map(|open| t.strip_prefix(open));
    let Some(body) = body else { return false };
    let body = body.trim().trim_end_matches("*/}").trim_end_matches("*/").trim_end_matches("-->").trim();
    if body.len() >= 80 || !(body.contains("...") || body.contains('…')) {
        return false;
    }
    const SAYS: [&str; 8] =
        ["existing", "unchanged", "rest of", "remaining", "omitted", "same as", "previous", "other"];
    let lower = body.to_lowercase();
    body.starts_with("...") || body.starts_with('…') || SAYS.iter().any(|w| lower.contains(w))
}

/// Whether text looks like a lazy snippet.
pub fn detect(edit: &str) -> bool {
    edit.lines().any(is_marker)
}

/// A lazy snippet cut at its markers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snippet {
    /// The runs of concrete lines between markers.
    pub segments: Vec<Vec<String>>,
    /// Whether the snippet starts with a marker (the file has lines before its first segment).
    pub open_start: bool,
    /// Whether the snippet ends with a marker (the file goes on after its last segment).
    pub open_end: bool,
}

impl Snippet {
    /// Whether the snippet has no marker at all: it is meant as the whole file.
    fn whole(&self) -> bool {
        !self.open_start && !self.open_end && self.segments.len() == 1
    }
}

/// Cuts a snippet at its markers (a code fence around it is dropped).
pub fn parse(edit: &str) -> Result<Snippet> {
    let mut lines = edit_lines(edit);
    if lines.first().is_some_and(|l| l.trim_start().starts_with("```")) {
        lines.remove(0);
        if let Some(end) = lines.iter().rposition(|l| l.trim() == "```") {
            lines.truncate(end);
        }
    }
    let open_start = lines.iter().find(|l| !l.trim().is_empty()).is_some_and(|l| is_marker(l));
    let open_end = lines.iter().rev().find(|l| !l.trim().is_empty()).is_some_and(|l| is_marker(l));
    let mut segments = vec![Vec::new()];
    for l in lines {
        if is_marker(l) {
            segments.push(Vec::new());
        } else if let Some(seg) = segments.last_mut() {
            seg.push(l.to_owned());
        }
    }
    for seg in &mut segments {
        while seg.first().is_some_and(|l| l.trim().is_empty()) {
            seg.remove(0);
        }
        while seg.last().is_some_and(|l| l.trim().is_empty()) {
            seg.pop();
        }
    }
    segments.retain(|s| !s.is_empty());
    if segments.is_empty() {
        return Err(Error::Malformed("the snippet has no code besides its markers".to_owned()));
    }
    Ok(Snippet { segments, open_start, open_end })
}

fn same(a: &str, b: &str) -> bool {
    a.trim() == b.trim()
}

/// A line that is evidence of a place when it agrees: not blank, not only brackets and
/// punctuation.
fn distinctive(line: &str) -> bool {
    line.chars().filter(|c| c.is_alphanumeric()).count() >= 3
}

/// A line worth anchoring a segment on: distinctive, and not a lone keyword (`else:`,
/// `try {`, `return;`, `finally:`) that recurs all over a file.
fn anchorable(line: &str) -> bool {
    let w = words(line);
    distinctive(line) && (w.len() >= 2 || w.iter().any(|w| w.len() >= 9))
}

/// How many lines from `seg[i..]` and `file[j..]` agree in a row.
fn run(seg: &[&str], i: usize, file: &[&str], j: usize) -> usize {
    seg[i..].iter().zip(&file[j.min(file.len())..]).take_while(|(a, b)| same(a, b)).count()
}

/// Words two lines share, each counted as often as both hold it.
fn kept(a: &str, b: &str) -> usize {
    let mut b = words(b);
    words(a)
        .into_iter()
        .filter(|w| match b.iter().position(|x| x == w) {
            Some(at) => {
                b.swap_remove(at);
                true
            }
            None => false,
        })
        .count()
}

/// Words of a line, for "looks like" comparisons.
fn words(line: &str) -> Vec<&str> {
    line.split(|c: char| !c.is_alphanumeric() && c != '_').filter(|w| !w.is_empty()).collect()
}

/// Whether two lines look like versions of each other (half their words shared).
fn similar(a: &str, b: &str) -> bool {
    let (wa, wb) = (words(a), words(b));
    if wa.is_empty() || wb.is_empty() {
        return a.trim() == b.trim();
    }
    let shared = wa.iter().filter(|w| wb.contains(w)).count();
    shared * 2 >= wa.len().max(wb.len())
}

/// The segment's anchor: its first line worth anchoring on that the file holds (a lone
/// keyword only if no other line is found), with the file lines holding it.
fn head_anchor(seg: &[&str], file: &[&str], from: usize) -> Result<(usize, Vec<usize>)> {
    let order = (0..seg.len())
        .filter(|&a| anchorable(seg[a]))
        .chain((0..seg.len()).filter(|&a| distinctive(seg[a]) && !anchorable(seg[a])));
    first_held(seg, file, from, order).ok_or_else(|| Error::NoMatch { anchor: crate::error::excerpt(seg) })
}

/// A second anchor from the other end: the segment's last line worth anchoring on that the
/// file holds. A segment's first lines may be code that moved; its last ones are then its
/// context, and the place they give competes with the first anchor's.
fn tail_anchor(seg: &[&str], file: &[&str], from: usize) -> Option<(usize, Vec<usize>)> {
    first_held(seg, file, from, (0..seg.len()).rev().filter(|&a| anchorable(seg[a])))
}

/// The first line of `order` that `file[from..]` holds, with the file lines holding it (at
/// most [`MAX_CANDIDATES`], those starting the longest runs of agreeing lines).
fn first_held(
    seg: &[&str],
    file: &[&str],
    from: usize,
    order: impl Iterator<Item = usize>,
) -> Option<(usize, Vec<usize>)> {
    for a in order {
        let mut found: Vec<(usize, usize)> =
            (from..file.len()).filter(|&j| same(seg[a], file[j])).map(|j| (run(seg, a, file, j), j)).collect();
        if found.is_empty() {
            continue;
        }
        if found.len() > MAX_CANDIDATES {
            found.sort_by_key(|&(r, j)| (std::cmp::Reverse(r), j));
            found.truncate(MAX_CANDIDATES);
            found.sort_by_key(|&(_, j)| j);
        }
        return Some((a, found.into_iter().map(|(_, j)| j).collect()));
    }
    None
}

/// Places of an anchor line scored in full; a line repeated more often than this is judged
/// by the runs of lines agreeing after it first.
const MAX_CANDIDATES: usize = 32;

/// What agreeing on line `i` of a segment is worth, given how many times the file holds
/// it: distinctive lines are evidence, blank lines and braces little, and a line the file
/// repeats is weaker evidence of any one place (`2 / (count + 1)` of a unique line's); the
/// first and last [`EDGE`] lines count double, as a snippet's context sits there (what lies
/// between is new code that may look like code elsewhere).
fn weight(seg: &[&str], i: usize, count: u32) -> i32 {
    let base = if distinctive(seg[i]) { 300 * 2 / (count.max(1) as i32 + 1) } else { 50 };
    if i == 0 || i + 1 == seg.len() {
        if distinctive(seg[i]) { 4 * base } else { 3 * base }
    } else if i < EDGE || i + EDGE >= seg.len() {
        2 * base
    } else {
        base
    }
}

/// Lines at each end of a segment taken for its context.
const EDGE: usize = 3;

/// A snippet without a closing marker reaches the file's end when at most this many lines
/// (or the segment's length, if longer) follow its last segment, and they are at most a
/// quarter of the file or the segment is at least half of it; more are kept (a forgotten
/// marker must not delete the rest of a file).
const EDGE_REACH: usize = 12;

/// Whether the last segment of a snippet without a closing marker takes the `beyond` lines
/// after it away (likewise the lines before a snippet without any marker).
fn reaches_edge(beyond: usize, total: usize, seg_len: usize) -> bool {
    beyond <= EDGE_REACH.max(seg_len) && (beyond * 4 <= total || seg_len * 2 >= total)
}

/// The file's lines with ids for comparison (equal ids = equal but for trailing whitespace).
struct FileLines<'a> {
    lines: &'a [&'a str],
    ids: Vec<u32>,
    index: HashMap<&'a str, u32>,
    /// How many lines of the file have each id.
    counts: Vec<u32>,
    /// Each line's ids for alignment: its own, and the one of its code without a comment.
    keys: Vec<Key>,
}

/// A line's code: its indentation and what follows, without a trailing comment (after two
/// spaces, or one and a space, before `#` or `//`) or trailing whitespace. Lines with the
/// same code are versions of each other (`# pragma: no cover` added or dropped).
fn code_part(line: &str) -> &str {
    let t = line.trim_end();
    if !t.contains(['#', '/']) {
        return t;
    }
    let indent = t.len() - t.trim_start().len();
    let cut = ["  #", " # ", "  //", " // "].iter().filter_map(|m| t[indent..].find(m)).min();
    cut.map_or(t, |c| t[..indent + c].trim_end())
}

impl<'a> FileLines<'a> {
    fn new(lines: &'a [&'a str]) -> FileLines<'a> {
        let intern = |index: &mut HashMap<&'a str, u32>, key: &'a str| {
            let next = index.len() as u32;
            *index.entry(key).or_insert(next)
        };
        // One index for both: a line without a comment is its own code.
        let mut index = HashMap::new();
        let keys: Vec<Key> = lines
            .iter()
            .map(|l| {
                let (line, code) = (l.trim_end(), code_part(l));
                let id = intern(&mut index, line);
                (id, if code.len() == line.len() { id } else { intern(&mut index, code) })
            })
            .collect();
        let ids: Vec<u32> = keys.iter().map(|k| k.0).collect();
        let mut counts = vec![0; index.len()];
        for &id in &ids {
            counts[id as usize] += 1;
        }
        FileLines { lines, ids, index, counts, keys }
    }

    /// A snippet line's id; one found nowhere in the file agrees with nothing.
    fn id(&self, line: &str) -> u32 {
        self.index.get(line.trim_end()).copied().unwrap_or(u32::MAX)
    }

    /// A snippet line's ids for alignment.
    fn key(&self, line: &str) -> Key {
        (self.id(line), self.index.get(code_part(line)).copied().unwrap_or(u32::MAX))
    }

    /// How many lines of the file have this id.
    fn count(&self, id: u32) -> u32 {
        self.counts.get(id as usize).copied().unwrap_or(0)
    }
}

/// The indentation change from a segment's line to the file's.
fn shift_of(file_line: &str, seg_line: &str) -> Shift {
    let indent = |l: &str| l.len() - l.trim_start().len();
    let (f, s) = (&file_line[..indent(file_line)], &seg_line[..indent(seg_line)]);
    if let Some(extra) = f.strip_suffix(s).filter(|e| !e.is_empty()) {
        Shift::Add(extra.to_owned())
    } else if let Some(less) = s.strip_suffix(f).filter(|l| !l.is_empty()) {
        Shift::Remove(less.to_owned())
    } else {
        Shift::None
    }
}

/// Which ends of the file a segment reaches when little lies beyond it (see [`reaches_edge`]).
#[derive(Clone, Copy)]
struct Edges {
    /// The snippet has no marker at all: it is meant as the whole file.
    start: bool,
    /// The first segment of a snippet without an opening marker: it takes the file's first
    /// lines away when nothing is lost by it (each is blank or in the segment: moved lines).
    moved_head: bool,
    /// The last segment of a snippet without a closing marker.
    end: bool,
    /// A marker comes right before the segment / right after it: its first / last line is
    /// then the context the snippet quotes, not new code.
    marked_before: bool,
    marked_after: bool,
}

/// The places of one segment within file lines `from..until` that score best, widened to the
/// file's ends per `edges`; the anchor's index in the segment comes with them.
fn candidates(seg: &[&str], file: &FileLines<'_>, from: usize, until: usize, edges: Edges) -> Result<Tied> {
    let (a, found) = head_anchor(seg, &file.lines[..until], from)?;
    let mut anchors: Vec<(usize, usize)> = found.into_iter().map(|pos| (a, pos)).collect();
    if let Some((b, tail)) = tail_anchor(seg, &file.lines[..until], from).filter(|&(b, _)| b != a) {
        // Only at an indentation the first anchor also gives, or at the snippet's own: a
        // snippet that re-indents a block has its last lines at a new depth, and anchoring
        // there would shift it all (but a first anchor found only on a deeper look-alike
        // must not rule out the place where the last lines stand as written).
        let mut shifts: Vec<Shift> = anchors.iter().map(|&(a, pos)| shift_of(file.lines[pos], seg[a])).collect();
        shifts.push(Shift::None);
        anchors.extend(
            tail.into_iter().filter(|&pos| shifts.contains(&shift_of(file.lines[pos], seg[b]))).map(|pos| (b, pos)),
        );
    }
    let total = file.lines.len();
    let mut placed: Vec<Placement> = anchors
        .into_iter()
        .map(|(a, pos)| {
            let mut p = align(seg, file, from, a, pos);
            if edges.end && reaches_edge(total - p.end, total, seg.len()) {
                p.end = total;
            }
            if edges.start && reaches_edge(p.start, total, seg.len()) {
                p.start = 0;
            }
            // The first segment of a snippet without an opening marker, laid a few lines into
            // the file, takes those lines away when nothing is lost by it (each is blank or in
            // the segment: moved lines), or when the segment puts at least as many new lines
            // there (a changed header or first import).
            if edges.moved_head
                && p.start <= EDGE_REACH.max(seg.len())
                && (p.start <= p.head
                    || file.lines[..p.start].iter().all(|l| l.trim().is_empty() || seg.iter().any(|s| same(s, l))))
            {
                p.start = 0;
            }
            p
        })
        .filter(|p| p.end <= until)
        .collect();
    // Read as an insertion between context the file holds together, on a line it holds once,
    // a segment is not laid elsewhere over look-alikes of its new lines (dropping the file's
    // lines between them).
    if placed.iter().any(|p| p.inserted && file.count(file.ids[p.anchor]) == 1) {
        placed.retain(|p| p.inserted && file.count(file.ids[p.anchor]) == 1);
    }
    // A segment's edge lines next to a marker are context: where the file holds one of them
    // once (and the lines between it and the edge agree), the segment is laid from (or to)
    // there. New code in between that looks like other code (a test added after a similar
    // one) must not pull the segment over that code instead.
    let once = |line: &str| {
        let mut at = (from..until).filter(|&j| same(line, file.lines[j]));
        anchorable(line).then(|| at.next().filter(|_| at.next().is_none())).flatten()
    };
    let n = seg.len();
    let agree = |i: usize, j: usize| file.lines.get(j).is_some_and(|l| same(seg[i], l));
    let head_pin = || {
        (0..EDGE.min(n))
            .find_map(|i| once(seg[i]).filter(|&j| j >= i && (0..i).all(|k| agree(k, j - i + k))).map(|j| j - i))
    };
    let tail_pin = || {
        (n.saturating_sub(EDGE)..n)
            .rev()
            .find_map(|i| once(seg[i]).filter(|&j| (i + 1..n).all(|k| agree(k, j + k - i))).map(|j| j + n - i))
    };
    let pins = [
        edges.marked_before.then(head_pin).flatten().map(|at| (at, true)),
        edges.marked_after.then(tail_pin).flatten().map(|at| (at, false)),
    ];
    for (at, start) in pins.into_iter().flatten() {
        let holds = |p: &Placement| if start { p.start == at } else { p.end == at };
        if placed.iter().any(holds) {
            placed.retain(holds);
        }
    }
    let top = placed.iter().map(|p| p.score).max();
    placed.retain(|p| Some(p.score) == top);
    placed.sort_by_key(|p| (p.start, p.end));
    placed.dedup_by_key(|p| (p.start, p.end));
    // Places that tie line for line (each changes the same lines) are told apart by how
    // close the changed lines are to the snippet's: an edit changes little of a line.
    if placed.len() > 1 && placed.iter().all(|p| p.end - p.start == seg.len()) {
        let closeness =
            |p: &Placement| -> usize { seg.iter().zip(&file.lines[p.start..p.end]).map(|(s, f)| kept(s, f)).sum() };
        let best = placed.iter().map(closeness).max();
        placed.retain(|p| Some(closeness(p)) == best);
    }
    if placed.is_empty() {
        return Err(Error::NoMatch { anchor: crate::error::excerpt(&seg[a..]) });
    }
    Ok(Tied { anchor: a, places: placed })
}

/// A segment's best places (one, or several scoring the same).
struct Tied {
    /// Index of the anchor line in the segment.
    anchor: usize,
    places: Vec<Placement>,
}

impl Tied {
    fn ambiguous(&self, seg: &[&str], places: &[&Placement]) -> Error {
        Error::Ambiguous {
            anchor: crate::error::excerpt(&seg[self.anchor..]),
            lines: places.iter().map(|p| p.anchor + 1).collect(),
        }
    }
}

/// Picks one place per segment of a run of segments that each fit several places, in file
/// order: the only way to lay them all one after another, or `Ambiguous` naming the first
/// segment with more than one way.
fn in_order(run: Vec<Tied>, segs: &[Vec<&str>]) -> Result<Vec<Placement>> {
    // ways[i][c]: how many ways (capped at 2) segments i.. can be laid with segment i at place c.
    let mut ways: Vec<Vec<u8>> = vec![Vec::new(); run.len()];
    for i in (0..run.len()).rev() {
        ways[i] = run[i]
            .places
            .iter()
            .map(|p| match run.get(i + 1) {
                None => 1,
                Some(next) => next
                    .places
                    .iter()
                    .zip(&ways[i + 1])
                    .filter(|(q, _)| q.start >= p.end)
                    .map(|(_, &w)| w)
                    .fold(0u8, |acc, w| acc.saturating_add(w).min(2)),
            })
            .collect();
    }
    let mut picked = Vec::with_capacity(run.len());
    let mut floor = 0;
    for (i, (tied, w)) in run.into_iter().zip(&ways).enumerate() {
        let viable: Vec<usize> =
            (0..tied.places.len()).filter(|&c| w[c] > 0 && tied.places[c].start >= floor).collect();
        let total: u8 = viable.iter().fold(0u8, |acc, &c| acc.saturating_add(w[c]));
        match viable.as_slice() {
            [c] if total == 1 => {
                let Tied { mut places, .. } = tied;
                let p = places.swap_remove(*c);
                floor = p.end;
                picked.push(p);
            }
            [] => return Err(tied.ambiguous(&segs[i], &tied.places.iter().collect::<Vec<_>>())),
            _ => return Err(tied.ambiguous(&segs[i], &viable.iter().map(|&c| &tied.places[c]).collect::<Vec<_>>())),
        }
    }
    Ok(picked)
}

/// Whether `new` lines are each a changed version of the `old` line in their place.
fn changed_versions(new: &[&str], old: Option<&[&str]>) -> bool {
    old.is_some_and(|old| !new.is_empty() && new.iter().zip(old).all(|(n, o)| similar(n, o) && !same(n, o)))
}

/// A segment laid over the file from one anchor.
struct Placement {
    /// The anchor's file line.
    anchor: usize,
    /// The file range replaced.
    start: usize,
    end: usize,
    /// Indentation change for the segment's lines.
    shift: Shift,
    /// How well the segment agrees with the file there ([`crate::align`]).
    score: i32,
    /// Read as new lines between context the file holds together (see [`between`]).
    inserted: bool,
    /// New lines the segment puts above its first line that agrees with the file.
    head: usize,
}

/// Aligns the segment with the file around anchor `seg[a]` = `file[pos]`: the lines after
/// it forward, the lines before it backward (no higher than `from`).
fn align(seg: &[&str], file: &FileLines<'_>, from: usize, a: usize, pos: usize) -> Placement {
    let lines = file.lines;
    // Lines agree only with the anchor's indentation change applied, so a closing brace
    // matches the brace at its own depth.
    let shift = shift_of(lines[pos], seg[a]);
    let keys: Vec<Key> = seg.iter().map(|l| file.key(&shift.apply(l))).collect();
    let ids: Vec<u32> = keys.iter().map(|k| k.0).collect();
    let prepare = |part: std::ops::Range<usize>| -> (Vec<Key>, Vec<i32>) {
        let weights = part.clone().map(|i| weight(seg, i, file.count(ids[i]))).collect();
        (keys[part].to_vec(), weights)
    };
    // Dropping file lines pays for itself only against agreeing lines after them, so the
    // window needs to reach no further than the segment's weight allows.
    let reach = |n: usize| 2 * n + 800;
    let (part, weights) = prepare(a + 1..seg.len());
    let window = (pos + 1 + reach(part.len())).min(lines.len());
    let after = crate::align::align(&part, &weights, &file.keys[pos + 1..window]);
    let (mut part, mut weights) = prepare(0..a);
    part.reverse();
    weights.reverse();
    let top = pos.saturating_sub(reach(part.len())).max(from);
    let above: Vec<Key> = file.keys[top..pos].iter().rev().copied().collect();
    let before = crate::align::align(&part, &weights, &above);

    // New lines after the last one laid over the file replace the file's lines there when
    // each looks like the file line in its place (changed last lines); otherwise they are
    // inserted (a new method shaped like the next one must not replace it).
    let mut end = pos + 1 + after.end;
    let tail = &seg[seg.len() - after.trailing..];
    if changed_versions(tail, lines.get(end..end + tail.len())) {
        end += tail.len();
    } else if !tail.is_empty() && end > pos + 1 && lines[end - 1].trim().is_empty() {
        // New lines after a blank line the file shares: the file's blank line is kept after
        // them too (a method appended after another stays separated from the next one).
        end -= 1;
    }
    // Likewise above the first (a renamed signature, a method added before).
    let mut start = pos - before.end;
    let head = &seg[..before.trailing];
    if start >= from + head.len() && changed_versions(head, lines.get(start - head.len()..start)) {
        start -= head.len();
    } else if !head.is_empty() && start < pos && lines[start].trim().is_empty() {
        start += 1;
    }
    let aligned = Placement {
        anchor: pos,
        start,
        end,
        shift,
        score: after.score + before.score + weight(seg, a, file.count(file.ids[pos])),
        inserted: false,
        head: before.trailing,
    };
    // Context the file holds together on both sides of new lines (as much as a snippet
    // quotes: more than [`EDGE`] lines) is read as an insertion there when the alignment
    // would drop the file's lines to agree with look-alikes of the new lines (a new test
    // shaped like the ones after it), or change them for less.
    let dropped = after.deleted + before.deleted > 0;
    let n = seg.len();
    match between(&ids, &file.ids, a, pos).filter(|&(_, k)| k > EDGE) {
        Some((q, k)) if (q, q + k) == (aligned.start, aligned.end) => Placement { inserted: true, ..aligned },
        Some((q, k)) => {
            // Scored as its context agreeing (the first lines up to where the file stops
            // agreeing, the rest from the end) and one inserted block.
            let h = (0..k).take_while(|&i| file.ids[q + i] == ids[i]).count();
            let agreed: i32 = (0..h).chain(n - (k - h)..n).map(|i| weight(seg, i, file.count(ids[i]))).sum();
            let score = agreed + crate::align::INSERT_OPEN + crate::align::INSERT_EXTEND * ((n - k) as i32 - 1);
            // Against an alignment that only changes lines, the better score wins.
            if dropped || score >= aligned.score {
                Placement { start: q, end: q + k, score, inserted: true, head: 0, ..aligned }
            } else {
                aligned
            }
        }
        None => aligned,
    }
}

/// Longest run of context looked for on the far side of new lines.
const BETWEEN_REACH: usize = 64;

/// The segment read as new lines between two runs of context that the file holds together,
/// with `seg[a]` laid on `file[pos]` in one of them: `seg[..h]` agrees with `file[q..q + h]`
/// and `seg[n - t..]` with `file[q + h..q + h + t]` (`h`, `t` ≥ 1, at least one line between).
/// Returns `(q, h + t)`, the reading with the most context (new lines that repeat the context
/// around them can be split off more than one way; each gives the same file).
fn between(seg: &[u32], file: &[u32], a: usize, pos: usize) -> Option<(usize, usize)> {
    let n = seg.len();
    let agrees = |s: std::ops::Range<usize>, f: usize| file.get(f..f + s.len()).is_some_and(|f| f == &seg[s]);
    let mut best: Option<(usize, usize)> = None;
    let mut keep = |q: usize, k: usize| {
        if best.is_none_or(|(_, b)| k > b) {
            best = Some((q, k));
        }
    };
    // The anchor in the first run, which goes on from `q` as far as the file agrees.
    if let Some(q) = pos.checked_sub(a) {
        let run = (0..n).take_while(|&i| file.get(q + i) == Some(&seg[i])).count();
        if run > a {
            // `h > a`: the anchor stays in the run it was laid in.
            for h in (run.saturating_sub(BETWEEN_REACH).max(a + 1)..=run.min(n.saturating_sub(2))).rev() {
                let longest = (n - h - 1).min(BETWEEN_REACH);
                if let Some(t) = (1..=longest).rev().find(|&t| agrees(n - t..n, q + h)) {
                    keep(q, h + t);
                }
            }
        }
    }
    // The anchor in the last run, which goes back from the segment's last line.
    let last = pos + (n - 1 - a);
    let run = (0..n).take_while(|&i| i <= last && file.get(last - i) == Some(&seg[n - 1 - i])).count();
    if run >= n - a {
        for t in (run.saturating_sub(BETWEEN_REACH).max(n - a)..=run.min(n.saturating_sub(2))).rev() {
            let at = last + 1 - t;
            let longest = (n - t - 1).min(BETWEEN_REACH).min(at);
            if let Some(h) = (1..=longest).rev().find(|&h| agrees(0..h, at - h)) {
                keep(at - h, h + t);
            }
        }
    }
    best
}

/// Applies a snippet to a file.
pub fn apply(text: &Text, snippet: &Snippet) -> Result<Text> {
    let refs = text.line_refs();
    let file = FileLines::new(&refs);
    let total = refs.len();
    let segs: Vec<Vec<&str>> = snippet.segments.iter().map(|s| s.iter().map(String::as_str).collect()).collect();
    // What is not elided is not there: without a closing marker the last segment runs to the
    // file's end, unless so much follows that a forgotten marker is likelier. At the start only
    // for a snippet with no marker at all, meant as the whole file: snippets that begin without
    // a marker but elide later are common, and an import block deleted silently is worse than
    // a header left in place.
    let edges = |n: usize| Edges {
        start: snippet.whole(),
        moved_head: n == 0 && !snippet.open_start,
        end: n + 1 == segs.len() && !snippet.open_end,
        marked_before: n > 0 || snippet.open_start,
        marked_after: n + 1 < segs.len() || snippet.open_end,
    };
    // Segments are placed in order, each after the one before. One that fits several places
    // equally well is put off until the segments around it are placed: it must lie between
    // them, and a run of such segments (the same change to repeated code) must lie in order.
    let mut placed: Vec<Option<Placement>> = Vec::with_capacity(segs.len());
    let mut from = 0;
    for (n, seg) in segs.iter().enumerate() {
        let mut tied = match candidates(seg, &file, from, total, edges(n)) {
            // A snippet without markers is the whole file: where no line of it agrees with a
            // file it could replace outright (no longer than a snippet may take from an
            // end, see [`reaches_edge`]), it is the new file — a version string bumped.
            Err(Error::NoMatch { .. }) if snippet.whole() && reaches_edge(total, total, seg.len()) => {
                return Ok(Text { lines: snippet.segments[0].clone(), ..text.clone() });
            }
            other => other?,
        };
        if tied.places.len() == 1 {
            let p = tied.places.remove(0);
            from = p.end;
            placed.push(Some(p));
        } else {
            placed.push(None);
        }
    }
    let mut n = 0;
    while n < segs.len() {
        if placed[n].is_some() {
            n += 1;
            continue;
        }
        let run_end = (n..segs.len()).find(|&m| placed[m].is_some()).unwrap_or(segs.len());
        let lo = placed[..n].iter().rev().flatten().next().map_or(0, |p| p.end);
        let hi = placed.get(run_end).and_then(Option::as_ref).map_or(total, |p| p.start).max(lo);
        let run = (n..run_end).map(|m| candidates(&segs[m], &file, lo, hi, edges(m))).collect::<Result<Vec<_>>>()?;
        for (m, p) in (n..run_end).zip(in_order(run, &segs[n..run_end])?) {
            placed[m] = Some(p);
        }
        n = run_end;
    }
    let mut regions: Vec<(usize, usize, Vec<String>)> = Vec::with_capacity(segs.len());
    for (seg, p) in segs.iter().zip(placed) {
        let Some(Placement { start, end, shift, .. }) = p else { continue };
        if regions.last().is_some_and(|&(_, prev_end, _)| start < prev_end) {
            return Err(Error::Malformed("two parts of the snippet overlap in the file".to_owned()));
        }
        regions.push((start, end, seg.iter().map(|l| shift.apply(l)).collect()));
    }
    let mut out = text.clone();
    for (start, end, lines) in regions.into_iter().rev() {
        out.lines.splice(start..end, lines);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "use std::io;\n\nstruct Server {\n    port: u16,\n}\n\nimpl Server {\n    fn new(port: u16) -> Self {\n        Server { port }\n    }\n\n    fn start(&self) {\n        println!(\"start\");\n        listen(self.port);\n    }\n\n    fn stop(&self) {\n        println!(\"stop\");\n    }\n}\n";

    fn lazy(file: &str, edit: &str) -> Result<String> {
        apply(&Text::new(file), &parse(edit)?).map(|t| t.render())
    }

    #[test]
    fn markers_in_any_comment_syntax() {
        for m in [
            "// ... existing code ...",
            "# ...",
            "    /* … rest of the file … */",
            "<!-- ... -->",
            "-- ...",
            "{/* ... */}",
        ] {
            assert!(is_marker(m), "{m}");
        }
        assert!(is_marker("// rest of the file unchanged ..."));
        for m in
            ["...", "x = 1  # ...", "// a real comment", "println!(\"...\");", "# Default case...", "# Note... the set"]
        {
            assert!(!is_marker(m), "{m}");
        }
    }

    #[test]
    fn a_method_body_changes_between_markers() {
        let edit = "// ... existing code ...\n    fn start(&self) {\n        println!(\"starting on {}\", self.port);\n        listen(self.port);\n    }\n// ... existing code ...\n";
        let out = lazy(FILE, edit).unwrap();
        assert_eq!(out, FILE.replace("println!(\"start\");", "println!(\"starting on {}\", self.port);"));
    }

    #[test]
    fn a_renamed_signature_above_the_first_anchor_replaces_the_old_one() {
        let edit = "    // ...\n    fn stop(&self, reason: &str) {\n        println!(\"stop\");\n        log(reason);\n    }\n    // ...\n";
        let out = lazy(FILE, edit).unwrap();
        let expected = FILE.replace(
            "    fn stop(&self) {\n        println!(\"stop\");\n    }",
            "    fn stop(&self, reason: &str) {\n        println!(\"stop\");\n        log(reason);\n    }",
        );
        assert_eq!(out, expected);
    }

    #[test]
    fn insertions_deletions_and_unindented_quotes() {
        // A field added; the snippet quotes the struct without markers inside.
        let out = lazy(FILE, "struct Server {\n    port: u16,\n    host: String,\n}\n// ...\n").unwrap();
        assert!(out.contains("    port: u16,\n    host: String,\n}"), "{out}");
        assert_eq!(out.lines().count(), FILE.lines().count() + 1);
        // Two segments; a method removed by quoting its neighbours together.
        let edit =
            "// ...\n    fn start(&self) {\n        println!(\"start\");\n        listen(self.port);\n    }\n}\n";
        let out = lazy(FILE, edit).unwrap();
        let expected = FILE.replace("\n    fn stop(&self) {\n        println!(\"stop\");\n    }\n", "");
        assert_eq!(out, expected.replace("    }\n\n}", "    }\n}"));
        // Quoted without the impl's indentation: carried over.
        let edit = "// ...\nfn new(port: u16) -> Self {\n    Server { port: port.max(1) }\n}\n// ...\n";
        let out = lazy(FILE, edit).unwrap();
        assert!(
            out.contains("    fn new(port: u16) -> Self {\n        Server { port: port.max(1) }\n    }\n"),
            "{out}"
        );
    }

    #[test]
    fn a_snippet_without_a_closing_marker_does_not_delete_the_rest_of_the_file() {
        // The model forgot the trailing marker: what follows `new` stays (see ARCHITECTURE).
        let edit = "// ...\n    fn new(port: u16) -> Self {\n        Server { port: 80 }\n    }\n";
        let out = lazy(FILE, edit).unwrap();
        assert_eq!(out, FILE.replace("Server { port }", "Server { port: 80 }"));
    }

    #[test]
    fn a_snippet_without_a_closing_marker_ends_the_file_when_little_follows() {
        // The last method and the impl's brace are the file's end: `stop` goes.
        let edit =
            "// ...\n    fn start(&self) {\n        println!(\"start\");\n        listen(self.port);\n    }\n}\n";
        let out = lazy(FILE, edit).unwrap();
        assert!(!out.contains("fn stop"), "{out}");
        assert!(out.ends_with("        listen(self.port);\n    }\n}\n"), "{out}");
        // Three lines of a long file followed by a short tail: the tail goes.
        let long: String = (0..40).map(|i| format!("line {i}\n")).collect();
        let out = lazy(&long, "# ...\nline 30\nline 31 changed\nline 32\n").unwrap();
        assert_eq!(out.lines().count(), 33, "{out}");
        assert!(out.ends_with("line 31 changed\nline 32\n"));
    }

    #[test]
    fn a_new_test_shaped_like_an_old_one_goes_where_its_context_is() {
        // The new test resembles `test_warn` line for line; the segment's first line (context
        // next to the marker, held once) still decides where it goes: nothing is replaced.
        let file = "def test_a():\n    pass\n\n\ndef test_warn():\n    class Spec:\n        pass\n    pm = Manager()\n    pm.add(Spec)\n    assert pm.warned\n    assert record.line == 1\n\n\ndef test_last():\n    pass\n";
        let edit = "# ...\n    assert record.line == 1\n\n\ndef test_warn_args():\n    class Spec:\n        pass\n    pm = Manager()\n    pm.add(Spec)\n    assert pm.warned_args\n\n\ndef test_last():\n# ...\n";
        let out = lazy(file, edit).unwrap();
        let expected = file.replace(
            "    assert record.line == 1\n\n\n",
            "    assert record.line == 1\n\n\ndef test_warn_args():\n    class Spec:\n        pass\n    pm = Manager()\n    pm.add(Spec)\n    assert pm.warned_args\n\n\n",
        );
        assert_eq!(out, expected);
    }

    #[test]
    fn a_new_method_at_a_segments_end_does_not_swallow_the_next_one() {
        // The new method's closing brace must not be matched to `start`'s.
        let edit = "// ...\n    fn new(port: u16) -> Self {\n        Server { port }\n    }\n\n    fn restart(&self) {\n        self.stop();\n    }\n// ...\n";
        let out = lazy(FILE, edit).unwrap();
        let expected = FILE.replace(
            "        Server { port }\n    }\n",
            "        Server { port }\n    }\n\n    fn restart(&self) {\n        self.stop();\n    }\n",
        );
        assert_eq!(out, expected);
    }

    #[test]
    fn inserted_code_that_looks_like_the_code_after_it_is_inserted_before_it() {
        // The new call repeats the shape of the next one; the segment's last lines (its
        // context) place its end, so nothing after the insertion is dropped.
        let file = "def check():\n    assert_raises(\n        2.0,\n        1.0,\n        [\n            \"failed\",\n        ],\n    )\n\n\ndef other():\n    pass\n";
        let edit = "# ...\ndef check():\n    assert_raises(\n        True,\n        False,\n        [\n            \"mismatch\",\n        ],\n    )\n    assert_raises(\n        2.0,\n        1.0,\n# ...\n";
        let out = lazy(file, edit).unwrap();
        let expected = file.replace(
            "def check():\n",
            "def check():\n    assert_raises(\n        True,\n        False,\n        [\n            \"mismatch\",\n        ],\n    )\n",
        );
        assert_eq!(out, expected);
    }

    #[test]
    fn new_tests_between_context_the_file_holds_together_are_inserted_there() {
        // The new test repeats most of `test_multi`: read line by line, the segment fits
        // better over it (dropping its `BytesIO` line to agree). Its context before
        // (`bad_headers`, held once) and after (`)`) stand together in the file: an insertion
        // between them.
        let file = "def test_bad():\n    with raises(Error):\n        Response(\n            200,\n            headers=bad_headers,\n            content=body,\n        )\n\n\ndef test_multi():\n    body = compress(b\"abc\")\n    body = BytesIO(body + body)\n    headers = [(b\"Content-Encoding\", b\"zstd\")]\n    with raises(Error):\n        Response(\n            200,\n            headers=headers,\n            content=body[1:3],\n        )\n    more()\n";
        let added = "        )\n\n\ndef test_truncated():\n    body = compress(b\"abc\")\n    headers = [(b\"Content-Encoding\", b\"zstd\")]\n    with raises(Error):\n        Response(\n            200,\n            headers=headers,\n            content=body[1:3],\n";
        let edit = format!(
            "# ...\n            200,\n            headers=bad_headers,\n            content=body,\n{added}        )\n\n\n# ...\n"
        );
        let out = lazy(file, &edit).unwrap();
        assert_eq!(
            out,
            file.replacen("            content=body,\n", &format!("            content=body,\n{added}"), 1)
        );
    }

    #[test]
    fn lines_that_change_only_a_comment_are_changed_in_place() {
        // The snippet moves a pragma from one line to another. Both lines, as written, are
        // the next method's: read line by line, dropping the rest of `connect_tcp` to agree
        // with them would fit. Equal but for a comment, they are changes in place.
        let method = |name: &str, extra: &str, sig: &str, body: &str| {
            format!(
                "    def {name}(\n        self,\n        timeout: float = None,\n{extra}        options: list = None,\n    ) -> Stream:{sig}\n        if options is None:\n            options = []{body}\n        errors = {{\n            TimeoutError: ConnectTimeout,\n        }}\n        return open(errors)\n"
            )
        };
        let file = format!(
            "class Backend:\n{}\n{}",
            method("connect_tcp", "        local_address: str = None,\n", "", "  # pragma: no cover"),
            method("connect_unix", "", "  # pragma: nocover", "")
        );
        let edit = "# ...\n        timeout: float = None,\n        local_address: str = None,\n        options: list = None,\n    ) -> Stream:  # pragma: nocover\n        if options is None:\n            options = []\n        errors = {\n            TimeoutError: ConnectTimeout,\n# ...\n";
        let expected = format!(
            "class Backend:\n{}\n{}",
            method("connect_tcp", "        local_address: str = None,\n", "  # pragma: nocover", ""),
            method("connect_unix", "", "  # pragma: nocover", "")
        );
        assert_eq!(lazy(&file, edit).unwrap(), expected);
    }

    #[test]
    fn places_that_change_as_many_lines_are_told_apart_by_how_much_changes() {
        // Both docstrings fit line for line; the snippet's lines are closer to the second's.
        let doc = |cond: &str| {
            format!(
                "    Like:

        (u for u in users if {cond}u.active)

    .. versionadded:: 2.7
"
            )
        };
        let file = format!(
            "def select():
{}    pass


def reject():
{}    pass
",
            doc(""),
            doc("not ")
        );
        let edit = "# ...
    Like:

        (user for user in users if not user.active)

    .. versionadded:: 2.7
# ...
";
        let expected =
            file.replace("(u for u in users if not u.active)", "(user for user in users if not user.active)");
        assert_eq!(lazy(&file, edit).unwrap(), expected);
        // The same change to both: still ambiguous.
        let twice = format!(
            "def a():
{}    pass


def b():
{}    pass
",
            doc(""),
            doc("")
        );
        assert!(matches!(lazy(&twice, edit), Err(Error::Ambiguous { .. })));
    }

    #[test]
    fn a_lone_keyword_is_not_an_anchor_when_better_lines_are_found() {
        // `else:` recurs; the segment is placed by `second(x)`, its context, not by it.
        let file = "if a:\n    first(x)\nelse:\n    pass\n\nif b:\n    second(x)\nelse:\n    pass\n";
        let edit = "# ...\nelse:\n    second(x)\n    third(x)\n# ...\n";
        let out = lazy(file, "# ...\n    second(x)\n    third(x)\nelse:\n# ...\n").unwrap();
        assert_eq!(out, file.replace("    second(x)\n", "    second(x)\n    third(x)\n"));
        assert!(lazy(file, edit).is_ok());
    }

    #[test]
    fn nothing_to_anchor_on_or_two_places_are_errors() {
        assert!(matches!(lazy(FILE, "// ...\nfn brand_new() {}\n// ...\n"), Err(Error::NoMatch { .. })));
        let twice = "fn a() {\n    work();\n}\nfn b() {\n    work();\n}\n";
        assert!(matches!(lazy(twice, "// ...\n    work();\n    more();\n// ...\n"), Err(Error::Ambiguous { .. })));
        assert!(matches!(parse("// ...\n\n// ...\n"), Err(Error::Malformed(_))));
    }

    #[test]
    fn the_same_change_to_repeated_code_is_laid_in_order() {
        // Three overloads alike; each segment fits all three, but only one order lays them.
        let block = "@overload\ndef get(key: str) -> int: ...\n";
        let file = format!("import x\n\n{block}\n{block}\n{block}\ndef done(): pass\n");
        let changed = "@overload\ndef get(key: str) -> int | None: ...\n";
        let edit = format!("# ...\n{changed}# ...\n{changed}# ...\n{changed}# ...\n");
        assert_eq!(lazy(&file, &edit).unwrap(), file.replace(block, changed));
        // One such segment alone still fits three places: ambiguous, never guessed.
        let one = format!("# ...\n{changed}# ...\n");
        assert!(matches!(lazy(&file, &one), Err(Error::Ambiguous { lines, .. }) if lines.len() == 3));
    }

    #[test]
    fn a_snippet_without_any_marker_is_the_whole_file() {
        let file = "# generated by tool 1\n#\nalpha==1.0\n    # via app\nbeta==2.0\n    # via app\n";
        let edit = "alpha==1.1\n    # via app\nbeta==2.0\n    # via app\ngamma==0.1\n";
        assert_eq!(lazy(file, edit).unwrap(), edit);
        // With a closing marker the file's first lines stay (a snippet may start anywhere).
        let long: String = (0..40).map(|i| format!("line {i}\n")).collect();
        let out = lazy(&long, "line 3\nline 4 changed\n# ...\n").unwrap();
        assert!(out.starts_with("line 0\nline 1\nline 2\nline 3\nline 4 changed\nline 5\n"), "{out}");
    }

    #[test]
    fn a_changed_first_line_is_replaced_by_the_new_lines_above_the_context() {
        // No opening marker: the snippet starts the file. Its new first lines stand where the
        // file's one old import stood; that import goes.
        let file = "import typing as _t\nfrom datetime import datetime\n\n\nclass BadData(Exception):\n    pass\n";
        let edit = "from __future__ import annotations\n\nimport typing as t\nfrom datetime import datetime\n\n\nclass BadData(Exception):\n# ...\n";
        let expected =
            file.replace("import typing as _t\n", "from __future__ import annotations\n\nimport typing as t\n");
        assert_eq!(lazy(file, edit).unwrap(), expected);
        // More old lines above than the snippet puts there: kept (a snippet may start
        // anywhere, and a forgotten marker must not delete an import block).
        let imports = "import a\nimport b\nimport c\nimport d\nfrom datetime import datetime\n\n\nclass BadData(Exception):\n    pass\n";
        let out = lazy(imports, "from os import path\nfrom datetime import datetime\n# ...\n").unwrap();
        assert!(out.starts_with("import a\nimport b\nimport c\nimport d\nfrom os import path\n"), "{out}");
    }

    #[test]
    fn a_snippet_without_markers_that_agrees_with_nothing_replaces_a_file_as_short() {
        assert_eq!(lazy("version = \"24.8.0\"\n", "version = \"24.10.0\"\n").unwrap(), "version = \"24.10.0\"\n");
        let generated = "# generated\n__version__ = \"1\"\n";
        let new = "# generated by tool\nTYPE_CHECKING = False\n__version__ = version = \"2\"\n";
        assert_eq!(lazy(generated, new).unwrap(), new);
        // A file much longer than the snippet is not replaced by it: nothing to anchor on.
        let long: String = (0..40).map(|i| format!("line {i}\n")).collect();
        assert!(matches!(lazy(&long, "fn brand_new() {}\n"), Err(Error::NoMatch { .. })));
    }

    #[test]
    fn a_deeper_look_alike_of_the_first_line_does_not_hide_the_place_of_the_last() {
        // The snippet's first lines are new; `from m import f` is found only indented, inside
        // the `try`. The last line stands as written at the top level: the segment goes there.
        let file = "from typing import Any, Callable\n\nfrom x import Request\n\nif CHECK:\n    f = None\nelse:\n    try:\n        from m import f\n    except ImportError:\n        f = None\n\n\ndef run():\n    f()\n";
        let edit = "from typing import Callable\n\nfrom m import f\nfrom x import Request\n\n\ndef run():\n# ...\n";
        let expected =
            "from typing import Callable\n\nfrom m import f\nfrom x import Request\n\n\ndef run():\n    f()\n";
        assert_eq!(lazy(file, edit).unwrap(), expected);
    }

    #[test]
    fn first_lines_moved_within_the_snippet_are_not_kept_twice() {
        let file = "import sys\nfrom subprocess import call\n\n\ndef main():\n    call(sys.argv)\n";
        let edit = "from subprocess import call\nimport sys\n\n\ndef main():\n# ...\n";
        assert_eq!(
            lazy(file, edit).unwrap(),
            "from subprocess import call\nimport sys\n\n\ndef main():\n    call(sys.argv)\n"
        );
    }

    #[test]
    fn a_segment_whose_first_line_moved_is_placed_by_its_last_lines() {
        // `alpha_value` moves from `other` into `items`: the first line worth anchoring on
        // points at `other`, the segment's last lines at `items`.
        let file = "items = [\n    \"beta_value\",\n    \"gamma_value\",\n]\n\nother = [\n    \"alpha_value\",\n    \"delta_value\",\n]\n";
        let edit = "# ...\nitems = [\n    \"alpha_value\",\n    \"beta_value\",\n    \"gamma_value\",\n]\n# ...\n";
        let out = lazy(file, edit).unwrap();
        assert!(out.starts_with("items = [\n    \"alpha_value\",\n    \"beta_value\",\n"), "{out}");
        assert!(out.ends_with("other = [\n    \"alpha_value\",\n    \"delta_value\",\n]\n"), "{out}");
    }
}
