//! Parsers for argument values shared by the subcommands.

use std::path::PathBuf;
use std::time::Duration;

use idem::runtime::DirGrant;
use idem::store::SyncMode;

/// Parses `HOST::GUEST`.
pub fn dir_grant(s: &str) -> Result<DirGrant, String> {
    let (host, guest) = s
        .split_once("::")
        .ok_or_else(|| format!("expected HOST::GUEST, got {s:?}"))?;
    if host.is_empty() || guest.is_empty() {
        return Err(format!("expected HOST::GUEST with both parts, got {s:?}"));
    }
    Ok(DirGrant {
        host: PathBuf::from(host),
        guest: guest.to_string(),
    })
}

/// Parses `K=V`.
pub fn env_var(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("expected K=V, got {s:?}"))?;
    if k.is_empty() {
        return Err(format!("expected K=V with a name, got {s:?}"));
    }
    Ok((k.to_string(), v.to_string()))
}

/// Parses a duration: a number followed by `ms`, `s` or `m`.
pub fn duration(s: &str) -> Result<Duration, String> {
    let err = || format!("expected a duration such as 500ms, 30s or 2m, got {s:?}");
    let split = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(err)?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| err())?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n.saturating_mul(60))),
        _ => Err(err()),
    }
}

/// Parses a size: a number of bytes, optionally followed by `KiB`, `MiB` or `GiB`.
pub fn size(s: &str) -> Result<usize, String> {
    let err = || format!("expected a size such as 4096, 512KiB, 1MiB or 2GiB, got {s:?}");
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: usize = n.parse().map_err(|_| err())?;
    let shift = match unit {
        "" | "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        _ => return Err(err()),
    };
    n.checked_mul(1 << shift).ok_or_else(err)
}

/// Parses `normal` or `full`.
pub fn sync_mode(s: &str) -> Result<SyncMode, String> {
    s.parse()
        .map_err(|_| format!("expected normal or full, got {s:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_values() {
        assert_eq!(
            dir_grant("/tmp/x::/data").unwrap(),
            DirGrant {
                host: "/tmp/x".into(),
                guest: "/data".into()
            }
        );
        assert!(dir_grant("/tmp/x").is_err());
        assert!(dir_grant("::/data").is_err());
        assert_eq!(env_var("A=b=c").unwrap(), ("A".into(), "b=c".into()));
        assert!(env_var("=x").is_err());
        assert_eq!(duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(duration("3s").unwrap(), Duration::from_secs(3));
        assert_eq!(duration("2m").unwrap(), Duration::from_secs(120));
        assert!(duration("3").is_err());
        assert!(duration("3h").is_err());
        assert_eq!(size("4096").unwrap(), 4096);
        assert_eq!(size("512KiB").unwrap(), 512 << 10);
        assert_eq!(size("1MiB").unwrap(), 1 << 20);
        assert_eq!(size("2GiB").unwrap(), 2 << 30);
        assert!(size("1MB").is_err());
        assert!(size("MiB").is_err());
    }
}
