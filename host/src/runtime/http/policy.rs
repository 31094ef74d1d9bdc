//! Which destinations an agent may reach: the policy granted to a run, and the
//! `HOST[:PORT]` destinations it names.

use std::fmt;
use std::str::FromStr;

/// What outbound HTTP an agent is granted. The default grants nothing: an agent
/// reaches no network unless the operator names each destination.
///
/// ```
/// use idem::runtime::{HttpDestination, HttpPolicy};
///
/// let policy = HttpPolicy {
///     allow: vec!["api.example.com".parse()?, "127.0.0.1:8080".parse()?],
///     outside_claims: false,
/// };
/// assert!(policy.allows("API.example.com", 443));
/// assert!(policy.allows("127.0.0.1", 8080));
/// assert!(!policy.allows("127.0.0.1", 8081));
/// assert!(!HttpPolicy::default().allows("127.0.0.1", 8080));
/// # Ok::<(), idem::runtime::HttpDestinationError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpPolicy {
    /// The destinations requests may go to.
    pub allow: Vec<HttpDestination>,
    /// Whether requests made while the instance holds no claim are let through. Off by
    /// default: side effects belong inside
    /// `run-once`, where they carry an idempotency key.
    pub outside_claims: bool,
}

impl HttpPolicy {
    /// Whether a request to `host:port` is granted. Host names compare without regard
    /// to case; an IPv6 literal may come with or without its brackets.
    pub fn allows(&self, host: &str, port: u16) -> bool {
        let host = normalize_host(host);
        self.allow.iter().any(|d| d.matches(&host, port))
    }
}

/// One granted destination: a host, and a port or every port.
///
/// Parsed from `HOST[:PORT]`; an IPv6 address is written in brackets (`[::1]:8080`).
/// Without a port, every port of the host is granted.
///
/// ```
/// use idem::runtime::HttpDestination;
///
/// let d: HttpDestination = "Example.COM:8443".parse()?;
/// assert_eq!((d.host.as_str(), d.port), ("example.com", Some(8443)));
/// let v6: HttpDestination = "[::1]".parse()?;
/// assert_eq!((v6.host.as_str(), v6.port), ("::1", None));
/// assert_eq!(v6.to_string(), "[::1]");
/// assert!("http://example.com".parse::<HttpDestination>().is_err());
/// # Ok::<(), idem::runtime::HttpDestinationError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpDestination {
    /// The host name or IP address, lower-cased, IPv6 without brackets.
    pub host: String,
    /// The port, or `None` for every port.
    pub port: Option<u16>,
}

impl serde::Serialize for HttpDestination {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for HttpDestination {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl HttpDestination {
    fn matches(&self, host: &str, port: u16) -> bool {
        self.host == host && self.port.is_none_or(|p| p == port)
    }
}

impl fmt::Display for HttpDestination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]", self.host)?;
        } else {
            f.write_str(&self.host)?;
        }
        match self.port {
            Some(port) => write!(f, ":{port}"),
            None => Ok(()),
        }
    }
}

/// Why a `HOST[:PORT]` destination could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HttpDestinationError {
    /// Nothing was given.
    #[error("expected HOST[:PORT], got an empty string")]
    Empty,
    /// The host part is not a host name or IP address.
    #[error(
        "expected HOST[:PORT] (a host name or IP address, IPv6 in brackets, \
         no scheme or path), got {input:?}: {reason}"
    )]
    BadHost {
        /// What was given.
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The port is not a number from 1 to 65535.
    #[error("expected HOST[:PORT] with a port from 1 to 65535, got {input:?}")]
    BadPort {
        /// What was given.
        input: String,
    },
}

impl FromStr for HttpDestination {
    type Err = HttpDestinationError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        if input.is_empty() {
            return Err(HttpDestinationError::Empty);
        }
        let bad_host = |reason| HttpDestinationError::BadHost {
            input: input.to_string(),
            reason,
        };
        if input.contains('/') {
            return Err(bad_host("a destination has no scheme and no path"));
        }
        let (host, port) = if let Some(rest) = input.strip_prefix('[') {
            let (host, after) = rest
                .split_once(']')
                .ok_or_else(|| bad_host("an IPv6 address misses its closing bracket"))?;
            if host.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(bad_host("the bracketed part is not an IPv6 address"));
            }
            match after {
                "" => (host, None),
                _ => match after.strip_prefix(':') {
                    Some(port) => (host, Some(port)),
                    None => return Err(bad_host("only :PORT may follow the brackets")),
                },
            }
        } else {
            match input.split_once(':') {
                Some((host, port)) if !port.contains(':') => (host, Some(port)),
                Some(_) => return Err(bad_host("an IPv6 address must be in brackets")),
                None => (input, None),
            }
        };
        if host.is_empty() {
            return Err(bad_host("the host is empty"));
        }
        let name_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_';
        if !input.starts_with('[') && !host.chars().all(name_char) {
            return Err(bad_host(
                "a host name holds only letters, digits, '-', '.' and '_'",
            ));
        }
        let port = match port {
            None => None,
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => Some(n),
                _ => {
                    return Err(HttpDestinationError::BadPort {
                        input: input.to_string(),
                    });
                }
            },
        };
        Ok(HttpDestination {
            host: host.to_ascii_lowercase(),
            port,
        })
    }
}

pub(super) fn normalize_host(host: &str) -> String {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
        .to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_destinations() {
        let d = |s: &str| s.parse::<HttpDestination>();
        assert_eq!(
            d("localhost").unwrap(),
            HttpDestination {
                host: "localhost".into(),
                port: None
            }
        );
        assert_eq!(d("10.0.0.1:80").unwrap().port, Some(80));
        assert_eq!(d("[::1]:8080").unwrap().host, "::1");
        assert_eq!(d("[::1]:8080").unwrap().to_string(), "[::1]:8080");
        assert_eq!(d(""), Err(HttpDestinationError::Empty));
        for bad in [
            "host:0",
            "host:65536",
            "host:",
            "host:+1",
            "host:x",
            "[::1]:99999",
        ] {
            assert!(
                matches!(d(bad), Err(HttpDestinationError::BadPort { .. })),
                "{bad}"
            );
        }
        for bad in [
            ":80",
            "http://host",
            "host/path",
            "::1",
            "[::1",
            "[nothost]",
            "[::1]x",
            "a b",
            "user@host",
        ] {
            assert!(
                matches!(d(bad), Err(HttpDestinationError::BadHost { .. })),
                "{bad}"
            );
        }
        let err = d("http://x").unwrap_err().to_string();
        assert!(
            err.contains("HOST[:PORT]") && err.contains("http://x"),
            "{err}"
        );
    }
}
