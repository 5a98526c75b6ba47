//! The server map: which tier and server name an `address:port` belongs to.
//!
//! A small text file, one server per line, `#` starts a comment:
//!
//! ```text
//! # address:port   tier   server   [protocol: http | postgres | mysql]
//! 10.0.0.2:80      web    web1
//! 10.0.0.3:8080    app    app1     http
//! [fd00::4]:5432   db     db1      postgres
//! *:3306           db     mariadb  mysql
//! ```
//!
//! `*` matches any address. Without an entry, a server is named by its `address:port` and its
//! tier is guessed from the protocol (`web` for HTTP, `db` for PostgreSQL and MySQL).

use std::collections::HashMap;
use std::net::IpAddr;

use super::net::Ip;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Http,
    Pg,
    My,
}

impl Proto {
    pub fn name(self) -> &'static str {
        match self {
            Proto::Http => "http",
            Proto::Pg => "postgres",
            Proto::My => "mysql",
        }
    }
    pub fn default_tier(self) -> &'static str {
        match self {
            Proto::Http => "web",
            Proto::Pg | Proto::My => "db",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Entry {
    pub tier: String,
    pub server: String,
    pub protocol: Option<Proto>,
}

#[derive(Debug, Default)]
pub struct ServerMap {
    exact: HashMap<(Ip, u16), Entry>,
    any: HashMap<u16, Entry>,
}

pub fn ip_from(addr: IpAddr) -> Ip {
    match addr {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

impl ServerMap {
    pub fn get(&self, ip: &Ip, port: u16) -> Option<&Entry> {
        if self.exact.is_empty() && self.any.is_empty() {
            return None;
        }
        self.exact.get(&(*ip, port)).or_else(|| self.any.get(&port))
    }

    /// Parse the map's text; errors name the file, line and what was expected.
    pub fn parse(text: &str, file: &str) -> Result<Self, ServerMapError> {
        let mut m = ServerMap::default();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let at = format!("{file}:{}", i + 1);
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 3 || f.len() > 4 {
                return Err(ServerMapError::Fields { at, got: f.len(), line: line.to_string() });
            }
            let field = f[0].to_string();
            let Some((addr, port)) = f[0].rsplit_once(':') else {
                return Err(ServerMapError::NoPort { at, field });
            };
            let Ok(port) = port.parse::<u16>() else {
                return Err(ServerMapError::Port { at, field });
            };
            let protocol = match f.get(3).map(|s| s.to_ascii_lowercase()) {
                None => None,
                Some(p) => Some(match p.as_str() {
                    "http" => Proto::Http,
                    "postgres" | "postgresql" | "pgsql" => Proto::Pg,
                    "mysql" | "mariadb" => Proto::My,
                    _ => return Err(ServerMapError::Protocol { at, got: p }),
                }),
            };
            let e = Entry { tier: f[1].to_string(), server: f[2].to_string(), protocol };
            if addr == "*" {
                m.any.insert(port, e);
            } else {
                let a = addr.trim_start_matches('[').trim_end_matches(']');
                let Ok(ip) = a.parse::<IpAddr>() else {
                    return Err(ServerMapError::Address { at, field, address: a.to_string() });
                };
                m.exact.insert((ip_from(ip), port), e);
            }
        }
        Ok(m)
    }
}

/// What a server map's line can get wrong; each case names the file and line (`at`: `map.txt:3`).
#[derive(Debug, thiserror::Error)]
pub enum ServerMapError {
    /// Fewer than 3 or more than 4 fields.
    #[error("{at}: expected `address:port tier server [protocol]`, got {got} fields: {line:?}")]
    Fields { at: String, got: usize, line: String },
    /// Field 1 without a `:port`.
    #[error("{at}: field 1 {field:?}: expected address:port")]
    NoPort { at: String, field: String },
    /// A port that is not 0-65535.
    #[error("{at}: field 1 {field:?}: port must be 1-65535")]
    Port { at: String, field: String },
    /// An address that is neither an IP address nor `*`.
    #[error("{at}: field 1 {field:?}: {address:?} is not an IP address (or *)")]
    Address { at: String, field: String, address: String },
    /// A protocol the tracer does not decode.
    #[error("{at}: field 4 {got:?}: expected http, postgres or mysql")]
    Protocol { at: String, got: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_entries_and_wildcards() {
        let m = ServerMap::parse("# c\n10.0.0.2:80 web web1\n[::1]:5432 db pg1 postgres\n*:3306 db my mysql\n", "m").unwrap();
        let v4 = ip_from("10.0.0.2".parse().unwrap());
        assert_eq!(m.get(&v4, 80).unwrap().server, "web1");
        assert_eq!(m.get(&ip_from("::1".parse().unwrap()), 5432).unwrap().protocol, Some(Proto::Pg));
        assert_eq!(m.get(&v4, 3306).unwrap().server, "my");
        assert!(m.get(&v4, 81).is_none());
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let e = ServerMap::parse("10.0.0.2:80 web web1\nbogus web\n", "map.txt").unwrap_err().to_string();
        assert!(e.starts_with("map.txt:2:"), "{e}");
        let e = ServerMap::parse("10.0.0.2:99999 web w\n", "map.txt").unwrap_err().to_string();
        assert!(e.contains("port"), "{e}");
        let e = ServerMap::parse("1.2.3.4:80 web w ftp\n", "map.txt").unwrap_err().to_string();
        assert!(e.contains("field 4"), "{e}");
    }

    #[test]
    fn each_mistake_is_its_own_case() {
        let case = |text: &str| ServerMap::parse(text, "m").unwrap_err();
        assert!(matches!(case("a b c d e\n"), ServerMapError::Fields { got: 5, .. }));
        assert!(matches!(case("10.0.0.2 web w\n"), ServerMapError::NoPort { .. }));
        assert!(matches!(case("10.0.0.2:http web w\n"), ServerMapError::Port { .. }));
        assert!(
            matches!(case("# ok\nhost.lan:80 web w\n"), ServerMapError::Address { ref at, ref address, .. } if at == "m:2" && address == "host.lan")
        );
        assert!(matches!(case("*:21 ftp f ftp\n"), ServerMapError::Protocol { ref got, .. } if got == "ftp"));
    }
}
