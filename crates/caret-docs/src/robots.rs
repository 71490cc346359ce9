//! `robots.txt`: which paths a crawler named `caret` may fetch, how long it waits between
//! requests, and the sitemaps the site names. Line-based, as the format is (RFC 9309): the
//! group for `caret` if there is one, else the group for `*`; the longest matching rule wins,
//! `Allow` on a tie; `*` matches any run and `$` anchors the end.

/// A site's rules for Caret.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Robots {
    /// (allow, pattern) in file order.
    rules: Vec<(bool, String)>,
    /// Seconds between requests the site asks for.
    pub crawl_delay: Option<f64>,
    /// Sitemaps it names.
    pub sitemaps: Vec<String>,
}

impl Robots {
    /// Reads a `robots.txt` for the user agent `agent` (lowercase product token).
    pub fn parse(text: &str, agent: &str) -> Robots {
        // Groups: (agents, rules, delay); consecutive user-agent lines share a group.
        type Group = (Vec<String>, Vec<(bool, String)>, Option<f64>);
        let mut groups: Vec<Group> = Vec::new();
        let mut sitemaps = Vec::new();
        let mut open = false;
        for raw in text.lines() {
            let line = raw.split('#').next().unwrap_or("").trim();
            let Some((key, value)) = line.split_once(':') else { continue };
            let (key, value) = (key.trim().to_ascii_lowercase(), value.trim());
            match key.as_str() {
                "user-agent" => {
                    if !open {
                        groups.push((Vec::new(), Vec::new(), None));
                        open = true;
                    }
                    if let Some(g) = groups.last_mut() {
                        g.0.push(value.to_ascii_lowercase());
                    }
                }
                "allow" | "disallow" => {
                    open = false;
                    if let Some(g) = groups.last_mut()
                        && !value.is_empty()
                    {
                        g.1.push((key == "allow", value.to_owned()));
                    }
                }
                "crawl-delay" => {
                    open = false;
                    if let Some(g) = groups.last_mut() {
                        g.2 = value.parse().ok().filter(|d: &f64| d.is_finite() && *d >= 0.0);
                    }
                }
                "sitemap" => sitemaps.push(value.to_owned()),
                _ => {}
            }
        }
        let mine = |name: &str| groups.iter().filter(|g| g.0.iter().any(|a| a == name)).collect::<Vec<_>>();
        let chosen = match mine(agent) {
            v if !v.is_empty() => v,
            _ => mine("*"),
        };
        Robots {
            rules: chosen.iter().flat_map(|g| g.1.iter().cloned()).collect(),
            crawl_delay: chosen.iter().find_map(|g| g.2),
            sitemaps,
        }
    }

    /// Whether `path` (with its query) may be fetched.
    pub fn allows(&self, path: &str) -> bool {
        let mut best: Option<(usize, bool)> = None;
        for (allow, pattern) in &self.rules {
            if matches(pattern, path) {
                let len = pattern.len();
                if best.is_none_or(|(l, a)| len > l || (len == l && *allow && !a)) {
                    best = Some((len, *allow));
                }
            }
        }
        best.is_none_or(|(_, allow)| allow)
    }
}

/// Whether `pattern` matches the start of `path` (`*`: any run, a final `$`: the end).
fn matches(pattern: &str, path: &str) -> bool {
    let (pattern, anchored) = match pattern.strip_suffix('$') {
        Some(p) => (p, true),
        None => (pattern, false),
    };
    let parts: Vec<&str> = pattern.split('*').collect();
    let mut at = 0;
    for (i, part) in parts.iter().enumerate() {
        if i == 0 {
            if !path.starts_with(part) {
                return false;
            }
            at = part.len();
            continue;
        }
        let last = i == parts.len() - 1;
        if last && anchored {
            return path.len() >= at + part.len() && path.ends_with(part);
        }
        match path[at..].find(part) {
            Some(k) => at += k + part.len(),
            None => return false,
        }
    }
    !anchored || at == path.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_groups_rules_and_sitemaps_of_a_robots_file() {
        let text = "# comment\nUser-agent: *\nDisallow: /private/\nAllow: /private/open.html\nDisallow: /*.pdf$\n\
                    Crawl-delay: 2\n\nUser-agent: other\nDisallow: /\n\nSitemap: https://d.example/sitemap.xml\n";
        let r = Robots::parse(text, "caret");
        assert_eq!(r.crawl_delay, Some(2.0));
        assert_eq!(r.sitemaps, vec!["https://d.example/sitemap.xml".to_owned()]);
        for (path, ok) in [
            ("/guide/index.html", true),
            ("/private/secret.html", false),
            ("/private/open.html", true),
            ("/files/a.pdf", false),
            ("/files/a.pdf.html", true),
        ] {
            assert_eq!(r.allows(path), ok, "{path}");
        }
        // A group naming Caret replaces `*`.
        let own = Robots::parse("User-agent: *\nDisallow: /\n\nUser-agent: Caret\nAllow: /\nDisallow: /tmp\n", "caret");
        assert!(own.allows("/docs") && !own.allows("/tmp/x"));
        assert!(Robots::parse("", "caret").allows("/anything"));
        assert!(!Robots::parse("User-agent: *\nDisallow: /\n", "caret").allows("/x"));
    }
}
