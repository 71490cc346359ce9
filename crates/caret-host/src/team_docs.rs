//! A team server's documentation sources from a member's machine (`caret docs … --server`):
//! the server crawls, indexes and searches them (`caret_library::team`).

use caret_protocol::docs::{AddDocsSource, DocsHit, DocsHits, DocsSearch, DocsSource, DocsSourceList, DocsState};

use crate::remote::Api;

/// Adds a source (the server crawls it).
pub async fn add(api: &Api, req: &AddDocsSource) -> anyhow::Result<DocsSource> {
    anyhow::ensure!(
        req.url.starts_with("http://") || req.url.starts_with("https://"),
        "a team server crawls docs sites (an http(s) URL), not {}",
        req.url
    );
    api.call(api.client.post(api.url("/v1/docs/sources")).json(req)).await
}

/// The tenant's sources.
pub async fn list(api: &Api) -> anyhow::Result<Vec<DocsSource>> {
    Ok(api.call::<DocsSourceList>(api.client.get(api.url("/v1/docs/sources"))).await?.sources)
}

/// Removes a source.
pub async fn remove(api: &Api, name: &str) -> anyhow::Result<()> {
    api.call::<serde_json::Value>(api.client.delete(api.url(&format!("/v1/docs/sources/{name}")))).await?;
    Ok(())
}

/// Queues a source's crawl again.
pub async fn refresh(api: &Api, name: &str) -> anyhow::Result<DocsSource> {
    api.call(api.client.post(api.url(&format!("/v1/docs/sources/{name}/refresh")))).await
}

/// Searches the tenant's sources.
pub async fn search(api: &Api, req: &DocsSearch) -> anyhow::Result<Vec<DocsHit>> {
    Ok(api.call::<DocsHits>(api.client.post(api.url("/v1/docs/search")).json(req)).await?.hits)
}

/// Follows a source's update until it ends (ready or failed), telling `progress` each look.
pub async fn wait(api: &Api, name: &str, progress: &mut dyn FnMut(&DocsSource)) -> anyhow::Result<DocsSource> {
    loop {
        let now = list(api).await?.into_iter().find(|s| s.name == name);
        let s = now.ok_or_else(|| anyhow::anyhow!("the server has no docs source {name} any more"))?;
        progress(&s);
        if matches!(s.state, DocsState::Ready | DocsState::Failed) {
            return Ok(s);
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}
