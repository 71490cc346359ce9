//! Per-host network allow-lists: a sandbox without the network reaches the hosts its
//! environment names, and nothing else, through an HTTP proxy on the host side.
//!
//! The sandbox keeps its own network namespace (loopback only). The proxy listens on a Unix
//! socket that the backend puts inside the sandbox; a forwarder in the sandbox (the helper,
//! see [`crate::landlock`], or the microVM's guest agent) listens on `127.0.0.1:`[`PORT`] and
//! passes each connection to that socket, and every command gets `HTTP_PROXY`/`HTTPS_PROXY`
//! pointing there. Tools that honour them (curl, git, pip, npm, cargo) work unchanged.
//!
//! The proxy answers `CONNECT host:port` (TLS passes through untouched) and plain-HTTP
//! requests in absolute form; a host not on the list gets `403` with the reason in the body.
//! Names are resolved here, on the host, once: every address is checked and the connection
//! goes to an address that passed. Under a guarded [`Egress`] policy (a team server's), an
//! internal address is refused unless the operator opened it, whatever the list says; under
//! the open one (a single user's machine), a name that resolves to a loopback, link-local
//! (cloud metadata), unspecified or multicast address is still refused unless the list names
//! that address itself — so a listed name cannot be pointed at the machine's own services.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs as _};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::egress::Egress;

/// The port the forwarder listens on inside a sandbox.
pub const PORT: u16 = 3128;

/// Where the proxy's socket appears inside a sandbox.
pub const SOCKET_INSIDE: &str = "/tmp/.caret-proxy.sock";

/// The variables that point a command's tools at the proxy.
pub fn proxy_env() -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{PORT}");
    let mut env: Vec<(String, String)> =
        ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"]
            .iter()
            .map(|k| ((*k).to_owned(), url.clone()))
            .collect();
    env.extend(["NO_PROXY", "no_proxy"].map(|k| (k.to_owned(), "localhost,127.0.0.1,::1".to_owned())));
    env
}

/// One allowed host.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    /// This name exactly (lowercase, no trailing dot).
    Name(String),
    /// Any name under this suffix (`*.example.com`: `a.example.com`, not `example.com`).
    Suffix(String),
    /// This address.
    Address(IpAddr),
}

/// Hosts a sandbox may reach: `example.com`, `*.example.com`, an IP address, each with an
/// optional `:port` (default: 80 and 443 only); and the egress policy every connection to
/// them is checked against.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AllowList {
    entries: Vec<(Pattern, Option<u16>)>,
    egress: Egress,
}

impl AllowList {
    /// Parses entries; the first bad one is the error.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<AllowList, String> {
        let mut list = AllowList::default();
        for e in entries {
            list.entries.push(parse_entry(e.as_ref())?);
        }
        Ok(list)
    }

    /// The same hosts, each connection checked against `egress`.
    pub fn under(mut self, egress: Egress) -> AllowList {
        self.egress = egress;
        self
    }

    /// No host allowed.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `host:port` is allowed (before resolution).
    pub fn allows(&self, host: &str, port: u16) -> bool {
        self.matching(host, port).is_some()
    }

    /// The entry allowing `host:port`, if any.
    fn matching(&self, host: &str, port: u16) -> Option<&Pattern> {
        let name = host.trim_end_matches('.').to_ascii_lowercase();
        let address = name.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().ok();
        self.entries.iter().find_map(|(p, allowed_port)| {
            let port_ok = allowed_port.map_or(port == 80 || port == 443, |a| a == port);
            let host_ok = match (p, address) {
                (Pattern::Address(a), Some(b)) => *a == b,
                (Pattern::Address(_), None) | (_, Some(_)) => false,
                (Pattern::Name(n), None) => *n == name,
                (Pattern::Suffix(s), None) => name.len() > s.len() + 1 && name.ends_with(&format!(".{s}")),
            };
            (port_ok && host_ok).then_some(p)
        })
    }
}

/// The host an allow-list entry names and the ports it opens (none given: 80 and 443).
pub fn host_and_ports(entry: &str) -> (String, Vec<u16>) {
    match parse_entry(entry) {
        Ok((pattern, port)) => {
            let host = match pattern {
                Pattern::Name(n) | Pattern::Suffix(n) => n,
                Pattern::Address(a) => a.to_string(),
            };
            (host, port.map_or(vec![80, 443], |p| vec![p]))
        }
        Err(_) => (entry.to_owned(), vec![80, 443]),
    }
}

fn parse_entry(entry: &str) -> Result<(Pattern, Option<u16>), String> {
    let bad = |why: &str| format!("allowed host {entry:?}: {why}");
    let e = entry.trim();
    if e.is_empty() {
        return Err(bad("empty"));
    }
    if e.contains("://") || e.contains('/') {
        return Err(bad("a host name, not a URL"));
    }
    let (host, port) = crate::egress::split_port(e).map_err(bad)?;
    let port = port.map(|p| p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| bad("bad port"))).transpose()?;
    if let Ok(a) = host.parse::<IpAddr>() {
        return Ok((Pattern::Address(a), port));
    }
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let (wild, name) = match host.strip_prefix("*.") {
        Some(n) => (true, n.to_owned()),
        None => (false, host),
    };
    let label_ok = |l: &str| {
        !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(bad("not a host name"));
    }
    Ok((if wild { Pattern::Suffix(name) } else { Pattern::Name(name) }, port))
}

/// Counts of what the proxy did.
#[derive(Debug, Default)]
pub struct Counters {
    /// Connections made to allowed hosts.
    pub allowed: AtomicU64,
    /// Requests refused.
    pub refused: AtomicU64,
}

/// A running proxy; stopped (and its socket removed) when dropped.
#[derive(Debug)]
pub struct Proxy {
    socket: PathBuf,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
}

impl Proxy {
    /// Listens on `socket` (a new path) for sandboxes allowed `allow`.
    pub fn start(socket: &Path, allow: AllowList) -> std::io::Result<Proxy> {
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket)?;
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let (stop_bg, counters_bg, allow) = (stop.clone(), counters.clone(), Arc::new(allow));
        std::thread::Builder::new().name("caret-netproxy".into()).spawn(move || {
            for conn in listener.incoming() {
                if stop_bg.load(Ordering::Acquire) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (allow, counters) = (allow.clone(), counters_bg.clone());
                let _ = std::thread::Builder::new().name("caret-netproxy-conn".into()).spawn(move || {
                    serve(conn, &allow, &counters);
                });
            }
        })?;
        Ok(Proxy { socket: socket.to_owned(), stop, counters })
    }

    /// The socket's path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// What it has done so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
}

/// A loopback TCP port in front of a [`Proxy`]'s socket, for clients on the host side that
/// speak to proxies over TCP only (the worker's own connections for a run, such as its remote
/// MCP servers): the same list, the same checks. Closed when dropped.
#[derive(Debug)]
pub struct Entrance {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Entrance {
    /// Listens on a free port of 127.0.0.1 and passes each connection to `proxy`.
    pub fn open(proxy: &Proxy) -> std::io::Result<Entrance> {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
        let address = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (stop_bg, socket) = (stop.clone(), proxy.socket.clone());
        std::thread::Builder::new().name("caret-netproxy-entrance".into()).spawn(move || {
            for conn in listener.incoming() {
                if stop_bg.load(Ordering::Acquire) {
                    return;
                }
                let (Ok(conn), Ok(inner)) = (conn, UnixStream::connect(&socket)) else { continue };
                let _ =
                    std::thread::Builder::new().name("caret-netproxy-conn".into()).spawn(move || splice(conn, inner));
            }
        })?;
        Ok(Entrance { address, stop })
    }

    /// The proxy's URL for HTTP clients (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }
}

/// A proxy and its loopback entrance for host-side HTTP clients (a docs crawl, a run's or a
/// server session's remote MCP servers): its own socket, closed when dropped.
#[derive(Debug)]
pub struct Gate {
    _proxy: Proxy,
    entrance: Entrance,
}

impl Gate {
    /// A proxy for `allow` on a fresh socket under the temporary directory, and its entrance.
    pub fn open(allow: AllowList) -> std::io::Result<Gate> {
        static GATES: AtomicU64 = AtomicU64::new(0);
        let n = GATES.fetch_add(1, Ordering::Relaxed);
        let socket = std::env::temp_dir().join(format!("caret-gate-{}-{n}.sock", std::process::id()));
        let proxy = Proxy::start(&socket, allow)?;
        let entrance = Entrance::open(&proxy)?;
        Ok(Gate { _proxy: proxy, entrance })
    }

    /// The proxy's URL for HTTP clients (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        self.entrance.url()
    }
}

impl Drop for Entrance {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = TcpStream::connect(self.address);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the accepting thread so that it sees the flag.
        let _ = UnixStream::connect(&self.socket);
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Longest request head read.
const HEAD_LIMIT: usize = 16 << 10;

/// One client connection: its first request decides where it goes.
fn serve(conn: UnixStream, allow: &AllowList, counters: &Counters) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(reader_side) = conn.try_clone() else { return };
    let mut reader = BufReader::new(reader_side);
    let mut head = Vec::new();
    loop {
        let before = head.len();
        match reader.by_ref().take((HEAD_LIMIT - head.len()) as u64).read_until(b'\n', &mut head) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if !head.ends_with(b"\n") {
            return refuse(conn, counters, "431 Request Header Fields Too Large", "request head too long");
        }
        // The empty line ends the head.
        if before > 0 && matches!(&head[before..], b"\r\n" | b"\n") {
            break;
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let first = text.lines().next().unwrap_or_default();
    let mut parts = first.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return refuse(conn, counters, "400 Bad Request", "not an HTTP proxy request");
    };
    let connect = method.eq_ignore_ascii_case("CONNECT");
    let Some((host, port)) = (if connect { split_authority(target, 443) } else { absolute_target(target) }) else {
        return refuse(conn, counters, "400 Bad Request", "the request names no host (use it as an HTTP proxy)");
    };
    let Some(pattern) = allow.matching(&host, port) else {
        return refuse(
            conn,
            counters,
            "403 Forbidden",
            &format!("caret: {host}:{port} is not among the environment's allowed hosts"),
        );
    };
    let literal = matches!(pattern, Pattern::Address(_));
    let bare = host.trim_start_matches('[').trim_end_matches(']').to_owned();
    let resolved = match (bare.as_str(), port).to_socket_addrs() {
        Ok(a) => a,
        Err(e) => return refuse(conn, counters, "502 Bad Gateway", &format!("caret: resolving {host}: {e}")),
    };
    let mut refusal = None;
    let addresses: Vec<SocketAddr> = resolved
        .filter(|a| match allow.egress.permits(&bare, *a) {
            Err(why) => {
                refusal.get_or_insert(why);
                false
            }
            Ok(()) => allow.egress.is_guarded() || literal || crate::egress::internal(a.ip()).is_none(),
        })
        .collect();
    if let (true, Some(why)) = (addresses.is_empty(), refusal) {
        return refuse(conn, counters, "403 Forbidden", &format!("caret: {why}"));
    }
    // The connection goes to an address that was checked, never to the name again.
    let Some(upstream) = addresses.iter().find_map(|a| TcpStream::connect_timeout(a, Duration::from_secs(10)).ok())
    else {
        let why = if addresses.is_empty() {
            format!("caret: {host} resolves only to internal addresses")
        } else {
            format!("caret: cannot connect to {host}:{port}")
        };
        return refuse(conn, counters, "502 Bad Gateway", &why);
    };
    counters.allowed.fetch_add(1, Ordering::Relaxed);
    let mut client = conn;
    let _ = client.set_read_timeout(None);
    let mut up = upstream;
    if connect {
        if client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").is_err() {
            return;
        }
    } else {
        // The request goes on in origin form (not every server takes absolute-form targets),
        // one request per connection: later ones on it would be absolute-form again.
        if up.write_all(origin_form(&text).as_bytes()).is_err() {
            return;
        }
    }
    // Bytes the reader already took past the head go first.
    let buffered = reader.buffer().to_vec();
    if !buffered.is_empty() && up.write_all(&buffered).is_err() {
        return;
    }
    splice(client, up);
}

/// A stream that can be copied both ways at once (a TCP or Unix socket).
pub trait Duplex: std::io::Read + std::io::Write + Send + Sized + 'static {
    /// A second handle to the same stream.
    fn duplicate(&self) -> std::io::Result<Self>;
    /// Ends the writing half (the peer reads end-of-stream).
    fn close_write(&self);
}

impl Duplex for TcpStream {
    fn duplicate(&self) -> std::io::Result<Self> {
        self.try_clone()
    }
    fn close_write(&self) {
        let _ = self.shutdown(std::net::Shutdown::Write);
    }
}

impl Duplex for UnixStream {
    fn duplicate(&self) -> std::io::Result<Self> {
        self.try_clone()
    }
    fn close_write(&self) {
        let _ = self.shutdown(std::net::Shutdown::Write);
    }
}

/// Copies both ways until both sides have ended (each end passed on as it comes).
pub fn splice(a: impl Duplex, b: impl Duplex) {
    let (Ok(mut a2), Ok(mut b2)) = (a.duplicate(), b.duplicate()) else { return };
    let back = std::thread::spawn(move || {
        let _ = std::io::copy(&mut b2, &mut a2);
        a2.close_write();
    });
    let (mut a, mut b) = (a, b);
    let _ = std::io::copy(&mut a, &mut b);
    b.close_write();
    let _ = back.join();
}

fn refuse(mut conn: UnixStream, counters: &Counters, status: &str, why: &str) {
    counters.refused.fetch_add(1, Ordering::Relaxed);
    let body = format!("{why}\n");
    let _ = write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// `host:port` (or `[v6]:port`), the port defaulting to `default`.
fn split_authority(authority: &str, default: u16) -> Option<(String, u16)> {
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    if authority.starts_with('[') {
        let end = authority.find(']')?;
        let port = authority[end + 1..].strip_prefix(':').map_or(Some(default), |p| p.parse().ok())?;
        return Some((authority[..=end].to_owned(), port));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => Some((h.to_owned(), p.parse().ok()?)),
        None if !authority.is_empty() => Some((authority.to_owned(), default)),
        None => None,
    }
}

/// The host and port of an absolute-form target (`http://host[:port]/path`).
/// A plain-HTTP proxy request's head as its server takes it: `GET /path HTTP/1.1` (from `GET
/// http://host/path HTTP/1.1`), hop-by-hop and proxy headers dropped, `Connection: close`.
fn origin_form(head: &str) -> String {
    let mut lines = head.split("\r\n").flat_map(|l| l.split('\n'));
    let first = lines.next().unwrap_or_default();
    let mut parts = first.splitn(3, ' ');
    let (method, target, version) =
        (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let after_scheme = target.split_once("://").map_or(target, |(_, rest)| rest);
    let path = after_scheme.find(['/', '?']).map_or("/".to_owned(), |i| {
        let p = &after_scheme[i..];
        if p.starts_with('?') { format!("/{p}") } else { p.to_owned() }
    });
    let mut out = format!("{method} {path} {version}\r\n");
    for line in lines.filter(|l| !l.is_empty()) {
        let name = line.split(':').next().unwrap_or_default().trim().to_ascii_lowercase();
        if !matches!(name.as_str(), "connection" | "proxy-connection" | "keep-alive" | "proxy-authorization") {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    out
}

fn absolute_target(target: &str) -> Option<(String, u16)> {
    let rest = target.strip_prefix("http://").or_else(|| target.strip_prefix("HTTP://"))?;
    let authority = rest.split(['/', '?', '#']).next()?;
    split_authority(authority, 80)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> AllowList {
        AllowList::parse(entries).unwrap()
    }

    #[test]
    fn entries_allow_their_hosts_and_ports_only() {
        let l = list(&["crates.io", "*.github.com", "10.1.2.3:8080", "[::1]:9000", "static.example.org:8443"]);
        let cases = [
            ("crates.io", 443, true),
            ("CRATES.IO.", 80, true),
            ("crates.io", 22, false),
            ("index.crates.io", 443, false),
            ("api.github.com", 443, true),
            ("github.com", 443, false),
            ("evilgithub.com", 443, false),
            ("10.1.2.3", 8080, true),
            ("10.1.2.3", 443, false),
            ("[::1]", 9000, true),
            ("static.example.org", 8443, true),
            ("static.example.org", 443, false),
        ];
        for (host, port, want) in cases {
            assert_eq!(l.allows(host, port), want, "{host}:{port}");
        }
        for bad in ["", "https://crates.io", "a b", "host:0", "host:99999", "[::1", "*."] {
            assert!(AllowList::parse(&[bad]).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn request_targets_name_host_and_port() {
        assert_eq!(split_authority("crates.io:443", 443), Some(("crates.io".into(), 443)));
        assert_eq!(split_authority("[::1]:80", 443), Some(("[::1]".into(), 80)));
        assert_eq!(absolute_target("http://example.com/a?b"), Some(("example.com".into(), 80)));
        assert_eq!(absolute_target("http://example.com:8080"), Some(("example.com".into(), 8080)));
        assert_eq!(absolute_target("/relative"), None);
        assert_eq!(
            origin_form(
                "POST http://a.example:8080/mcp?x=1 HTTP/1.1\r\nHost: a.example:8080\r\nProxy-Connection: keep-alive\r\nConnection: keep-alive\r\nX-Team: caret\r\n\r\n"
            ),
            "POST /mcp?x=1 HTTP/1.1\r\nHost: a.example:8080\r\nX-Team: caret\r\nConnection: close\r\n\r\n"
        );
        assert_eq!(origin_form("GET http://a.example HTTP/1.0\n\n"), "GET / HTTP/1.0\r\nConnection: close\r\n\r\n");
    }

    #[test]
    fn the_entrance_takes_tcp_clients_to_the_same_list() {
        // A server that answers one line.
        let server = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = server.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for mut c in server.incoming().flatten() {
                let _ = c.write_all(b"hello from upstream\n");
            }
        });
        let dir = std::env::temp_dir().join(format!("caret-entrance-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let proxy = Proxy::start(&dir.join("p.sock"), list(&[&format!("127.0.0.1:{port}")])).unwrap();
        let entrance = Entrance::open(&proxy).unwrap();
        let ask = |target: &str| {
            let mut c = TcpStream::connect(entrance.url().trim_start_matches("http://")).unwrap();
            c.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes()).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut got = String::new();
            let _ = c.read_to_string(&mut got);
            got
        };
        let allowed = ask(&format!("127.0.0.1:{port}"));
        assert!(allowed.starts_with("HTTP/1.1 200") && allowed.ends_with("hello from upstream\n"), "{allowed}");
        let refused = ask("127.0.0.2:80");
        assert!(refused.starts_with("HTTP/1.1 403") && refused.contains("not among"), "{refused}");
        assert_eq!(proxy.counters().refused.load(Ordering::Relaxed), 1);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_guarded_proxy_refuses_internal_addresses_in_every_spelling_unless_opened() {
        let server = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = server.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for mut c in server.incoming().flatten() {
                let _ = c.write_all(b"internal service\n");
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let spellings = ["127.0.0.1", "127.1", "2130706433", "0x7f.1", "[::ffff:127.0.0.1]", "localhost"];
        let listed: Vec<String> = spellings.iter().map(|s| format!("{s}:{port}")).collect();
        let ask = |proxy: &Proxy, target: &str| {
            let mut c = UnixStream::connect(proxy.socket()).unwrap();
            c.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes()).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut got = String::new();
            let _ = c.read_to_string(&mut got);
            got
        };
        // The tenant lists every spelling; the operator opened nothing internal.
        let guarded = Egress::guarded::<&str>(&[]).unwrap();
        let proxy = Proxy::start(&dir.path().join("g.sock"), list_of(&listed).under(guarded)).unwrap();
        for target in &listed {
            let got = ask(&proxy, target);
            assert!(got.starts_with("HTTP/1.1 403") && got.contains("egress policy refuses"), "{target}: {got}");
            assert!(got.contains("loopback address") && !got.contains("internal service"), "{target}: {got}");
        }
        // The operator opens this port of loopback: exactly that, not its neighbour.
        let opened = Egress::guarded(&[format!("127.0.0.1:{port}")]).unwrap();
        let proxy = Proxy::start(&dir.path().join("o.sock"), list_of(&listed).under(opened)).unwrap();
        for target in ["127.0.0.1", "127.1", "2130706433"].map(|s| format!("{s}:{port}")) {
            let got = ask(&proxy, &target);
            assert!(got.starts_with("HTTP/1.1 200") && got.ends_with("internal service\n"), "{target}: {got}");
        }
        let other = format!("127.0.0.1:{}", port.wrapping_add(1).max(1));
        let proxy = Proxy::start(
            &dir.path().join("n.sock"),
            list_of(std::slice::from_ref(&other)).under(Egress::guarded(&[format!("127.0.0.1:{port}")]).unwrap()),
        )
        .unwrap();
        assert!(ask(&proxy, &other).starts_with("HTTP/1.1 403"));
    }

    fn list_of(entries: &[String]) -> AllowList {
        AllowList::parse(entries).unwrap()
    }
}
