//! Commands in the bubblewrap sandbox: what they may do, and escapes tried and refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use caret_sandbox::{Bwrap, Policy, Sandbox, Spec};
use caret_test_support::TempDir;

struct Setup {
    ws: TempDir,
    home: TempDir,
    outside: TempDir,
}

fn sandbox(network: bool) -> (Bwrap, Setup) {
    let (ws, home, outside) = (TempDir::new(), TempDir::new(), TempDir::new());
    home.write(".ssh/id_ed25519", "PRIVATE KEY\n");
    let mut policy = Policy::new(ws.path()).unwrap();
    policy.hidden = vec![home.path().to_path_buf()];
    policy.network = network;
    let b = Bwrap::new(policy).expect("bubblewrap must be installed (Debian: bubblewrap) and work here");
    (b, Setup { ws, home, outside })
}

fn spec(command: &str, s: &Setup) -> Spec {
    Spec { timeout: Duration::from_secs(20), ..Spec::new(command, s.ws.path()) }
}

#[tokio::test]
async fn commands_work_in_the_workspace_and_nowhere_else() {
    let (b, s) = sandbox(false);
    s.ws.write("in.txt", "hello\n");
    let out = b.run(&spec("cat in.txt && echo made > out.txt && mkdir -p d && pwd", &s)).await.unwrap();
    assert!(out.success(), "{out:?}");
    assert_eq!(out.stdout, format!("hello\n{}\n", std::fs::canonicalize(s.ws.path()).unwrap().display()));
    assert_eq!(std::fs::read_to_string(s.ws.join("out.txt")).unwrap(), "made\n");

    // Writing outside: the system, another directory, the home.
    let target = s.outside.join("escaped");
    let cmd =
        format!("echo x > {}; echo x > /usr/escaped; echo x > {}/escaped", target.display(), s.home.path().display());
    let out = b.run(&spec(&cmd, &s)).await.unwrap();
    // The system is read-only; the rest of /tmp is an empty scratch directory.
    assert!(out.stderr.contains("/usr/escaped: Read-only file system"), "{out:?}");
    assert!(out.stderr.contains("escaped: No such file or directory"), "{out:?}");
    assert!(!target.exists() && !std::path::Path::new("/usr/escaped").exists());
    assert!(!s.home.join("escaped").exists(), "the home inside is an empty scratch directory, not the real one");

    // The home's secrets are not there.
    let out = b.run(&spec(&format!("cat {}/.ssh/id_ed25519", s.home.path().display()), &s)).await.unwrap();
    assert!(!out.success() && !out.stdout.contains("PRIVATE"), "{out:?}");
    assert!(out.stderr.contains("No such file"), "{out:?}");

    // A working directory outside the workspace is refused before anything runs.
    let err = b.run(&Spec::new("true", s.outside.path())).await.unwrap_err();
    assert!(err.to_string().contains("outside the workspace"), "{err}");
}

#[tokio::test]
async fn no_network_unless_allowed() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let connect = format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected");
    let (b, s) = sandbox(false);
    let out = b.run(&spec(&connect, &s)).await.unwrap();
    assert!(!out.success() && !out.stdout.contains("connected"), "{out:?}");
    let (open, s) = sandbox(true);
    let out = open.run(&spec(&connect, &s)).await.unwrap();
    assert!(out.success() && out.stdout.contains("connected"), "{out:?}");
}

#[tokio::test]
async fn time_and_output_are_bounded() {
    let (b, s) = sandbox(false);
    let mut slow = spec("sleep 30 & sleep 30; echo never", &s);
    slow.timeout = Duration::from_millis(300);
    let out = b.run(&slow).await.unwrap();
    assert!(out.timed_out && out.exit_code.is_none(), "{out:?}");
    assert!(out.duration < Duration::from_secs(10), "{:?}", out.duration);
    let mut loud = spec("head -c 1000000 /dev/zero | tr '\\0' x; echo done >&2", &s);
    loud.output_limit = 10_000;
    let out = b.run(&loud).await.unwrap();
    assert!(out.success() && out.truncated, "{:?}", (out.exit_code, out.truncated));
    assert_eq!(out.stdout.len(), 10_000);
    assert_eq!(out.stderr, "done\n");
    // The environment is clean, with the extra variables asked for.
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some(), "cargo sets it for tests");
    let mut env = spec("echo \"$CARGO_MANIFEST_DIR|$EXTRA|$HOME\"", &s);
    env.env.push(("EXTRA".into(), "yes".into()));
    let out = b.run(&env).await.unwrap();
    assert_eq!(out.stdout, format!("|yes|{}\n", s.home.path().display()));
}

#[tokio::test]
async fn exposed_toolchains_are_read_only_and_their_neighbours_stay_hidden() {
    let (ws, home) = (TempDir::new(), TempDir::new());
    home.write(".cargo/bin/tool", "#!/bin/sh\necho tool ran\n");
    home.write(".cargo/credentials.toml", "token = \"SECRET\"\n");
    let bin = home.join(".cargo/bin");
    std::fs::set_permissions(bin.join("tool"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut policy = Policy::new(ws.path()).unwrap();
    policy.hidden = vec![home.path().to_path_buf()];
    policy.exposed = vec![bin.clone()];
    policy.path = vec![bin.clone()];
    let b = Bwrap::new(policy).unwrap();
    let run = |cmd: String| {
        let spec = Spec { timeout: Duration::from_secs(20), ..Spec::new(cmd, ws.path()) };
        let b = b.clone();
        async move { b.run(&spec).await.unwrap() }
    };
    let out = run("tool".to_owned()).await;
    assert_eq!(out.stdout, "tool ran\n", "{out:?}");
    let out = run(format!("cat {}/.cargo/credentials.toml", home.path().display())).await;
    assert!(!out.success() && !out.stdout.contains("SECRET"), "{out:?}");
    let out = run(format!("echo x > {}/planted", bin.display())).await;
    assert!(out.stderr.contains("Read-only file system"), "{out:?}");
    assert!(!bin.join("planted").exists());
}

#[tokio::test]
async fn a_spawned_process_talks_on_its_pipes_under_the_same_fences_and_dies_when_dropped() {
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
    let (b, s) = sandbox(false);
    let script = format!(
        "grep Seccomp: /proc/self/status; echo x > {}/escaped 2>&1 || echo fenced; \
         while read line; do echo \"got $line\"; done",
        s.outside.path().display()
    );
    let mut p = b.spawn(&spec(&script, &s)).await.unwrap();
    let mut lines = tokio::io::BufReader::new(p.stdout).lines();
    let mut next = async || tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await.unwrap().unwrap();
    assert_eq!(next().await.as_deref(), Some("Seccomp:\t2"), "the filter is installed, read from its own descriptor");
    assert_eq!(next().await.as_deref(), Some("fenced"));
    p.stdin.write_all(b"one\ntwo\n").await.unwrap();
    assert_eq!(next().await.as_deref(), Some("got one"));
    assert_eq!(next().await.as_deref(), Some("got two"));
    assert!(!s.outside.join("escaped").exists());
    // Dropped: killed, and the pipe ends though its input is still open.
    let mut alive = p.alive;
    assert!(alive.running());
    drop(alive);
    assert_eq!(next().await, None);
    drop(p.stdin);
}

#[tokio::test]
async fn system_calls_a_command_never_needs_are_refused() {
    let (b, s) = sandbox(false);
    let out = b.run(&spec("grep Seccomp: /proc/self/status; unshare -U true; echo unshare=$?", &s)).await.unwrap();
    assert!(out.stdout.contains("Seccomp:\t2"), "a filter is installed: {out:?}");
    assert!(out.stdout.contains("unshare=1") || out.stdout.contains("unshare=2"), "{out:?}");
    let out = b.run(&spec("mkdir -p m && mount -t tmpfs none m; echo mount=$?", &s)).await.unwrap();
    assert!(!out.stdout.contains("mount=0"), "{out:?}");
    // Ordinary work is unaffected.
    let out = b.run(&spec("echo ok > f && cat f && ls / > /dev/null && sh -c 'exit 3'", &s)).await.unwrap();
    assert_eq!((out.exit_code, out.stdout.as_str()), (Some(3), "ok\n"));
}

#[tokio::test]
async fn memory_process_and_cpu_limits_hold() {
    use caret_sandbox::Limits;
    let ws = TempDir::new();
    let mut policy = Policy::new(ws.path()).unwrap();
    policy.limits = Limits { memory_bytes: Some(64 << 20), pids: Some(24), cpus: Some(0.5) };
    let b = Bwrap::new(policy).unwrap();
    assert_eq!(b.limits_unavailable(), None, "this kind of host allows cgroups (DESIGN: Sandboxes)");
    let run = |cmd: &str| {
        let spec = Spec { timeout: Duration::from_secs(30), ..Spec::new(cmd, ws.path()) };
        let b = b.clone();
        async move { b.run(&spec).await.unwrap() }
    };
    // 256 MiB against a 64 MiB limit: killed, and said so.
    let out =
        run("python3 -c 'b = bytearray(256 << 20); b[::4096] = b\"x\" * len(b[::4096]); print(\"survived\")'").await;
    assert!(!out.stdout.contains("survived") && out.oom_killed, "{out:?}");
    // 60 sleepers against 24 processes: forks fail (bash would retry; python says so).
    let forks = "import os, time\nn = 0\nfor i in range(60):\n    try:\n        pid = os.fork()\n    \
                 except OSError:\n        break\n    if pid == 0:\n        time.sleep(2)\n        os._exit(0)\n    \
                 n += 1\nprint(n)\n";
    ws.write("forks.py", forks);
    let out = run("python3 forks.py").await;
    let started: usize = out.stdout.trim().parse().unwrap_or(99);
    assert!(started < 24, "{out:?}");
    // Half a core: the group's quota while a command runs.
    let spec = Spec { timeout: Duration::from_secs(30), ..Spec::new("sleep 1", ws.path()) };
    let b2 = b.clone();
    let running = tokio::spawn(async move { b2.run(&spec).await.unwrap() });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // This run's groups under a hierarchy, and one file of each.
    let read = |root: &str, file: &str| -> Vec<String> {
        let ours = format!("caret-{}-", std::process::id());
        std::fs::read_dir(root)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with(&ours))
                    .filter_map(|e| std::fs::read_to_string(e.path().join(file)).ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    let (quotas, cpu_max) = (read("/sys/fs/cgroup/cpu", "cpu.cfs_quota_us"), read("/sys/fs/cgroup", "cpu.max"));
    assert!(
        quotas.iter().any(|q| q.trim() == "50000") || cpu_max.iter().any(|q| q.starts_with("50000 ")),
        "{quotas:?} {cpu_max:?}"
    );
    assert!(running.await.unwrap().success());
}

const HELPER: &str = env!("CARGO_BIN_EXE_caret-landlock");

/// Whether this kernel has Landlock (the helper says so by its exit code).
fn kernel_has_landlock() -> bool {
    let out = std::process::Command::new(HELPER).args([caret_sandbox::landlock::HELPER_ARG, "--", "true"]).output();
    out.unwrap().status.code() != Some(caret_sandbox::landlock::UNAVAILABLE_EXIT)
}

/// The helper on its own, on the host (where everything here is writable to the test): only
/// the directories it is given can be written; reading stays open.
#[test]
fn the_landlock_helper_fences_writes_to_its_directories() {
    if !kernel_has_landlock() {
        caret_test_support::skip("skipped: this kernel has no Landlock");
        return;
    }
    let (allowed, other) = (TempDir::new(), TempDir::new());
    other.write("readable.txt", "still readable\n");
    let script = format!(
        "echo ok > {a}/ok.txt; mkdir {a}/d && touch {a}/d/f; echo no > {o}/no.txt; mkdir {o}/d; rm {o}/readable.txt; \
         cat {o}/readable.txt",
        a = allowed.path().display(),
        o = other.path().display()
    );
    let out = std::process::Command::new(HELPER)
        .args([caret_sandbox::landlock::HELPER_ARG, "--write", allowed.path().to_str().unwrap(), "--"])
        .args(["sh", "-c", &script])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "still readable\n", "{stderr}");
    assert!(allowed.join("ok.txt").exists() && allowed.join("d/f").exists(), "{stderr}");
    assert!(!other.join("no.txt").exists() && !other.join("d").exists(), "{stderr}");
    assert!(other.join("readable.txt").exists(), "{stderr}");
    assert_eq!(stderr.matches("Permission denied").count(), 3, "{stderr}");
    // Bad arguments are refused before anything runs.
    let out = std::process::Command::new(HELPER).args([caret_sandbox::landlock::HELPER_ARG, "--write"]).output();
    assert_eq!(out.unwrap().status.code(), Some(126));
}

/// In the sandbox with Landlock: ordinary work is unchanged (workspace, `/tmp`, `/dev/null`,
/// the standard streams), and what only Landlock stops is stopped — signalling the sandbox's
/// init, a process outside the command's own domain.
#[tokio::test]
async fn landlock_in_the_sandbox_leaves_ordinary_work_alone() {
    let (plain, s) = sandbox(false);
    assert!(!plain.landlocked());
    let kill_init = "kill -0 1 && echo signalled";
    let out = plain.run(&spec(kill_init, &s)).await.unwrap();
    assert_eq!(out.stdout, "signalled\n", "without Landlock the init is reachable: {out:?}");
    let mut policy = plain.policy().clone().with_landlock(HELPER.into());
    let fenced = Bwrap::new(policy.clone()).unwrap();
    if !kernel_has_landlock() {
        assert!(!fenced.landlocked() && fenced.landlock_unavailable().is_some());
        caret_test_support::skip("skipped: this kernel has no Landlock");
        return;
    }
    assert!(fenced.landlocked(), "{:?}", fenced.landlock_unavailable());
    let work = "echo a > made.txt && mkdir -p sub && echo b > /tmp/t && cat /tmp/t && echo c > /dev/null && \
                echo d > /dev/stderr && ls /usr/bin/env && python3 -c 'print(1)'";
    let out = fenced.run(&spec(work, &s)).await.unwrap();
    assert!(out.success(), "{out:?}");
    assert_eq!((out.stdout.as_str(), out.stderr.as_str()), ("b\n/usr/bin/env\n1\n", "d\n"));
    assert!(s.ws.join("made.txt").exists() && s.ws.join("sub").is_dir());
    let out = fenced.run(&spec(kill_init, &s)).await.unwrap();
    assert!(!out.success() && out.stderr.contains("Operation not permitted"), "{out:?}");
    // A helper that is not there: no Landlock, and the sandbox says why.
    policy.landlock = Some("/nonexistent/caret".into());
    let missing = Bwrap::new(policy).unwrap();
    assert!(!missing.landlocked());
    assert!(missing.landlock_unavailable().unwrap().contains("no helper"), "{:?}", missing.landlock_unavailable());
}

#[tokio::test]
async fn a_running_sandbox_is_sampled_by_its_workspace() {
    let (b, s) = sandbox(false);
    let other = TempDir::new();
    let ws = std::fs::canonicalize(s.ws.path()).unwrap();
    // A command that holds 64 MiB and burns CPU for a while.
    let run = {
        let b = b.clone();
        let spec = spec(
            "python3 -c 'x = bytearray(64 << 20); import time; t = time.time()\nwhile time.time() - t < 3: pass'",
            &s,
        );
        tokio::spawn(async move { b.run(&spec).await })
    };
    let mut seen = caret_sandbox::usage::Usage::default();
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let u = caret_sandbox::usage::of_workspace(&ws);
        if u.memory_bytes > 64 << 20 && u.cpu_ms > 300 {
            seen = u;
            break;
        }
    }
    assert!(seen.processes >= 2, "bwrap and the command: {seen:?}");
    assert!(seen.memory_bytes > 64 << 20, "{seen:?}");
    assert_eq!(caret_sandbox::usage::of_workspace(other.path()), caret_sandbox::usage::Usage::default());
    assert!(run.await.unwrap().unwrap().success());
    assert_eq!(caret_sandbox::usage::of_workspace(&ws).processes, 0, "nothing left once the command ended");
}

/// Without the network, the environment's allowed hosts are reached through the proxy — over
/// CONNECT and as plain HTTP — and nothing else: another port is refused with the reason, a
/// listed name that resolves to loopback is refused, and connecting directly still fails.
#[tokio::test]
async fn allowed_hosts_are_reached_through_the_proxy_and_nothing_else() {
    let (allowed, other) =
        (caret_test_support::http_server("allowed-body"), caret_test_support::http_server("other-body"));
    let (plain, s) = sandbox(false);
    let mut policy = plain.policy().clone().with_landlock(HELPER.into());
    policy.hosts =
        caret_sandbox::netproxy::AllowList::parse(&[format!("127.0.0.1:{allowed}"), format!("localhost:{other}")])
            .unwrap();
    let b = Bwrap::new(policy).unwrap();
    let curl = "curl -sS --max-time 10 --noproxy ''";
    let script = format!(
        "{curl} -p -x \"$HTTPS_PROXY\" http://127.0.0.1:{allowed}/tunnel; echo; \
         {curl} -x \"$HTTP_PROXY\" http://127.0.0.1:{allowed}/plain; echo; \
         {curl} -x \"$HTTP_PROXY\" http://127.0.0.1:{other}/; echo; \
         {curl} -x \"$HTTP_PROXY\" http://localhost:{other}/; echo; \
         curl -sS --max-time 10 --noproxy '*' http://127.0.0.1:{allowed}/direct || echo direct-refused"
    );
    let out = b.run(&spec(&script, &s)).await.unwrap();
    let lines: Vec<&str> = out.stdout.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(lines[..2], ["allowed-body", "allowed-body"], "{out:?}");
    assert!(lines[2].contains(&format!("127.0.0.1:{other} is not among the environment's allowed hosts")), "{out:?}");
    assert!(lines[3].contains("resolves only to internal addresses"), "{out:?}");
    assert_eq!(lines.last(), Some(&"direct-refused"), "{out:?}");
    assert!(!out.stdout.contains("other-body"), "{out:?}");
}
