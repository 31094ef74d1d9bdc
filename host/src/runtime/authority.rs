//! What a run may reach — directories, environment, HTTP destinations, limits, and how
//! durable its writes are. It is the operator's decision, recorded with a deployment
//! (the most its runs may have) and with each run (what it has, never more), so a run
//! keeps the same authority whichever worker drives it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::http::HttpPolicy;
use super::limits::Limits;
use crate::store::SyncMode;

/// A host directory the agent may use, and the path it sees it under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirGrant {
    /// The directory on the host.
    pub host: PathBuf,
    /// The path the guest opens it by.
    pub guest: String,
}

/// Everything a run may reach. The default reaches nothing: no files, no environment,
/// no network, default limits, `normal` durability.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Authority {
    /// Directories granted (read-write).
    pub dirs: Vec<DirGrant>,
    /// Environment variables granted.
    pub env: Vec<(String, String)>,
    /// Outbound HTTP granted.
    pub http: HttpPolicy,
    /// The run's limits.
    pub limits: Limits,
    /// How durable the run's writes are.
    pub sync: SyncMode,
}

/// Why an authority cannot be used, or does not fit within another.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthorityError {
    /// The stored form could not be read.
    #[error("the run's authority cannot be read: {0}")]
    Decode(String),
    /// A limit is outside what idem enforces.
    #[error(transparent)]
    Limit(#[from] super::limits::InvalidLimit),
    /// Two directories are granted under one guest path (compared as the guest's path
    /// lookup does: `/data`, `data/` and `./data` are one path). The agent would see
    /// only one of them, so it is refused rather than left to whichever wins.
    #[error(
        "directories {} and {} are both granted as guest path {guest:?}; the agent would \
         see only one of them: give each its own guest path",
        first.display(),
        second.display()
    )]
    SameGuestPath {
        /// The guest path, as the second grant wrote it.
        guest: String,
        /// The host directory granted first.
        first: PathBuf,
        /// The host directory granted again under it.
        second: PathBuf,
    },
    /// A submission asked for more than its deployment allows.
    #[error("the run asks for {what}, which its deployment does not allow")]
    Wider {
        /// What was asked for, in words.
        what: String,
    },
}

impl Authority {
    /// The stored form.
    pub fn encode(&self) -> Vec<u8> {
        // A struct of strings, numbers and paths always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads the stored form. Nothing stored (a run from before authorities were
    /// recorded) reads as the default: nothing granted.
    pub fn decode(bytes: &[u8]) -> Result<Authority, AuthorityError> {
        if bytes.is_empty() {
            return Ok(Authority::default());
        }
        serde_json::from_slice(bytes).map_err(|e| AuthorityError::Decode(e.to_string()))
    }

    /// Checks that every limit is one idem can enforce, and that no two directories are
    /// granted under one guest path ([`AuthorityError::SameGuestPath`]).
    pub fn check(&self) -> Result<(), AuthorityError> {
        self.limits.check()?;
        for (i, dir) in self.dirs.iter().enumerate() {
            if let Some(first) = self.dirs[..i]
                .iter()
                .find(|d| same_guest_path(&d.guest, &dir.guest))
            {
                return Err(AuthorityError::SameGuestPath {
                    guest: dir.guest.clone(),
                    first: first.host.clone(),
                    second: dir.host.clone(),
                });
            }
        }
        Ok(())
    }

    /// Checks that this authority asks for nothing `within` does not allow: each
    /// directory is one of `within`'s or inside one, each variable one of `within`'s,
    /// each HTTP destination covered by one of `within`'s, no limit above `within`'s,
    /// and durability no weaker.
    pub fn fits_within(&self, within: &Authority) -> Result<(), AuthorityError> {
        let wider = |what: String| Err(AuthorityError::Wider { what });
        for dir in &self.dirs {
            if !within.dirs.iter().any(|d| is_within(&dir.host, &d.host)) {
                return wider(format!("directory {}", dir.host.display()));
            }
        }
        for var in &self.env {
            if !within.env.contains(var) {
                return wider(format!("environment variable {}", var.0));
            }
        }
        for dest in &self.http.allow {
            let covered = within
                .http
                .allow
                .iter()
                .any(|d| d.host == dest.host && (d.port.is_none() || d.port == dest.port));
            if !covered {
                return wider(format!("HTTP destination {dest}"));
            }
        }
        if self.http.outside_claims && !within.http.outside_claims {
            return wider("HTTP requests outside claims".to_string());
        }
        if self.sync == SyncMode::Normal && within.sync == SyncMode::Full {
            return wider("sync normal (the deployment requires full)".to_string());
        }
        let (a, b) = (&self.limits, &within.limits);
        let over = [
            ("max_key_bytes", a.max_key_bytes > b.max_key_bytes),
            ("max_result_bytes", a.max_result_bytes > b.max_result_bytes),
            ("max_state_bytes", a.max_state_bytes > b.max_state_bytes),
            ("max_output_bytes", a.max_output_bytes > b.max_output_bytes),
            ("max_memory_bytes", a.max_memory_bytes > b.max_memory_bytes),
            ("max_handles", a.max_handles > b.max_handles),
            ("max_claims", a.max_claims > b.max_claims),
            ("max_children", a.max_children > b.max_children),
            ("max_depth", a.max_depth > b.max_depth),
            (
                "max_table_elements",
                a.max_table_elements > b.max_table_elements,
            ),
            ("max_compute", a.max_compute > b.max_compute),
            ("effect_timeout", a.effect_timeout > b.effect_timeout),
            (
                "max_fuel",
                match (a.max_fuel, b.max_fuel) {
                    (_, None) => false,
                    (None, Some(_)) => true,
                    (Some(a), Some(b)) => a > b,
                },
            ),
        ];
        if let Some((name, _)) = over.iter().find(|(_, over)| *over) {
            return wider(format!("a higher {name} limit"));
        }
        Ok(())
    }
}

/// Whether two guest paths name one preopen: wasi-libc, which Rust's and Python's
/// guests look paths up through, skips leading `/` and `./` and ignores trailing `/`;
/// empty and `.` components are dropped here too.
fn same_guest_path(a: &str, b: &str) -> bool {
    let parts = |p: &str| {
        p.split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    parts(a) == parts(b)
}

/// Whether `path` is `dir` or lies inside it, compared as written and, where both
/// exist, as resolved (symlinks followed).
fn is_within(path: &Path, dir: &Path) -> bool {
    let resolved = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    path.starts_with(dir) || resolved(path).starts_with(resolved(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_submission_narrows_and_never_widens() {
        let deployment = Authority {
            dirs: vec![DirGrant {
                host: "/srv/data".into(),
                guest: "/data".into(),
            }],
            env: vec![("MODE".into(), "live".into())],
            http: HttpPolicy {
                allow: vec!["api.example.com".parse().unwrap()],
                outside_claims: false,
            },
            ..Authority::default()
        };
        let narrower = Authority {
            dirs: vec![DirGrant {
                host: "/srv/data/run-1".into(),
                guest: "/data".into(),
            }],
            http: HttpPolicy {
                allow: vec!["api.example.com:443".parse().unwrap()],
                outside_claims: false,
            },
            limits: Limits {
                max_memory_bytes: 64 << 20,
                ..Limits::default()
            },
            ..Authority::default()
        };
        assert_eq!(narrower.fits_within(&deployment), Ok(()));
        let other_dir = Authority {
            dirs: vec![DirGrant {
                host: "/etc".into(),
                guest: "/data".into(),
            }],
            ..Authority::default()
        };
        assert!(other_dir.fits_within(&deployment).is_err());
        let more_memory = Authority {
            limits: Limits {
                max_memory_bytes: 1 << 30,
                ..Limits::default()
            },
            ..Authority::default()
        };
        let err = more_memory.fits_within(&deployment).unwrap_err();
        assert!(err.to_string().contains("max_memory_bytes"), "{err}");
        let round = Authority::decode(&deployment.encode()).unwrap();
        assert_eq!(round, deployment);
    }

    /// Two directories under one guest path used to be accepted, the agent seeing only
    /// one of them: refused, however the guest path is spelled.
    #[test]
    fn two_grants_onto_one_guest_path_are_refused() {
        let grant = |host: &str, guest: &str| DirGrant {
            host: host.into(),
            guest: guest.into(),
        };
        let authority = |dirs| Authority {
            dirs,
            ..Authority::default()
        };
        for guest in ["/data", "/data/", "data", "./data", "//data/."] {
            let twice = authority(vec![
                grant("/srv/a", "/data"),
                grant("/srv/other", "/logs"),
                grant("/srv/b", guest),
            ]);
            assert_eq!(
                twice.check(),
                Err(AuthorityError::SameGuestPath {
                    guest: guest.into(),
                    first: "/srv/a".into(),
                    second: "/srv/b".into(),
                }),
                "{guest}"
            );
        }
        let apart = authority(vec![
            grant("/srv/a", "/data"),
            grant("/srv/b", "/data/b"),
            grant("/srv/c", "/database"),
        ]);
        assert_eq!(apart.check(), Ok(()));
    }
}
