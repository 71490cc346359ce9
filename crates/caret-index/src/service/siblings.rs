//! Workspaces that share a key (a team's clones, branches and checkouts of one repository):
//! a new one starts as a fork of the sibling its first sync's sketch matches, and vectors one
//! of them has are copied to another rather than embedded again.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use caret_store::{Record, VectorBatch};

use super::{Loaded, Service};
use crate::Result;
use crate::db::Tenant;

/// Sibling workspaces loaded from storage to compare a sketch with, or to copy a first
/// index's vectors from.
const SIBLINGS_LOADED: usize = 4;

impl Service {
    /// Starts a workspace that holds nothing yet from the sibling (same tenant, same key)
    /// whose files hold most of the client's sketch, when at least half of it: the sibling's
    /// log is folded (into its delta when that stays small beside its segment, else into a
    /// new segment), the segment (and delta) copied inside the bucket under this workspace's
    /// prefix, the segment shared in memory ([`caret_store::Bases`]), and the sync that
    /// follows sends only what differs. Returns the sibling's id.
    ///
    /// A sibling that is its segment alone (nothing to fold: the source of earlier copies,
    /// say) is preferred unless another holds an eighth more of the sketch: forking from it
    /// writes nothing and shares the segment its other copies hold, where folding a copy
    /// with changes of its own would write a new segment, held apart.
    pub(super) async fn fork_from_sibling(
        &self,
        tenant: &Tenant,
        id: &str,
        key_id: &str,
        sketch: &[String],
    ) -> Result<Option<String>> {
        let sketch: HashSet<u64> = sketch.iter().filter_map(|h| u64::from_str_radix(h.get(..16)?, 16).ok()).collect();
        if sketch.is_empty() {
            return Ok(None);
        }
        let cell = self.state(tenant, id).await?;
        let mut state = cell.state.lock().await;
        if state.seq != 0 || state.file_count() != 0 {
            return Ok(None);
        }
        // Siblings in memory, and a few from storage.
        // (score, shared, id, state): the score is the sketch's leaves the sibling holds, an
        // eighth of the sketch more for one that needs no fold.
        let mut best: Option<(usize, usize, String, Arc<Loaded>)> = None;
        let mut loads = 0;
        for row in self.db.workspaces(tenant).await? {
            if row.key_id != key_id || row.id == id || row.files == 0 {
                continue;
            }
            let held = self
                .loaded
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&(tenant.id.clone(), row.id.clone()))
                .cloned();
            let other = match held {
                Some(other) => other,
                None if loads < SIBLINGS_LOADED => {
                    loads += 1;
                    self.state(tenant, &row.id).await?
                }
                None => continue,
            };
            let (shared, whole) = {
                let state = other.state.lock().await;
                (state.leaves_matching(&sketch), super::segment_alone(&state))
            };
            let score = shared + if whole { sketch.len().div_ceil(8) } else { 0 };
            if shared * 2 >= sketch.len() && best.as_ref().is_none_or(|(s, ..)| score > *s) {
                best = Some((score, shared, row.id, other));
            }
        }
        let Some((_, shared, sibling, other)) = best else { return Ok(None) };
        // The sibling's log folded first, so that its newest manifest holds all it has: into
        // its delta while what follows its segment is small beside it (an eighth, as any
        // fold's choice), the copy then sharing the segment and holding a copy of the delta;
        // else into a new segment, which the copy shares whole. Writing a new segment for a
        // small delta would cost the sibling's whole index again, in time while this request
        // waits and in memory while its earlier copies hold the old one (a compaction running
        // already is waited for, a minute at most).
        let waited = std::time::Instant::now();
        while other.compacting.load(Ordering::Acquire) && waited.elapsed() < std::time::Duration::from_secs(60) {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        self.compact(tenant, &sibling, 0).await?;
        let ns = self.namespace(tenant, id);
        let Some(seq) = ns.fork_from(&self.namespace(tenant, &sibling)).await? else { return Ok(None) };
        *state = ns.load().await?;
        self.db.note_log_seq(tenant, id, seq).await?;
        let root = state.tree().root_hash().to_hex();
        self.db.update_root(tenant, id, &root, state.file_count() as u64, state.chunk_count() as u64).await?;
        tracing::info!(
            workspace = id,
            from = %sibling,
            sketch = sketch.len(),
            shared,
            files = state.file_count(),
            "a new workspace starts as a copy of its sibling"
        );
        Ok(Some(sibling))
    }

    /// Copies to `id` the vectors of `wanted` chunks that a sibling has.
    pub(super) async fn copy_from_siblings(
        &self,
        tenant: &Tenant,
        id: &str,
        cell: &Arc<Loaded>,
        model: &str,
        mut wanted: HashSet<[u8; 32]>,
    ) -> Result<()> {
        // Siblings already in memory; for a first index (nothing embedded yet: a clone, a
        // teammate's copy) also a few from storage. Loading every workspace of a large team
        // for the few chunks an edit made would cost more than embedding them.
        let (mut siblings, mut loaded) = (Vec::new(), HashSet::new());
        for ((t, w), other) in self.loaded.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            if *t == tenant.id && w != id && other.key_id == cell.key_id {
                siblings.push(other.clone());
                loaded.insert(w.clone());
            }
        }
        let first_index = cell.state.lock().await.vector_progress(model).1 == 0;
        if first_index && siblings.len() < SIBLINGS_LOADED {
            let rows = self.db.workspaces(tenant).await?;
            let unloaded =
                rows.into_iter().filter(|w| w.key_id == cell.key_id && w.id != id && !loaded.contains(&w.id));
            for sibling in unloaded.take(SIBLINGS_LOADED - siblings.len()) {
                siblings.push(self.state(tenant, &sibling.id).await?);
            }
        }
        let mut batch = VectorBatch { model: model.to_owned(), dim: 0, ids: Vec::new(), data: Vec::new() };
        for other in siblings {
            if wanted.is_empty() {
                break;
            }
            let state = other.state.lock().await;
            wanted.retain(|c| match state.vector(c, model) {
                Some(v) => {
                    batch.dim = u32::try_from(v.len()).unwrap_or(0);
                    batch.ids.push(*c);
                    batch.data.extend_from_slice(v);
                    false
                }
                None => true,
            });
        }
        if batch.ids.is_empty() {
            return Ok(());
        }
        tracing::info!(reused = batch.ids.len(), "vectors reused from workspaces sharing the key");
        let reused = batch.ids.clone();
        let mut state = cell.state.lock().await;
        self.append(tenant, id, &mut state, vec![Record::Vectors(batch)]).await?;
        self.maybe_compact(tenant, id, cell, &state);
        // Their texts, held since the commit for the model, are not needed any more.
        self.held.release(&tenant.id, id, &reused);
        Ok(())
    }
}
