//! Texts received at commit time and held in memory until they are embedded, so that a
//! chunk's text crosses the wire once: the client's embed request then asks for the next
//! held ones by count instead of sending their texts again.
//!
//! Memory only, never the disk: a restart, another replica, or the byte budget running out
//! loses a text; the listing then no longer marks it held and the client sends it. Each held
//! text keeps its content hash, so an embed request's key is checked against it as a sent
//! text's would be.
//!
//! Texts are kept per workspace, so that a listing or an embed request looks its chunks up
//! under one lock without building a key per chunk.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// Bytes of texts one server holds at most by default (oldest dropped first).
pub const DEFAULT_BUDGET: usize = 256 << 20;

/// A workspace: tenant and workspace id.
type Workspace = (String, String);

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
    /// Each workspace's held texts by keyed chunk id.
    texts: HashMap<Workspace, HashMap<[u8; 32], Held>>,
    /// Oldest first, for dropping past the budget (may name texts released since).
    order: VecDeque<(Workspace, [u8; 32])>,
    bytes: usize,
}

impl Inner {
    fn remove(&mut self, ws: &Workspace, id: &[u8; 32]) {
        let Some(texts) = self.texts.get_mut(ws) else { return };
        if let Some(gone) = texts.remove(id) {
            self.bytes -= gone.text.len();
        }
        if texts.is_empty() {
            self.texts.remove(ws);
        }
    }

    fn len(&self) -> usize {
        self.texts.values().map(HashMap::len).sum()
    }
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
        let workspace: Workspace = (tenant.to_owned(), ws.to_owned());
        let mut inner = self.lock();
        let Inner { texts: all, order, bytes } = &mut *inner;
        let here = all.entry(workspace.clone()).or_default();
        for (id, held) in texts {
            if held.text.len() > self.budget {
                continue;
            }
            *bytes += held.text.len();
            match here.insert(id, held) {
                Some(old) => *bytes -= old.text.len(),
                None => order.push_back((workspace.clone(), id)),
            }
        }
        if here.is_empty() {
            all.remove(&workspace);
        }
        while inner.bytes > self.budget {
            let Some((ws, id)) = inner.order.pop_front() else { break };
            inner.remove(&ws, &id);
        }
    }

    /// Which of `ids` are held, in their order.
    pub fn holding(&self, tenant: &str, ws: &str, ids: impl IntoIterator<Item = [u8; 32]>) -> Vec<bool> {
        let inner = self.lock();
        let texts = inner.texts.get(&(tenant.to_owned(), ws.to_owned()));
        ids.into_iter().map(|id| texts.is_some_and(|t| t.contains_key(&id))).collect()
    }

    /// The first `n` of `ids` that are held, with their texts (kept until
    /// [`HeldTexts::release`]).
    pub fn first_held(
        &self,
        tenant: &str,
        ws: &str,
        ids: impl IntoIterator<Item = [u8; 32]>,
        n: usize,
    ) -> Vec<([u8; 32], Held)> {
        let inner = self.lock();
        let Some(texts) = inner.texts.get(&(tenant.to_owned(), ws.to_owned())) else { return Vec::new() };
        ids.into_iter().filter_map(|id| texts.get(&id).map(|h| (id, h.clone()))).take(n).collect()
    }

    /// Drops the texts of chunks that have their vectors now.
    pub fn release(&self, tenant: &str, ws: &str, ids: &[[u8; 32]]) {
        let workspace: Workspace = (tenant.to_owned(), ws.to_owned());
        let mut inner = self.lock();
        for id in ids {
            inner.remove(&workspace, id);
        }
        // The order keeps released texts until they reach its front; bound it by the live count.
        if inner.order.len() > 2 * inner.len() + 1024 {
            let Inner { texts, order, .. } = &mut *inner;
            order.retain(|(ws, id)| texts.get(ws).is_some_and(|t| t.contains_key(id)));
        }
    }

    /// Drops every text of a workspace (it was deleted).
    pub fn forget_workspace(&self, tenant: &str, ws: &str) {
        let workspace: Workspace = (tenant.to_owned(), ws.to_owned());
        let mut inner = self.lock();
        if let Some(gone) = inner.texts.remove(&workspace) {
            inner.bytes -= gone.values().map(|h| h.text.len()).sum::<usize>();
        }
        inner.order.retain(|(ws, _)| *ws != workspace);
    }

    /// `(texts, bytes)` held now.
    pub fn usage(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.len(), inner.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(text: &str) -> Held {
        Held { content: [0; 32], text: text.to_owned() }
    }

    impl HeldTexts {
        fn holds(&self, tenant: &str, ws: &str, id: &[u8; 32]) -> bool {
            self.holding(tenant, ws, [*id]) == [true]
        }

        fn get(&self, tenant: &str, ws: &str, id: &[u8; 32]) -> Option<Held> {
            self.first_held(tenant, ws, [*id], 1).pop().map(|(_, h)| h)
        }
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
        // In the asked order, only those held, at most n.
        store.hold("t", "w", [([5; 32], held("ee"))]);
        let first: Vec<[u8; 32]> =
            store.first_held("t", "w", [[9; 32], [5; 32], [3; 32]], 1).into_iter().map(|(id, _)| id).collect();
        assert_eq!(first, [[5; 32]]);
        assert_eq!(store.holding("t", "w", [[3; 32], [9; 32]]), [true, false]);
        store.release("t", "w", &[[5; 32]]);
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
