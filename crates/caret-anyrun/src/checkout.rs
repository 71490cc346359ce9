//! The git side of an attempt: checking the code out (a bundle plus its patch, or a URL with
//! the run's credential), the base commit, the patch a run made, pushing it as a branch, and
//! the failure an attempt ends with when one of these goes wrong.

use std::path::Path;

use caret_protocol::runs::{Lease, PushOutcome, PushTarget, RepoSource, RunResult};

use crate::Error;
use crate::coordinator::Coordinator;

/// Runs `git` with a fixed identity and no hooks or prompts; its output, or why it failed.
pub(crate) async fn git(dir: &Path, args: &[&str]) -> std::result::Result<String, String> {
    git_with(dir, None, None, args).await
}

/// `git` with an index file of its own (`GIT_INDEX_FILE`), so that it never contends with the
/// agent's own git commands for the repository's index.
pub(crate) async fn git_indexed(
    dir: &Path,
    index: Option<&Path>,
    args: &[&str],
) -> std::result::Result<String, String> {
    git_with(dir, index, None, args).await
}

/// The HTTP header that authenticates to an https remote with the run's git credential
/// (basic auth, the token as the password), when the run has one and the remote is https.
pub(crate) fn remote_auth(url: &str, lease: &Lease) -> Option<String> {
    use base64::Engine as _;
    let token = lease.git_credential.as_ref().filter(|_| url.starts_with("https://"))?;
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{token}"));
    Some(format!("Authorization: Basic {basic}"))
}

/// `git` with, optionally, its own index and an `http.extraHeader` (given through the
/// environment, so no other process sees it in a command line).
pub(crate) async fn git_with(
    dir: &Path,
    index: Option<&Path>,
    header: Option<String>,
    args: &[&str],
) -> std::result::Result<String, String> {
    let mut command = tokio::process::Command::new("git");
    if let Some(index) = index {
        command.env("GIT_INDEX_FILE", index);
    }
    if let Some(header) = header {
        command
            .env("GIT_CONFIG_COUNT", "1")
            .env("GIT_CONFIG_KEY_0", "http.extraHeader")
            .env("GIT_CONFIG_VALUE_0", header);
    }
    let out = command
        .args(["-c", "core.hooksPath=/dev/null", "-c", "user.name=caret", "-c", "user.email=caret@localhost"])
        .args(["-c", "commit.gpgsign=false", "-c", "advice.detachedHead=false"])
        .args(args)
        .current_dir(dir)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("running git: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!("git {} failed: {}", args.first().unwrap_or(&""), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// The end of a command's output, for events.
pub(crate) fn tail(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("[...]{}", &text[start..])
}

/// Why an attempt failed, and whether another attempt could do better.
pub(crate) struct Failure {
    pub(crate) reason: String,
    pub(crate) retry: bool,
}

impl From<String> for Failure {
    fn from(reason: String) -> Failure {
        fail(reason)
    }
}

pub(crate) fn fail(reason: impl Into<String>) -> Failure {
    Failure { reason: reason.into(), retry: false }
}

/// Fetches the code into `repo` (the uploaded bundle and its uncommitted changes, or a clone).
pub(crate) async fn checkout(
    coord: &dyn Coordinator,
    lease: &Lease,
    run_dir: &Path,
    repo: &Path,
) -> std::result::Result<(), Failure> {
    let repo_s = repo.display().to_string();
    match &lease.repo {
        RepoSource::Bundle { head, patch, .. } => {
            let bytes = coord.bundle(&lease.lease).await.map_err(|e| Failure {
                reason: format!("fetching the bundle: {e}"),
                retry: !matches!(e, Error::NotFound(_)),
            })?;
            let file = run_dir.join("code.bundle");
            std::fs::write(&file, bytes).map_err(|e| fail(format!("writing the bundle: {e}")))?;
            git(run_dir, &["clone", "-q", "--no-checkout", &file.display().to_string(), &repo_s])
                .await
                .map_err(fail)?;
            git(repo, &["checkout", "-q", "--detach", head]).await.map_err(fail)?;
            let _ = std::fs::remove_file(&file);
            if !patch.is_empty() {
                let p = run_dir.join("uncommitted.patch");
                std::fs::write(&p, patch).map_err(|e| fail(format!("writing the patch: {e}")))?;
                git(repo, &["apply", "--binary", "--whitespace=nowarn", &p.display().to_string()])
                    .await
                    .map_err(|e| fail(format!("applying the uncommitted changes: {e}")))?;
            }
        }
        RepoSource::Git { url, git_ref } => {
            git_with(run_dir, None, remote_auth(url, lease), &["clone", "-q", "--", url, &repo_s])
                .await
                .map_err(fail)?;
            if let Some(r) = git_ref {
                git(repo, &["checkout", "-q", "--detach", r]).await.map_err(fail)?;
            }
        }
    }
    Ok(())
}

/// Commits the workspace as it is (code and prepared environment) as the run's starting
/// point; answers the commit.
pub(crate) async fn commit_base(repo: &Path) -> std::result::Result<String, Failure> {
    git(repo, &["add", "-A"]).await.map_err(fail)?;
    git(repo, &["commit", "-q", "--allow-empty", "--no-verify", "-m", "caret: the run's starting point"])
        .await
        .map_err(fail)?;
    Ok(git(repo, &["rev-parse", "HEAD"]).await.map_err(fail)?.trim().to_owned())
}

/// Pushes the run's changes (staged by [`patch`]) as one commit on the code's head, to the
/// target's branch. The starting-point commit is dropped when it adds nothing (no uncommitted
/// work came with the code, no install output git does not ignore); otherwise the branch has
/// it too.
pub(crate) async fn push(repo: &Path, lease: &Lease, target: &PushTarget) -> PushOutcome {
    let url = target.url.clone().unwrap_or_default();
    let branch = target.branch.clone().unwrap_or_else(|| format!("caret/{}", lease.lease.run));
    let pushed = async {
        if git(repo, &["diff", "--quiet", "HEAD~1", "HEAD"]).await.is_ok() {
            git(repo, &["reset", "-q", "--soft", "HEAD~1"]).await?;
        }
        let subject: String = lease.task.lines().next().unwrap_or_default().chars().take(72).collect();
        let body = format!("Made by caret run {}.", lease.lease.run);
        git(repo, &["commit", "-q", "--no-verify", "--allow-empty", "-m", &subject, "-m", &body]).await?;
        let commit = git(repo, &["rev-parse", "HEAD"]).await?.trim().to_owned();
        let refspec = format!("HEAD:refs/heads/{branch}");
        git_with(repo, None, remote_auth(&url, lease), &["push", "-q", "--", &url, &refspec]).await?;
        Ok::<_, String>(commit)
    }
    .await;
    match pushed {
        Ok(commit) => PushOutcome { url, branch, commit: Some(commit), error: None },
        Err(e) => PushOutcome { url, branch, commit: None, error: Some(e) },
    }
}

/// The largest patch a run returns.
pub(crate) const MAX_PATCH_BYTES: usize = 32 << 20;

/// Fills the result's patch and files with the changes since `base`.
pub(crate) async fn patch(repo: &Path, base: &str, result: &mut RunResult) -> std::result::Result<(), Failure> {
    git(repo, &["add", "-A"]).await.map_err(fail)?;
    let names = git(repo, &["diff", "--cached", "--name-only", base]).await.map_err(fail)?;
    result.files = names.lines().map(str::to_owned).collect();
    let text = git(repo, &["diff", "--cached", "--binary", base]).await.map_err(fail)?;
    if text.len() > MAX_PATCH_BYTES {
        return Err(fail(format!(
            "the changes are {} bytes as a patch; the most is {MAX_PATCH_BYTES} (build outputs not in .gitignore?)",
            text.len()
        )));
    }
    result.patch = text;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_git_credential_goes_to_https_remotes_only() {
        let mut lease: Lease = serde_json::from_value(serde_json::json!({
            "lease": {"run": "run-1", "token": 1}, "tenant": "t", "attempt": 1, "task": "x", "model": "m",
            "limits": caret_protocol::runs::RunLimits::default(), "repo": {"kind": "git", "url": "https://git.example.com/a.git"},
            "environment": caret_protocol::runs::RunEnvironment::default(), "secret_values": {},
            "lease_ttl_s": 30, "tokens_used": 0
        }))
        .unwrap();
        assert_eq!(remote_auth("https://git.example.com/a.git", &lease), None, "no credential, no header");
        lease.git_credential = Some("tok".into());
        // base64("x-access-token:tok")
        assert_eq!(
            remote_auth("https://git.example.com/a.git", &lease).as_deref(),
            Some("Authorization: Basic eC1hY2Nlc3MtdG9rZW46dG9r")
        );
        assert_eq!(remote_auth("http://git.example.com/a.git", &lease), None, "never over plain http");
        assert_eq!(remote_auth("file:///srv/a.git", &lease), None);
    }
}
