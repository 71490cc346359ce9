//! Counting text in tokens of the embedding model, so chunks fit its context.
//!
//! BERT-family sentence-embedding models (the default all-MiniLM-L6-v2 among them) split text
//! on whitespace and punctuation, then into WordPiece sub-words. [`WordPiece`] reproduces that
//! count exactly from the model's own `tokenizer.json` or `vocab.txt`; [`Estimate`] is a
//! conservative stand-in used before a model is installed; [`LazyWordPiece`] is the first,
//! parsed only when a count is asked for. All are additive over whitespace, so the chunker
//! counts each line once and sums.

use std::collections::HashMap;
use std::path::Path;

use unicode_normalization::UnicodeNormalization;

use crate::{Error, Result};

/// Counts tokens of the embedding model in a piece of text.
pub trait TokenCounter: Send + Sync {
    /// The number of tokens `text` becomes, special tokens excluded.
    fn count(&self, text: &str) -> usize;
    /// Tokens the model adds around every input (e.g. `[CLS]` and `[SEP]`).
    fn special_tokens(&self) -> usize;
    /// A stable name, part of the stat cache's fingerprint (a change re-chunks everything).
    fn id(&self) -> String;
}

/// Splits text the way BERT's basic tokenizer does and calls `word` for each piece: runs of
/// letters and digits, single punctuation characters and single CJK characters.
fn for_each_word(text: &str, mut word: impl FnMut(&str)) {
    let mut start = None;
    for (i, ch) in text.char_indices() {
        let standalone = is_punctuation(ch) || is_cjk(ch);
        if ch.is_whitespace() || ch.is_control() || standalone {
            if let Some(s) = start.take() {
                word(&text[s..i]);
            }
            if standalone {
                word(&text[i..i + ch.len_utf8()]);
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        word(&text[s..]);
    }
}

fn is_punctuation(ch: char) -> bool {
    if ch.is_ascii() {
        return ch.is_ascii_punctuation();
    }
    // Outside ASCII, anything that is neither a letter, a digit, a mark nor whitespace is
    // treated as punctuation: close to BERT's Unicode `P*` check without a category table.
    !(ch.is_alphanumeric() || ch.is_whitespace() || is_mark(ch))
}

fn is_mark(ch: char) -> bool {
    unicode_normalization::char::is_combining_mark(ch)
}

fn is_cjk(ch: char) -> bool {
    matches!(ch as u32,
        0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F | 0x2B820..=0x2CEAF | 0xF900..=0xFAFF | 0x2F800..=0x2FA1F)
}

/// A conservative estimate for when no tokenizer is installed: about one token per three
/// characters of a word, one per punctuation or CJK character. It over-counts ordinary code a
/// little, so chunks sized with it also fit the real model.
#[derive(Debug, Clone, Copy, Default)]
pub struct Estimate;

impl TokenCounter for Estimate {
    fn count(&self, text: &str) -> usize {
        let mut n = 0;
        for_each_word(text, |w| n += w.chars().count().div_ceil(3).max(1));
        n
    }

    fn special_tokens(&self) -> usize {
        2
    }

    fn id(&self) -> String {
        "estimate-v1".to_owned()
    }
}

/// An exact WordPiece tokenizer built from a BERT-family model's vocabulary: it counts
/// tokens (for chunk sizes) and encodes text to ids (for the embedder).
#[derive(Debug, Clone)]
pub struct WordPiece {
    /// Whole-word and word-initial pieces, with their ids.
    initial: HashMap<Box<str>, u32>,
    /// Continuation pieces, stored without their prefix (`##`), with their ids.
    continuation: HashMap<Box<str>, u32>,
    lowercase: bool,
    strip_accents: bool,
    max_chars_per_word: usize,
    specials: Specials,
    digest: String,
}

/// Ids of the special tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Specials {
    /// `[CLS]`, first of every input.
    pub cls: u32,
    /// `[SEP]`, last of every input.
    pub sep: u32,
    /// `[UNK]`, for words the vocabulary cannot spell.
    pub unk: u32,
    /// `[PAD]`, filling batches.
    pub pad: u32,
}

impl WordPiece {
    /// Builds a tokenizer from vocabulary entries in id order (as in `vocab.txt`).
    pub fn new<'a>(vocab: impl IntoIterator<Item = &'a str>, continuing_prefix: &str, lowercase: bool) -> Self {
        let with_ids = vocab.into_iter().enumerate().map(|(i, p)| (p, u32::try_from(i).unwrap_or(u32::MAX)));
        Self::with_ids(with_ids, continuing_prefix, lowercase)
    }

    /// Builds a tokenizer from `(piece, id)` pairs.
    pub fn with_ids<'a>(
        vocab: impl IntoIterator<Item = (&'a str, u32)>,
        continuing_prefix: &str,
        lowercase: bool,
    ) -> Self {
        let mut initial = HashMap::new();
        let mut continuation = HashMap::new();
        let mut entries: Vec<(&str, u32)> = vocab.into_iter().collect();
        entries.sort_unstable_by_key(|(_, id)| *id);
        let mut hasher = blake3::Hasher::new();
        hasher.update(&[u8::from(lowercase)]);
        for (piece, id) in entries {
            hasher.update(piece.as_bytes());
            hasher.update(b"\n");
            match piece.strip_prefix(continuing_prefix) {
                Some(rest) if !continuing_prefix.is_empty() => {
                    continuation.insert(rest.into(), id);
                }
                _ => {
                    initial.insert(piece.into(), id);
                }
            }
        }
        let digest = hasher.finalize().to_hex()[..16].to_owned();
        let id_of = |t: &str, default: u32| initial.get(t).copied().unwrap_or(default);
        let specials = Specials {
            cls: id_of("[CLS]", 101),
            sep: id_of("[SEP]", 102),
            unk: id_of("[UNK]", 100),
            pad: id_of("[PAD]", 0),
        };
        WordPiece {
            initial,
            continuation,
            lowercase,
            strip_accents: lowercase,
            max_chars_per_word: 100,
            specials,
            digest,
        }
    }

    /// Loads the tokenizer of a model directory: `tokenizer.json` if present, else
    /// `vocab.txt` (lowercasing as for uncased BERT).
    pub fn from_model_dir(dir: &Path) -> Result<Self> {
        let source = Source::of_model_dir(dir)?;
        source.parse()
    }

    /// Loads a Hugging Face `tokenizer.json` whose model is WordPiece.
    pub fn from_tokenizer_json(path: &Path) -> Result<Self> {
        Source::read(path.to_path_buf(), SourceKind::TokenizerJson)?.parse()
    }

    fn parse_tokenizer_json(path: &Path, text: &str) -> Result<Self> {
        let bad = |reason: String| Error::Tokenizer { path: path.to_path_buf(), reason };
        let json: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(format!("invalid JSON: {e}")))?;
        let model = &json["model"];
        let kind = model["type"].as_str().unwrap_or("<missing>");
        if kind != "WordPiece" {
            return Err(bad(format!("model type {kind} is not supported, only WordPiece")));
        }
        let vocab = model["vocab"].as_object().ok_or_else(|| bad("model.vocab is not an object".to_owned()))?;
        let pairs = vocab
            .iter()
            .map(|(k, v)| {
                let id = v
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| bad(format!("the id of {k:?} is not a number")))?;
                Ok((k.as_str(), id))
            })
            .collect::<Result<Vec<_>>>()?;
        let prefix = model["continuing_subword_prefix"].as_str().unwrap_or("##");
        let normalizer = &json["normalizer"];
        let lowercase = normalizer["lowercase"].as_bool().unwrap_or(false);
        let mut tokenizer = Self::with_ids(pairs, prefix, lowercase);
        tokenizer.strip_accents = normalizer["strip_accents"].as_bool().unwrap_or(lowercase);
        if let Some(max) = model["max_input_chars_per_word"].as_u64() {
            tokenizer.max_chars_per_word = usize::try_from(max).unwrap_or(usize::MAX);
        }
        Ok(tokenizer)
    }

    /// The special token ids.
    pub fn specials(&self) -> Specials {
        self.specials
    }

    /// Calls `piece` with the id of each piece of one pre-tokenized word; returns the count.
    fn word_pieces(&self, word: &str, mut piece: impl FnMut(u32)) -> usize {
        if word.chars().count() > self.max_chars_per_word {
            piece(self.specials.unk);
            return 1;
        }
        let mut ids = [0u32; 32];
        let mut n = 0;
        let mut start = 0;
        while start < word.len() {
            let map = if start == 0 { &self.initial } else { &self.continuation };
            let rest = &word[start..];
            // Greedy longest match, shrinking one character at a time.
            let found = rest
                .char_indices()
                .map(|(i, c)| i + c.len_utf8())
                .rev()
                .find_map(|end| map.get(&rest[..end]).map(|id| (end, *id)));
            match found {
                Some((end, id)) => {
                    if n < ids.len() {
                        ids[n] = id;
                    }
                    n += 1;
                    start += end;
                }
                None => {
                    // The whole word becomes the unknown token.
                    piece(self.specials.unk);
                    return 1;
                }
            }
        }
        if n <= ids.len() {
            ids[..n].iter().for_each(|id| piece(*id));
        } else {
            // A word of more than 32 pieces: spell it again, emitting as we go.
            let mut start = 0;
            while start < word.len() {
                let map = if start == 0 { &self.initial } else { &self.continuation };
                let rest = &word[start..];
                let Some((end, id)) = rest
                    .char_indices()
                    .map(|(i, c)| i + c.len_utf8())
                    .rev()
                    .find_map(|end| map.get(&rest[..end]).map(|id| (end, *id)))
                else {
                    break;
                };
                piece(id);
                start += end;
            }
        }
        n
    }

    /// Calls `word` for each word of `text` after BERT's normalisation (lowercasing and accent
    /// stripping as the model asks).
    fn for_each_normalized_word(&self, text: &str, mut word: impl FnMut(&str)) {
        let needs_normalising = self.lowercase || self.strip_accents;
        for_each_word(text, |w| {
            let plain = w.is_ascii() && !w.bytes().any(|b| b.is_ascii_uppercase());
            if needs_normalising && !plain {
                let lowered: String = if self.lowercase { w.to_lowercase() } else { w.to_owned() };
                let norm: String =
                    if self.strip_accents { lowered.nfd().filter(|c| !is_mark(*c)).collect() } else { lowered };
                // Normalisation can expose new word boundaries.
                for_each_word(&norm, &mut word);
            } else {
                word(w);
            }
        });
    }

    /// The model input for `text`: `[CLS]`, the pieces (truncated), `[SEP]`; at most
    /// `max_tokens` ids.
    pub fn encode(&self, text: &str, max_tokens: usize) -> Vec<u32> {
        let room = max_tokens.saturating_sub(2);
        let mut ids = Vec::with_capacity(room.min(text.len() / 2 + 2) + 2);
        ids.push(self.specials.cls);
        self.for_each_normalized_word(text, |w| {
            if ids.len() <= room {
                self.word_pieces(w, |id| ids.push(id));
            }
        });
        ids.truncate(room + 1);
        ids.push(self.specials.sep);
        ids
    }
}

/// Which file of a model directory a tokenizer comes from, its bytes and their digest (the
/// tokenizer's name, known before and without parsing the file).
struct Source {
    path: std::path::PathBuf,
    kind: SourceKind,
    bytes: Vec<u8>,
    digest: String,
}

#[derive(Clone, Copy)]
enum SourceKind {
    TokenizerJson,
    VocabTxt,
}

impl Source {
    fn of_model_dir(dir: &Path) -> Result<Source> {
        let json = dir.join("tokenizer.json");
        let (path, kind) = if json.exists() {
            (json, SourceKind::TokenizerJson)
        } else {
            (dir.join("vocab.txt"), SourceKind::VocabTxt)
        };
        Source::read(path, kind)
    }

    fn read(path: std::path::PathBuf, kind: SourceKind) -> Result<Source> {
        let bytes = std::fs::read(&path).map_err(|e| Error::io("reading", &path, e))?;
        let mut hasher = blake3::Hasher::new();
        hasher.update(match kind {
            SourceKind::TokenizerJson => b"tokenizer.json\n",
            SourceKind::VocabTxt => b"vocab.txt\n",
        });
        hasher.update(&bytes);
        let digest = hasher.finalize().to_hex()[..16].to_owned();
        Ok(Source { path, kind, bytes, digest })
    }

    fn parse(&self) -> Result<WordPiece> {
        let text = std::str::from_utf8(&self.bytes)
            .map_err(|e| Error::Tokenizer { path: self.path.clone(), reason: format!("not UTF-8: {e}") })?;
        let mut tokenizer = match self.kind {
            SourceKind::TokenizerJson => WordPiece::parse_tokenizer_json(&self.path, text)?,
            SourceKind::VocabTxt => WordPiece::new(text.lines(), "##", true),
        };
        tokenizer.digest.clone_from(&self.digest);
        Ok(tokenizer)
    }
}

/// A model directory's WordPiece tokenizer, parsed when a count is first asked for. Its
/// [`TokenCounter::id`] (a digest of the file) is known at once, so a scan that finds every
/// file in its stat cache never parses the vocabulary: the default model's `tokenizer.json`
/// (466 KB, 30,522 pieces) takes longer to parse than the rest of a no-change scan's
/// start-up. Counts and id are those of [`WordPiece::from_model_dir`] on the same directory.
/// Should the file not parse when first used, the count falls back to [`Estimate`] (logged):
/// the id still names the file, so chunks made then are remade once the file changes.
pub struct LazyWordPiece {
    source: Source,
    loaded: std::sync::OnceLock<Box<dyn TokenCounter>>,
}

impl LazyWordPiece {
    /// Reads (but does not parse) the tokenizer of a model directory.
    pub fn open(dir: &Path) -> Result<Self> {
        Ok(LazyWordPiece { source: Source::of_model_dir(dir)?, loaded: std::sync::OnceLock::new() })
    }

    /// Whether the vocabulary has been parsed yet.
    pub fn is_loaded(&self) -> bool {
        self.loaded.get().is_some()
    }

    fn counter(&self) -> &dyn TokenCounter {
        self.loaded
            .get_or_init(|| match self.source.parse() {
                Ok(wp) => Box::new(wp),
                Err(err) => {
                    tracing::warn!(error = %err, "the embedding model's tokenizer is unusable; estimating tokens");
                    Box::new(Estimate)
                }
            })
            .as_ref()
    }
}

impl std::fmt::Debug for LazyWordPiece {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyWordPiece").field("id", &self.id()).field("loaded", &self.is_loaded()).finish()
    }
}

impl TokenCounter for LazyWordPiece {
    fn count(&self, text: &str) -> usize {
        self.counter().count(text)
    }

    /// `[CLS]` and `[SEP]`, as [`WordPiece`] and [`Estimate`] both say: known unparsed
    /// (the chunker asks when it is made).
    fn special_tokens(&self) -> usize {
        2
    }

    fn id(&self) -> String {
        format!("wordpiece-{}", self.source.digest)
    }
}

impl TokenCounter for WordPiece {
    fn count(&self, text: &str) -> usize {
        let mut n = 0;
        self.for_each_normalized_word(text, |w| n += self.word_pieces(w, |_| {}));
        n
    }

    fn special_tokens(&self) -> usize {
        2
    }

    fn id(&self) -> String {
        format!("wordpiece-{}", self.digest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab() -> WordPiece {
        WordPiece::new(
            ["[UNK]", "fn", "get", "user", "##user", "##by", "##id", "by", "id", "(", ")", "{", "}", "_", "cafe", "的"],
            "##",
            true,
        )
    }

    #[test]
    fn wordpiece_counts_subwords_punctuation_and_unknowns() {
        let wp = vocab();
        assert_eq!(wp.count("fn get_user_by_id() {}"), 12);
        assert_eq!(wp.count("getUserById"), 4, "lowercased, then get ##user ##by ##id");
        assert_eq!(wp.count("zzz"), 1, "an unknown word is one [UNK]");
        assert_eq!(wp.count(&"a".repeat(150)), 1, "an over-long word is one [UNK]");
        assert_eq!(wp.count("Café"), 1, "accents stripped before lookup");
        assert_eq!(wp.count("的的"), 2, "CJK characters stand alone");
    }

    #[test]
    fn encodes_ids_with_specials_and_truncation() {
        let wp = WordPiece::new(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "get", "##user", "(", ")"], "##", true);
        assert_eq!(wp.specials(), Specials { cls: 2, sep: 3, unk: 1, pad: 0 });
        assert_eq!(wp.encode("getUser()", 16), vec![2, 4, 5, 6, 7, 3]);
        assert_eq!(wp.encode("getUser() zzz", 16), vec![2, 4, 5, 6, 7, 1, 3], "unknown word");
        assert_eq!(wp.encode("getUser()", 4), vec![2, 4, 5, 3], "truncated to the window");
        assert_eq!(wp.encode("getUser()", 16).len() - 2, wp.count("getUser()"), "count agrees with encode");
    }

    #[test]
    fn counts_are_additive_over_lines() {
        let wp = vocab();
        let a = "fn get_user() {";
        let b = "    by_id(id) }";
        assert_eq!(wp.count(&format!("{a}\n{b}")), wp.count(a) + wp.count(b));
        let e = Estimate;
        assert_eq!(e.count(&format!("{a}\n{b}")), e.count(a) + e.count(b));
    }

    const TINY_JSON: &str = r###"{"normalizer":{"type":"BertNormalizer","lowercase":true},
         "model":{"type":"WordPiece","unk_token":"[UNK]","continuing_subword_prefix":"##",
                  "max_input_chars_per_word":100,"vocab":{"[UNK]":0,"get":1,"##user":2}}}"###;

    #[test]
    fn lazy_tokenizer_names_the_file_at_once_and_parses_on_the_first_count() {
        let dir = caret_test_support::TempDir::new();
        dir.write("tokenizer.json", TINY_JSON);
        let eager = WordPiece::from_model_dir(dir.path()).unwrap();
        let lazy = LazyWordPiece::open(dir.path()).unwrap();
        assert_eq!(lazy.id(), eager.id(), "the same name either way");
        assert!(!lazy.is_loaded(), "opening reads the file but does not parse it");
        assert_eq!(lazy.count("GetUser zzz"), eager.count("GetUser zzz"));
        assert_eq!(lazy.count("GetUser zzz"), 3);
        assert!(lazy.is_loaded());

        // Another vocabulary is another name; vocab.txt is named apart from tokenizer.json.
        let other = caret_test_support::TempDir::new();
        other.write("tokenizer.json", &TINY_JSON.replace("\"get\"", "\"got\""));
        assert_ne!(LazyWordPiece::open(other.path()).unwrap().id(), lazy.id());
        let txt = caret_test_support::TempDir::new();
        txt.write("vocab.txt", "[UNK]\nget\n##user\n");
        let (lazy_txt, eager_txt) =
            (LazyWordPiece::open(txt.path()).unwrap(), WordPiece::from_model_dir(txt.path()).unwrap());
        assert_eq!(lazy_txt.id(), eager_txt.id());
        assert_eq!(lazy_txt.count("GetUser"), 2);

        // A file that does not parse counts as the estimate does, under the file's name.
        let broken = caret_test_support::TempDir::new();
        broken.write("tokenizer.json", "{not json");
        assert!(WordPiece::from_model_dir(broken.path()).is_err());
        let lazy_broken = LazyWordPiece::open(broken.path()).unwrap();
        assert!(lazy_broken.id().starts_with("wordpiece-"));
        assert_eq!(lazy_broken.count("fn get_user_by_id() {}"), Estimate.count("fn get_user_by_id() {}"));
        // A directory without either file is an error at once, as the eager load's.
        let empty = caret_test_support::TempDir::new();
        assert!(LazyWordPiece::open(empty.path()).is_err());
    }

    #[test]
    fn loads_tokenizer_json() {
        let dir = caret_test_support::TempDir::new();
        let path = dir.write("tokenizer.json", TINY_JSON);
        let wp = WordPiece::from_tokenizer_json(&path).unwrap();
        assert_eq!(wp.count("GetUser"), 2);
        let bad = dir.write("bpe.json", r#"{"model":{"type":"BPE","vocab":{}}}"#);
        let err = WordPiece::from_tokenizer_json(&bad).unwrap_err().to_string();
        assert!(err.contains("model type BPE is not supported"), "{err}");
    }
}
