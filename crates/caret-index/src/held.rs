//! Texts received at commit time and held in memory until they are embedded, so that a
//! chunk's text crosses the wire once: the client's embed request then names the chunks
//! (ids only) instead of sending their texts again.
//!
//! Memory only, never the disk: a restart, another replica, or the byte budget running out
//! loses a text, and the client is told which (`absent`) and sends those. Each held text
//! keeps its content hash, so an embed request's key is checked against it as a sent text's
//! would be.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// Bytes of texts one server holds at most by default (oldest dropped first).
pub const DEFAULT_BUDGET: usize = 256 << 20;

/// A held text's place: tenant, workspace, keyed chunk id.
type Key = (String, String, [u8; 32]);

/// One held text: what the model embeds (context lines and text) and its content hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The chunk's content hash (before keying), to check an embed request's key.
    pub content: [u8; 32],
    /// Context lines and text, as embedded.
    pub text: String,
}

/// Texts awaiting their vectors, oldest first, within a byte budget.
#[derive(Debug)]
pub struct HeldTexts {
    budget: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    texts: HashMap<Key, Held>,
    order: VecDeque<Key>,
    bytes: usize,
}

impl HeldTexts {
    /// An empty store that holds at most `budget` bytes of text (0: holds nothing).
    pub fn new(budget: usize) -> Self {
        HeldTexts { budget, inner: Mutex::new(Inner::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Holds `texts` of a workspace's chunks, dropping the oldest held texts past the budget.
    pub fn hold(&self, tenant: &str, ws: &str, texts: impl IntoIterator<Item = ([u8; 32], Held)>) {
        if self.budget == 0 {
            return;
        }
        let mut inner = self.lock();
        for (id, held) in texts {
            if held.text.len() > self.budget {
                continue;
            }
            let key = (tenant.to_owned(), ws.to_owned(), id);
            inner.bytes += held.text.len();
            if let Some(old) = inner.texts.insert(key.clone(), held) {
                inner.bytes -= old.text.len();
            } else {
                inner.order.push_back(key);
            }
        }
        while inner.bytes > self.budget {
            let Some(oldest) = inner.order.pop_front() else { break };
            if let Some(gone) = inner.texts.remove(&oldest) {
                inner.bytes -= gone.text.len();
            }
        }
    }

    /// Whether the chunk's text is held.
    pub fn holds(&self, tenant: &str, ws: &str, id: &[u8; 32]) -> bool {
        self.lock().texts.contains_key(&(tenant.to_owned(), ws.to_owned(), *id))
    }

    /// The held text of a chunk (kept until [`HeldTexts::release`]).
    pub fn get(&self, tenant: &str, ws: &str, id: &[u8; 32]) -> Option<Held> {
        self.lock().texts.get(&(tenant.to_owned(), ws.to_owned(), *id)).cloned()
    }

    /// Drops the texts of chunks that have their vectors now.
    pub fn release(&self, tenant: &str, ws: &str, ids: &[[u8; 32]]) {
        let mut inner = self.lock();
        for id in ids {
            if let Some(gone) = inner.texts.remove(&(tenant.to_owned(), ws.to_owned(), *id)) {
                inner.bytes -= gone.text.len();
            }
        }
        // The order keeps stale keys until they reach its front; bound it by the live count.
        if inner.order.len() > 2 * inner.texts.len() + 1024 {
            let Inner { texts, order, .. } = &mut *inner;
            order.retain(|k| texts.contains_key(k));
        }
    }

    /// Drops every text of a workspace (it was deleted).
    pub fn forget_workspace(&self, tenant: &str, ws: &str) {
        let mut inner = self.lock();
        let Inner { texts, order, bytes } = &mut *inner;
        texts.retain(|(t, w, _), held| {
            let keep = t != tenant || w != ws;
            if !keep {
                *bytes -= held.text.len();
            }
            keep
        });
        order.retain(|k| texts.contains_key(k));
    }

    /// `(texts, bytes)` held now.
    pub fn usage(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.texts.len(), inner.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(text: &str) -> Held {
        Held { content: [0; 32], text: text.to_owned() }
    }

    #[test]
    fn held_texts_stay_within_the_budget_oldest_dropped_first() {
        let store = HeldTexts::new(10);
        store.hold("t", "w", [([1; 32], held("aaaa")), ([2; 32], held("bbbb"))]);
        assert_eq!(store.usage(), (2, 8));
        store.hold("t", "w", [([3; 32], held("cccc"))]);
        assert!(!store.holds("t", "w", &[1; 32]), "the oldest goes");
        assert!(store.holds("t", "w", &[2; 32]) && store.holds("t", "w", &[3; 32]));
        assert_eq!(store.usage(), (2, 8));
        // Another tenant's or workspace's chunk of the same id is another text.
        assert!(!store.holds("u", "w", &[2; 32]) && !store.holds("t", "x", &[2; 32]));
        // Released once embedded; a text larger than the budget is not held at all.
        store.release("t", "w", &[[2; 32]]);
        assert_eq!(store.usage(), (1, 4));
        store.hold("t", "w", [([4; 32], held("far too long a text"))]);
        assert_eq!(store.usage(), (1, 4));
        assert_eq!(store.get("t", "w", &[3; 32]).map(|h| h.text), Some("cccc".to_owned()));
        store.forget_workspace("t", "w");
        assert_eq!(store.usage(), (0, 0));
        let off = HeldTexts::new(0);
        off.hold("t", "w", [([1; 32], held("a"))]);
        assert_eq!(off.usage(), (0, 0));
    }

    #[test]
    fn holding_the_same_chunk_again_counts_it_once() {
        let store = HeldTexts::new(100);
        store.hold("t", "w", [([1; 32], held("aaaa"))]);
        store.hold("t", "w", [([1; 32], held("aaaa"))]);
        assert_eq!(store.usage(), (1, 4));
        store.release("t", "w", &[[1; 32]]);
        store.hold("t", "w", [([5; 32], held("bb"))]);
        assert_eq!(store.usage(), (1, 2));
    }
}
