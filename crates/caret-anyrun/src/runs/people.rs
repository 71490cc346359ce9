//! What a team server knows of the people behind runs: whose daily budget a run's model calls
//! count against, and whose records go when a run is deleted (by a person, or when its
//! retention ends).

use std::sync::Arc;

use super::RunService;

/// The people behind runs, as the server's identity store knows them. Runs of service
/// accounts and tenant tokens belong to no one: no budget, nothing to forget.
#[async_trait::async_trait]
pub trait People: Send + Sync {
    /// Whether a model call of `tenant`'s run `run` may go now: `Err` with the reason when its
    /// owner's budget is spent.
    async fn admit(&self, tenant: &str, run: &str) -> Result<(), String>;

    /// Counts `tokens` of `model` that a call of the run spent (in the background).
    fn spent(&self, tenant: &str, run: &str, model: &str, tokens: u64);

    /// The run is deleted: whatever is kept of whose it was goes too.
    async fn gone(&self, tenant: &str, run: &str);
}

impl RunService {
    /// Sets who the people behind runs are (once; later calls are ignored).
    pub fn set_people(&self, people: Arc<dyn People>) {
        let _ = self.people.set(people);
    }
}
