//! The egress policy: where a fetch made for a tenant may connect.
//!
//! Every connection the server or its workers make for a tenant or a repository — a docs
//! site's pages and redirects, a run's allowed hosts, remote MCP servers of runs and server
//! sessions — goes through [`crate::netproxy`], which resolves the name once, checks every
//! address with [`Egress::permits`] and connects to exactly the address it checked (no second
//! resolution between the check and the connection).
//!
//! [`Egress::Guarded`] (a team server) refuses internal addresses ([`internal`]): loopback,
//! link-local (cloud metadata: `169.254.169.254`, `fd00:ec2::254`), private, shared (CGNAT),
//! unique-local, unspecified, multicast, reserved, and the IPv6 forms that carry one of those
//! (IPv4-mapped and -compatible, NAT64, 6to4, Teredo), however the address was written. The
//! operator opens what is meant to be reached with [`Opening`]s (`[server] egress_allow`).
//! [`Egress::Open`] (the embedded single-user default) lets a user reach their own machine.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Which addresses a tenant's fetches may reach.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Egress {
    /// Every address (one user on their own machine).
    #[default]
    Open,
    /// Public addresses, and the internal ones these openings name.
    Guarded(Vec<Opening>),
}

/// An internal destination the operator opened: a host name or an address range, each on
/// one port or all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opening {
    target: Target,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// A name as a request writes it (lowercase, no trailing dot), whatever it resolves to.
    Name(String),
    /// Addresses in `network/prefix`.
    Net(IpAddr, u8),
}

/// A connection the policy refuses: what was asked, the address, and the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The host as the request named it.
    pub host: String,
    /// The port asked for.
    pub port: u16,
    /// The address it named or resolved to.
    pub address: IpAddr,
    /// The kind of internal address (`loopback`, `link-local`, `private`…).
    pub rule: &'static str,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (host, port, address, rule) = (&self.host, self.port, self.address, self.rule);
        write!(f, "the server's egress policy refuses {host}:{port}")?;
        if *host != address.to_string() {
            write!(f, " ({address})")?;
        }
        write!(f, ": {address} is a {rule} address (an operator opens internal hosts with [server] egress_allow)")
    }
}

impl std::error::Error for Refused {}

impl Egress {
    /// A guarded policy opening `entries` (`docs.intranet:443`, `10.1.2.0/24`, `[fd00::1]:8080`);
    /// the first bad entry is the error.
    pub fn guarded<S: AsRef<str>>(entries: &[S]) -> Result<Egress, String> {
        entries.iter().map(|e| Opening::parse(e.as_ref())).collect::<Result<_, _>>().map(Egress::Guarded)
    }

    /// Whether internal addresses are refused.
    pub fn is_guarded(&self) -> bool {
        matches!(self, Egress::Guarded(_))
    }

    /// Whether a connection to `address`, made for `host` (as the request named it), is
    /// allowed.
    pub fn permits(&self, host: &str, address: SocketAddr) -> Result<(), Refused> {
        let Egress::Guarded(openings) = self else { return Ok(()) };
        let Some(rule) = internal(address.ip()) else { return Ok(()) };
        let name = normal_host(host);
        if openings.iter().any(|o| o.opens(&name, address)) {
            return Ok(());
        }
        Err(Refused { host: name, port: address.port(), address: address.ip(), rule })
    }

    /// Checks a host as a URL or a request names it before anything is resolved: a literal
    /// address in any spelling ([`literal`]) is checked now; a name is checked where it is
    /// resolved (the proxy).
    pub fn check_literal(&self, host: &str, port: u16) -> Result<(), Refused> {
        match literal(host) {
            Some(address) => self.permits(host, SocketAddr::new(address, port)),
            None => Ok(()),
        }
    }
}

impl Opening {
    /// `host[:port]`, `*.` not allowed (names are opened one by one), `a.b.c.d[/n][:port]`,
    /// `v6[/n]` or `[v6]:port`.
    pub fn parse(entry: &str) -> Result<Opening, String> {
        let bad = |why: &str| format!("egress_allow entry {entry:?}: {why}");
        let e = entry.trim();
        if e.is_empty() || e.contains("://") {
            return Err(bad("a host, an address or a network with an optional :port"));
        }
        let (body, port) = split_port(e).map_err(bad)?;
        let port = port.map(|p| p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| bad("bad port"))).transpose()?;
        if let Some((net, bits)) = body.split_once('/') {
            let net: IpAddr = net.parse().map_err(|_| bad("not an address before /"))?;
            let max = if net.is_ipv4() { 32 } else { 128 };
            let bits: u8 = bits.parse().ok().filter(|b| *b <= max).ok_or_else(|| bad("bad prefix length"))?;
            return Ok(Opening { target: Target::Net(net, bits), port });
        }
        if let Ok(a) = body.parse::<IpAddr>() {
            let bits = if a.is_ipv4() { 32 } else { 128 };
            return Ok(Opening { target: Target::Net(a, bits), port });
        }
        let name = normal_host(body);
        let label_ok = |l: &str| {
            !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if name.len() > 253 || !name.split('.').all(label_ok) {
            return Err(bad("not a host name"));
        }
        Ok(Opening { target: Target::Name(name), port })
    }

    fn opens(&self, name: &str, address: SocketAddr) -> bool {
        if self.port.is_some_and(|p| p != address.port()) {
            return false;
        }
        match &self.target {
            Target::Name(n) => n == name,
            Target::Net(net, bits) => in_net(address.ip(), *net, *bits),
        }
    }
}

impl fmt::Display for Opening {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.target, self.port) {
            (Target::Name(n), None) => write!(f, "{n}"),
            (Target::Name(n), Some(p)) => write!(f, "{n}:{p}"),
            (Target::Net(a, b), None) => write!(f, "{a}/{b}"),
            (Target::Net(a, b), Some(p)) => write!(f, "[{a}/{b}]:{p}"),
        }
    }
}

/// `host[:port]`, `[v6]:port` or a bare IPv6 address or network (several colons, no
/// brackets): the host and the port's text.
pub(crate) fn split_port(entry: &str) -> Result<(&str, Option<&str>), &'static str> {
    if entry.matches(':').count() > 1 && !entry.starts_with('[') {
        return Ok((entry, None));
    }
    if let Some(rest) = entry.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("unclosed [")?;
        return Ok((host, after.strip_prefix(':')));
    }
    Ok(match entry.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (entry, None),
    })
}

/// A host lowercased, without brackets or a trailing dot.
fn normal_host(host: &str) -> String {
    host.trim().trim_start_matches('[').trim_end_matches(']').trim_end_matches('.').to_ascii_lowercase()
}

fn in_net(a: IpAddr, net: IpAddr, bits: u8) -> bool {
    let a = match (a, net) {
        (IpAddr::V6(v6), IpAddr::V4(_)) => v6.to_ipv4_mapped().map_or(a, IpAddr::V4),
        _ => a,
    };
    match (a, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = if bits == 0 { 0 } else { u32::MAX << (32 - u32::from(bits)) };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = if bits == 0 { 0 } else { u128::MAX << (128 - u32::from(bits)) };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// The kind of internal address `a` is, or none for a public one.
pub fn internal(a: IpAddr) -> Option<&'static str> {
    match a {
        IpAddr::V4(v4) => internal_v4(v4),
        IpAddr::V6(v6) => internal_v6(v6),
    }
}

fn internal_v4(a: Ipv4Addr) -> Option<&'static str> {
    let [b0, b1, b2, _] = a.octets();
    Some(match (b0, b1, b2) {
        (127, _, _) => "loopback",
        (0, _, _) => "unspecified",
        (169, 254, _) => "link-local",
        (10, _, _) | (192, 168, _) => "private",
        (172, b, _) if (16..32).contains(&b) => "private",
        (100, b, _) if (64..128).contains(&b) => "shared (CGNAT)",
        (192, 0, 0) => "IETF protocol",
        (198, 18 | 19, _) => "benchmarking",
        (224..=239, _, _) => "multicast",
        (240..=255, _, _) => "reserved or broadcast",
        _ => return None,
    })
}

fn internal_v6(a: Ipv6Addr) -> Option<&'static str> {
    let s = a.segments();
    let embedded = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    if a.is_loopback() {
        return Some("loopback");
    }
    if a.is_unspecified() {
        return Some("unspecified");
    }
    // IPv4-mapped (::ffff:a.b.c.d) and IPv4-compatible (::a.b.c.d): the IPv4 address's rule.
    if s[..5] == [0; 5] && (s[5] == 0xffff || s[5] == 0) {
        return internal_v4(embedded(s[6], s[7])).or(if s[5] == 0 { Some("IPv4-compatible") } else { None });
    }
    // NAT64 (64:ff9b::/96 and the local-use 64:ff9b:1::/48) carry an IPv4 address at the end.
    if s[0] == 0x64 && s[1] == 0xff9b {
        return internal_v4(embedded(s[6], s[7])).or((s[2] == 1).then_some("NAT64 local-use"));
    }
    // 6to4 (2002::/16) carries one in its next 32 bits.
    if s[0] == 0x2002 {
        return internal_v4(embedded(s[1], s[2]));
    }
    Some(match s[0] {
        // Teredo tunnels to an address hidden in the suffix: refused whole.
        0x2001 if s[1] == 0 => "Teredo",
        x if x & 0xfe00 == 0xfc00 => "unique-local",
        x if x & 0xffc0 == 0xfe80 => "link-local",
        x if x & 0xffc0 == 0xfec0 => "site-local",
        x if x & 0xff00 == 0xff00 => "multicast",
        _ => return None,
    })
}

/// The address a host written as a URL's host names, in any spelling the WHATWG URL parser
/// takes (`127.1`, `2130706433`, `0x7f.0.0.1`, `0177.0.0.1`, `[::ffff:127.0.0.1]`); none for
/// a name.
pub fn literal(host: &str) -> Option<IpAddr> {
    let h = host.trim().trim_end_matches('.');
    if let Some(v6) = h.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        return v6.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    if let Ok(a) = h.parse::<IpAddr>() {
        return Some(a);
    }
    let parts: Vec<&str> = h.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let numbers: Vec<u64> = parts.iter().map(|p| number(p)).collect::<Option<_>>()?;
    let (last, head) = numbers.split_last()?;
    if head.iter().any(|n| *n > 255) || *last >= 1u64 << (8 * (5 - numbers.len())) {
        return None;
    }
    let mut value = *last;
    for (i, n) in head.iter().enumerate() {
        value |= n << (8 * (3 - i));
    }
    u32::try_from(value).ok().map(|v| IpAddr::V4(Ipv4Addr::from(v)))
}

/// One part of an IPv4 address as URL parsers read it: decimal, `0x` hexadecimal, `0` octal.
fn number(p: &str) -> Option<u64> {
    if p.is_empty() {
        return None;
    }
    let (digits, radix) = if let Some(h) = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X")) {
        (h, 16)
    } else if p.len() > 1 && p.starts_with('0') {
        (&p[1..], 8)
    } else {
        (p, 10)
    };
    if digits.is_empty() {
        return (radix == 16).then_some(0);
    }
    u64::from_str_radix(digits, radix).ok().filter(|n| *n <= u64::from(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str, port: u16) -> SocketAddr {
        SocketAddr::new(s.parse().unwrap(), port)
    }

    #[test]
    fn every_internal_form_is_named_and_public_ones_pass() {
        let cases = [
            ("127.0.0.1", Some("loopback")),
            ("127.255.1.2", Some("loopback")),
            ("0.0.0.0", Some("unspecified")),
            ("169.254.169.254", Some("link-local")),
            ("10.1.2.3", Some("private")),
            ("172.16.0.1", Some("private")),
            ("172.31.255.255", Some("private")),
            ("172.32.0.1", None),
            ("192.168.1.1", Some("private")),
            ("100.64.0.1", Some("shared (CGNAT)")),
            ("100.128.0.1", None),
            ("224.0.0.1", Some("multicast")),
            ("255.255.255.255", Some("reserved or broadcast")),
            ("140.82.112.3", None),
            ("::1", Some("loopback")),
            ("::", Some("unspecified")),
            ("::ffff:127.0.0.1", Some("loopback")),
            ("::ffff:169.254.169.254", Some("link-local")),
            ("::ffff:140.82.112.3", None),
            ("::127.0.0.1", Some("loopback")),
            ("::8c52:7003", Some("IPv4-compatible")),
            ("64:ff9b::a9fe:a9fe", Some("link-local")),
            ("64:ff9b::8c52:7003", None),
            ("2002:7f00:1::", Some("loopback")),
            ("2002:8c52:7003::1", None),
            ("2001:0:4136:e378::1", Some("Teredo")),
            ("fd00:ec2::254", Some("unique-local")),
            ("fc00::1", Some("unique-local")),
            ("fe80::1", Some("link-local")),
            ("fec0::1", Some("site-local")),
            ("ff02::1", Some("multicast")),
            ("2606:4700::1111", None),
        ];
        for (a, want) in cases {
            assert_eq!(internal(a.parse().unwrap()), want, "{a}");
        }
    }

    #[test]
    fn literal_hosts_are_read_in_every_url_spelling() {
        let cases = [
            ("127.0.0.1", Some("127.0.0.1")),
            ("127.1", Some("127.0.0.1")),
            ("127.0.1", Some("127.0.0.1")),
            ("2130706433", Some("127.0.0.1")),
            ("0x7f000001", Some("127.0.0.1")),
            ("0x7f.0.0.1", Some("127.0.0.1")),
            ("0177.0.0.1", Some("127.0.0.1")),
            ("0xa9.0xfe.0xa9.0xfe", Some("169.254.169.254")),
            ("127.0.0.1.", Some("127.0.0.1")),
            ("[::ffff:127.0.0.1]", Some("::ffff:127.0.0.1")),
            ("[::1]", Some("::1")),
            ("256.0.0.1", None),
            ("4294967296", None),
            ("example.com", None),
            ("1.2.3.4.5", None),
            ("127.0.0.1a", None),
        ];
        for (host, want) in cases {
            assert_eq!(literal(host), want.map(|w| w.parse().unwrap()), "{host}");
        }
    }

    #[test]
    fn a_guarded_policy_refuses_internal_addresses_unless_opened() {
        let open = Egress::default();
        assert_eq!(open.permits("localhost", addr("127.0.0.1", 80)), Ok(()));
        let none = Egress::guarded::<&str>(&[]).unwrap();
        let refused = none.permits("docs.example", addr("10.0.0.7", 443)).unwrap_err();
        assert_eq!(refused.rule, "private");
        assert_eq!(
            refused.to_string(),
            "the server's egress policy refuses docs.example:443 (10.0.0.7): 10.0.0.7 is a private address (an operator opens internal hosts with [server] egress_allow)"
        );
        assert!(none.permits("example.com", addr("140.82.112.3", 443)).is_ok());
        for spelling in ["127.1", "2130706433", "[::ffff:127.0.0.1]", "0x7f.1", "127.0.0.1"] {
            let e = none.check_literal(spelling, 80).unwrap_err();
            assert_eq!(e.rule, "loopback", "{spelling}");
        }
        assert!(none.check_literal("docs.example", 80).is_ok());

        let some = Egress::guarded(&["docs.intranet:443", "10.1.2.0/24", "[fd00::1]:8080", "127.0.0.1:9000"]).unwrap();
        assert!(some.permits("docs.intranet", addr("10.9.9.9", 443)).is_ok());
        assert!(some.permits("DOCS.INTRANET.", addr("10.9.9.9", 443)).is_ok());
        assert!(some.permits("docs.intranet", addr("10.9.9.9", 80)).is_err());
        assert!(some.permits("other.intranet", addr("10.1.2.200", 22)).is_ok());
        assert!(some.permits("other.intranet", addr("10.1.3.1", 22)).is_err());
        assert!(some.permits("x", addr("::ffff:10.1.2.5", 80)).is_ok());
        assert!(some.permits("x", addr("fd00::1", 8080)).is_ok());
        assert!(some.permits("x", addr("fd00::1", 8081)).is_err());
        assert!(some.permits("127.0.0.1", addr("127.0.0.1", 9000)).is_ok());
        assert!(some.permits("127.0.0.1", addr("127.0.0.1", 9001)).is_err());
        assert!(some.permits("169.254.169.254", addr("169.254.169.254", 80)).is_err());

        for bad in ["", "http://x", "10.0.0.0/33", "x:0", "[::1", "a b", "fd00::/200"] {
            assert!(Egress::guarded(&[bad]).is_err(), "{bad:?} parsed");
        }
        assert_eq!(Opening::parse("10.1.2.0/24").unwrap().to_string(), "10.1.2.0/24");
        assert_eq!(Opening::parse("fd00::/8").unwrap().to_string(), "fd00::/8");
    }
}
