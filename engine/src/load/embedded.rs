//! Embedded objects (TPC-W's images): which URLs a page embeds, resolved against the page and
//! kept only when they live on the target (same host and port). The fetching itself (a small
//! kept-alive pool per user) is in the driver.

use std::collections::HashSet;

use regex::bytes::Regex;

/// The distinct embedded URLs of `body` (capture group 1 of `pattern`), as request paths on the
/// target, in order of first appearance, at most `max`. `page_path` is the page's own request
/// path (relative URLs resolve against it); `host` is the target's `host:port`.
pub fn embedded_urls(body: &[u8], pattern: &Regex, page_path: &str, host: &str, max: usize) -> Vec<String> {
    let mut seen: HashSet<String> = HashSet::new();
    let mut out = Vec::new();
    if max == 0 {
        return out;
    }
    for c in pattern.captures_iter(body) {
        let Some(m) = c.get(1) else { continue };
        let raw = String::from_utf8_lossy(m.as_bytes());
        let Some(path) = resolve(&raw, page_path, host) else { continue };
        if seen.insert(path.clone()) {
            out.push(path);
            if out.len() >= max {
                break;
            }
        }
    }
    out
}

/// One `src` value as a request path on the target, or None (another host, another scheme,
/// `data:`, empty).
pub fn resolve(raw: &str, page_path: &str, host: &str) -> Option<String> {
    let s = raw.trim().replace("&amp;", "&");
    let s = s.split('#').next().unwrap_or("");
    if s.is_empty() {
        return None;
    }
    let lower = s.to_ascii_lowercase();
    let path: String = if let Some(rest) = lower.strip_prefix("http://").map(|_| &s[7..]).or_else(|| lower.strip_prefix("//").map(|_| &s[2..])) {
        // absolute URL: only on the target itself
        let (hp, p) = match rest.find(['/', '?']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if !same_host(hp, host) {
            return None;
        }
        if p.starts_with('?') {
            format!("/{p}")
        } else {
            p.to_string()
        }
    } else if s.starts_with('/') {
        s.to_string()
    } else {
        // a scheme (https:, data:, javascript:) before any '/' or '?': not fetched
        let first_sep = s.find(['/', '?']).unwrap_or(s.len());
        if s[..first_sep].contains(':') {
            return None;
        }
        // relative: against the directory of the page's path (without its query)
        let base = page_path.split('?').next().unwrap_or("/");
        let dir = match base.rfind('/') {
            Some(i) => &base[..=i],
            None => "/",
        };
        format!("{dir}{s}")
    };
    Some(clean(&path))
}

fn same_host(hp: &str, host: &str) -> bool {
    let hp = hp.rsplit_once('@').map_or(hp, |(_, h)| h); // user@host
    hp.eq_ignore_ascii_case(host)
        || format!("{hp}:80").eq_ignore_ascii_case(host)
        || hp.strip_suffix(":80").is_some_and(|h| h.eq_ignore_ascii_case(host))
}

/// Remove dot segments from the path part and percent-encode what cannot go on a request line.
fn clean(path: &str) -> String {
    let (p, q) = match path.find('?') {
        Some(i) => (&path[..i], Some(&path[i..])),
        None => (path, None),
    };
    let mut segs: Vec<&str> = Vec::new();
    let trailing = p.ends_with('/') || p.ends_with("/.") || p.ends_with("/..");
    for seg in p.split('/').skip(1) {
        match seg {
            "." | "" => {}
            ".." => {
                segs.pop();
            }
            s => segs.push(s),
        }
    }
    let mut out = String::with_capacity(path.len() + 1);
    for s in &segs {
        out.push('/');
        out.push_str(s);
    }
    if out.is_empty() || (trailing && !segs.is_empty()) {
        out.push('/');
    }
    if let Some(q) = q {
        out.push_str(q);
    }
    let mut enc = String::with_capacity(out.len());
    for ch in out.chars() {
        match ch {
            ' ' => enc.push_str("%20"),
            c if c.is_ascii_control() => {}
            c if !c.is_ascii() => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    enc.push_str(&format!("%{b:02X}"));
                }
            }
            c => enc.push(c),
        }
    }
    enc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::workload::DEFAULT_EMBEDDED_PATTERN;

    fn re() -> Regex {
        Regex::new(DEFAULT_EMBEDDED_PATTERN).unwrap()
    }

    #[test]
    fn default_pattern_finds_img_and_input_image_tags() {
        let body = br#"<html><IMG SRC="/tpcw/img/logo.gif" ALT="x"> <img class="t" src='/tpcw/img/thumb_1.gif'>
            <input type="image" src="/tpcw/img/search_B.gif"> <input type="hidden" name="I_ID" value="7">
            <a href="/tpcw/ProductDetail?I_ID=3">x</a> <img alt="no src"> <script src="/x.js"></script>"#;
        let urls = embedded_urls(body, &re(), "/tpcw/Home", "127.0.0.1:8080", 64);
        assert_eq!(urls, vec!["/tpcw/img/logo.gif", "/tpcw/img/thumb_1.gif", "/tpcw/img/search_B.gif"]);
    }

    #[test]
    fn distinct_in_order_and_capped() {
        let mut body = String::new();
        for i in 0..100 {
            body.push_str(&format!("<img src=\"/img/{}.gif\"><img src=\"/img/{}.gif\">", i, i % 3));
        }
        let urls = embedded_urls(body.as_bytes(), &re(), "/", "h:1", 64);
        assert_eq!(urls.len(), 64);
        assert_eq!(&urls[..4], &["/img/0.gif", "/img/1.gif", "/img/2.gif", "/img/3.gif"]);
        let set: HashSet<&String> = urls.iter().collect();
        assert_eq!(set.len(), 64);
        assert_eq!(embedded_urls(body.as_bytes(), &re(), "/", "h:1", 5).len(), 5);
        // the same image twice is fetched once
        let urls = embedded_urls(b"<img src=\"/a.gif\"><img src=\"/a.gif#x\"><img src=\"/a.gif\">", &re(), "/", "h:1", 64);
        assert_eq!(urls, vec!["/a.gif"]);
    }

    #[test]
    fn resolution_against_the_page_and_the_target() {
        let host = "127.0.0.1:8080";
        let page = "/tpcw/shop/Home?C_ID=1";
        assert_eq!(resolve("/tpcw/img/a.gif", page, host).as_deref(), Some("/tpcw/img/a.gif"));
        assert_eq!(resolve("img/a.gif", page, host).as_deref(), Some("/tpcw/shop/img/a.gif"));
        assert_eq!(resolve("../img/a.gif", page, host).as_deref(), Some("/tpcw/img/a.gif"));
        assert_eq!(resolve("./a.gif?v=1&amp;w=2", page, host).as_deref(), Some("/tpcw/shop/a.gif?v=1&w=2"));
        assert_eq!(resolve("http://127.0.0.1:8080/x/a.gif", page, host).as_deref(), Some("/x/a.gif"));
        assert_eq!(resolve("HTTP://127.0.0.1:8080/x/a.gif", page, host).as_deref(), Some("/x/a.gif"));
        assert_eq!(resolve("//127.0.0.1:8080/y.gif", page, host).as_deref(), Some("/y.gif"));
        assert_eq!(resolve("http://example.com/a.gif", page, host), None);
        assert_eq!(resolve("https://127.0.0.1:8080/a.gif", page, host), None);
        assert_eq!(resolve("data:image/gif;base64,R0lGOD", page, host), None);
        assert_eq!(resolve("  ", page, host), None);
        assert_eq!(resolve("/a b.gif", page, host).as_deref(), Some("/a%20b.gif"));
        assert_eq!(resolve("http://shop/a.gif", "/", "shop:80").as_deref(), Some("/a.gif"));
        assert_eq!(resolve("http://shop:80/a.gif", "/", "shop").as_deref(), Some("/a.gif"));
    }
}
