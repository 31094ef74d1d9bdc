//! Components, deployments and namespace membership on SQLite.
//!
//! A deployment is a row in a history: deploying appends one, and a name's latest row
//! is what it points at. A namespace's members are the components whose runs may use
//! its keys: admitted by a deployment, or members because a run of theirs was submitted
//! (or upgraded) there, which is also how runs from before deployments existed count.

use rusqlite::types::Type;
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::TxError;
use crate::store::rules;
use crate::store::{
    Admission, Deployed, Deployment, DeploymentRecord, InFlight, Millis, Rollout, StoreError,
};

/// Stores a component's bytes under their digest; whether they were new.
pub(super) fn put_component(
    conn: &Connection,
    digest: &str,
    bytes: &[u8],
    now: Millis,
) -> Result<bool, TxError> {
    let size = i64::try_from(bytes.len()).unwrap_or(i64::MAX);
    let inserted = conn
        .prepare_cached(
            "INSERT INTO components (digest, bytes, size, created) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (digest) DO NOTHING",
        )?
        .execute(params![digest, bytes, size, now])?;
    Ok(inserted == 1)
}

/// Components at least this large are moved out of the WAL as soon as they are stored.
pub(super) const CHECKPOINT_AFTER_BYTES: usize = 1 << 20;

/// Copies the WAL into the database and empties it. Called after storing a large
/// component: a process that opens the store while no other has it open rebuilds the
/// WAL's index by reading every frame, so a component left in the WAL would be read
/// (19 MB for a Python agent) at every start until the next automatic checkpoint,
/// 10 000 pages later.
pub(super) fn checkpoint(conn: &Connection) -> Result<(), TxError> {
    // The row says whether it finished; a checkpoint that another connection's reader
    // held back is retried by SQLite's own later checkpoints.
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    Ok(())
}

/// Whether the store holds the component `digest`.
pub(super) fn known(conn: &Connection, digest: &str) -> Result<bool, TxError> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM components WHERE digest = ?1")?
        .query_row([digest], |_| Ok(()))
        .optional()?
        .is_some())
}

/// A component's bytes.
pub(super) fn component(conn: &Connection, digest: &str) -> Result<Option<Vec<u8>>, TxError> {
    let bytes = conn
        .prepare_cached("SELECT bytes FROM components WHERE digest = ?1")?
        .query_row([digest], |row| row.get(0))
        .optional()?;
    Ok(bytes)
}

/// Refuses a digest whose component is not in the store.
pub(super) fn require(conn: &Connection, digest: &str) -> Result<(), TxError> {
    if known(conn, digest)? {
        Ok(())
    } else {
        Err(TxError::Store(StoreError::UnknownComponent {
            digest: digest.to_owned(),
        }))
    }
}

/// Makes `digest` a member of `namespace`, unless it is one already (it keeps how it
/// first joined).
pub(super) fn add_member(
    conn: &Connection,
    namespace: &str,
    digest: &str,
    how: &str,
    now: Millis,
) -> Result<(), TxError> {
    conn.prepare_cached(
        "INSERT INTO namespace_members (namespace, digest, how, at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (namespace, digest) DO NOTHING",
    )?
    .execute(params![namespace, digest, how, now])?;
    Ok(())
}

/// Points a name at a component as its next version, admitting it to the name's
/// namespace as its admission allows, and moves the name's runs in flight to it if the
/// rollout says so; deploying what is current again makes no new version.
pub(super) fn deploy(
    conn: &Connection,
    deployment: &Deployment<'_>,
    rollout: &Rollout<'_>,
    now: Millis,
) -> Result<Deployed, TxError> {
    require(conn, deployment.digest)?;
    let current = self::deployment(conn, deployment.name)?;
    let record = match current.as_ref().filter(|current| {
        current.digest == deployment.digest && current.authority == deployment.authority
    }) {
        Some(current) => current.clone(),
        None => new_version(conn, deployment, rollout, current, now)?,
    };
    let (moved, kept) = match rollout.in_flight {
        InFlight::Pin => (Vec::new(), Vec::new()),
        InFlight::Upgrade => super::versions::roll_out(conn, deployment.name, record.version, now)?,
    };
    Ok(Deployed {
        record,
        moved,
        kept,
    })
}

/// Appends the name's next version.
fn new_version(
    conn: &Connection,
    deployment: &Deployment<'_>,
    rollout: &Rollout<'_>,
    current: Option<DeploymentRecord>,
    now: Millis,
) -> Result<DeploymentRecord, TxError> {
    let namespace = deployment.name;
    let membership = membership(conn, namespace, deployment.digest)?;
    let Some(admission) = rules::admit(deployment, current.as_ref(), membership) else {
        let owner = match current {
            Some(current) => current.digest,
            None => latest_member(conn, namespace)?.unwrap_or_default(),
        };
        return Err(TxError::Store(StoreError::NamespaceTaken {
            namespace: namespace.to_owned(),
            owner,
            digest: deployment.digest.to_owned(),
        }));
    };
    add_member(
        conn,
        namespace,
        deployment.digest,
        rules::member_how(admission),
        now,
    )?;
    let version: i64 = conn
        .prepare_cached("SELECT coalesce(max(version), 0) + 1 FROM deployments WHERE name = ?1")?
        .query_row([deployment.name], |row| row.get(0))?;
    conn.prepare_cached(
        "INSERT INTO deployments
             (name, digest, authority, admission, deployed_at, source, version, in_flight, exports)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?
    .execute(params![
        deployment.name,
        deployment.digest,
        deployment.authority,
        admission.as_str(),
        now,
        deployment.source,
        version,
        rollout.in_flight.as_str(),
        rollout.exports,
    ])?;
    Ok(DeploymentRecord {
        name: deployment.name.to_owned(),
        digest: deployment.digest.to_owned(),
        authority: deployment.authority.to_vec(),
        deployed_at: now,
        admission,
        source: deployment.source.map(str::to_owned),
        version: u64::try_from(version).unwrap_or_default(),
        in_flight: rollout.in_flight,
        exports: rollout.exports.map(str::to_owned),
    })
}

/// What a name points at now.
pub(super) fn deployment(
    conn: &Connection,
    name: &str,
) -> Result<Option<DeploymentRecord>, TxError> {
    let record = conn
        .prepare_cached(
            "SELECT name, digest, authority, admission, deployed_at, source, version, in_flight,
                    exports
             FROM deployments WHERE name = ?1 ORDER BY id DESC LIMIT 1",
        )?
        .query_row([name], record)
        .optional()?;
    Ok(record)
}

/// Every name and what it points at now, by name.
pub(super) fn deployments(conn: &Connection) -> Result<Vec<DeploymentRecord>, TxError> {
    let records = conn
        .prepare_cached(
            "SELECT name, digest, authority, admission, deployed_at, source, version, in_flight,
                    exports
             FROM deployments d
             WHERE id = (SELECT max(id) FROM deployments WHERE name = d.name)
             ORDER BY name",
        )?
        .query_map([], record)?
        .collect::<rusqlite::Result<_>>()?;
    Ok(records)
}

/// `None` if the namespace has no member, else whether `digest` is one.
pub(super) fn admitted(
    conn: &Connection,
    namespace: &str,
    digest: &str,
) -> Result<Option<bool>, TxError> {
    let (members, is_member) = membership(conn, namespace, digest)?;
    Ok((members > 0).then_some(is_member))
}

/// How many members the namespace has, and whether `digest` is one.
fn membership(conn: &Connection, namespace: &str, digest: &str) -> Result<(i64, bool), TxError> {
    let membership = conn
        .prepare_cached(
            "SELECT count(*), coalesce(max(digest = ?2), 0) FROM namespace_members
             WHERE namespace = ?1",
        )?
        .query_row([namespace, digest], |row| Ok((row.get(0)?, row.get(1)?)))?;
    Ok(membership)
}

/// The member that joined the namespace last.
fn latest_member(conn: &Connection, namespace: &str) -> Result<Option<String>, TxError> {
    let digest = conn
        .prepare_cached(
            "SELECT digest FROM namespace_members WHERE namespace = ?1
             ORDER BY at DESC, digest LIMIT 1",
        )?
        .query_row([namespace], |row| row.get(0))
        .optional()?;
    Ok(digest)
}

/// Reads `name, digest, authority, admission, deployed_at, source, version, in_flight,
/// exports` at 0..9.
pub(super) fn record(row: &Row<'_>) -> rusqlite::Result<DeploymentRecord> {
    let admission: String = row.get(3)?;
    let in_flight: String = row.get(7)?;
    Ok(DeploymentRecord {
        name: row.get(0)?,
        digest: row.get(1)?,
        authority: row.get(2)?,
        // The schema's CHECK constraint should have kept anything else out.
        admission: Admission::from_name(&admission).ok_or_else(|| {
            rusqlite::Error::FromSqlConversionFailure(
                3,
                Type::Text,
                format!("unknown admission {admission:?}").into(),
            )
        })?,
        deployed_at: row.get(4)?,
        source: row.get(5)?,
        version: super::u64_column(row, 6)?,
        in_flight: InFlight::from_name(&in_flight).ok_or_else(|| {
            rusqlite::Error::FromSqlConversionFailure(
                7,
                Type::Text,
                format!("unknown in-flight policy {in_flight:?}").into(),
            )
        })?,
        exports: row.get(8)?,
    })
}
