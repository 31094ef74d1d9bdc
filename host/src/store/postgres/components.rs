//! Components, deployments and namespace membership on PostgreSQL, as on SQLite: a
//! deployment is a row in a history, and a name's latest row is what it points at.

use tokio_postgres::Row;

use super::TxError;
use super::conn::Conn;
use crate::store::rules;
use crate::store::{
    Admission, Deployed, Deployment, DeploymentRecord, InFlight, Rollout, StoreError,
};

/// Stores a component's bytes under their digest; whether they were new.
pub(super) async fn put_component(
    conn: &Conn,
    digest: &str,
    bytes: &[u8],
) -> Result<bool, TxError> {
    // Most runs start with a component the store already holds: one round trip spares
    // sending its bytes (19 MB for a Python agent) for an insert that does nothing.
    if known(conn, digest).await? {
        return Ok(false);
    }
    let size = i64::try_from(bytes.len()).unwrap_or(i64::MAX);
    let inserted = conn
        .execute(
            "INSERT INTO components (digest, bytes, size, created) VALUES ($1, $2, $3, $4)
             ON CONFLICT (digest) DO NOTHING",
            &[&digest, &bytes, &size, &conn.now],
        )
        .await?;
    Ok(inserted == 1)
}

/// Whether the store holds the component `digest`.
pub(super) async fn known(conn: &Conn, digest: &str) -> Result<bool, TxError> {
    Ok(conn
        .query_opt("SELECT 1 FROM components WHERE digest = $1", &[&digest])
        .await?
        .is_some())
}

/// A component's bytes.
pub(super) async fn component(conn: &Conn, digest: &str) -> Result<Option<Vec<u8>>, TxError> {
    match conn
        .query_opt("SELECT bytes FROM components WHERE digest = $1", &[&digest])
        .await?
    {
        Some(row) => Ok(Some(row.try_get(0)?)),
        None => Ok(None),
    }
}

/// Refuses a digest whose component is not in the store.
pub(super) async fn require(conn: &Conn, digest: &str) -> Result<(), TxError> {
    let known = conn
        .query_opt("SELECT 1 FROM components WHERE digest = $1", &[&digest])
        .await?
        .is_some();
    if known {
        Ok(())
    } else {
        Err(TxError::Store(StoreError::UnknownComponent {
            digest: digest.to_owned(),
        }))
    }
}

/// Makes `digest` a member of `namespace`, unless it is one already.
pub(super) async fn add_member(
    conn: &Conn,
    namespace: &str,
    digest: &str,
    how: &str,
) -> Result<(), TxError> {
    conn.execute(
        "INSERT INTO namespace_members (namespace, digest, how, at) VALUES ($1, $2, $3, $4)
         ON CONFLICT (namespace, digest) DO NOTHING",
        &[&namespace, &digest, &how, &conn.now],
    )
    .await?;
    Ok(())
}

/// Points a name at a component as its next version, admitting it to the name's
/// namespace as its admission allows, and moves the name's runs in flight to it if the
/// rollout says so; deploying what is current again makes no new version. Deployments
/// (and moves) of one name are serialised by a transaction-scoped advisory lock on it.
pub(super) async fn deploy(
    conn: &Conn,
    deployment: &Deployment<'_>,
    rollout: &Rollout<'_>,
) -> Result<Deployed, TxError> {
    require(conn, deployment.digest).await?;
    super::versions::lock_name(conn, deployment.name).await?;
    let current = self::deployment(conn, deployment.name).await?;
    let record = match current.as_ref().filter(|current| {
        current.digest == deployment.digest && current.authority == deployment.authority
    }) {
        Some(current) => current.clone(),
        None => new_version(conn, deployment, rollout, current).await?,
    };
    let (moved, kept) = match rollout.in_flight {
        InFlight::Pin => (Vec::new(), Vec::new()),
        InFlight::Upgrade => {
            super::versions::roll_out(conn, deployment.name, record.version).await?
        }
    };
    Ok(Deployed {
        record,
        moved,
        kept,
    })
}

/// Appends the name's next version.
async fn new_version(
    conn: &Conn,
    deployment: &Deployment<'_>,
    rollout: &Rollout<'_>,
    current: Option<DeploymentRecord>,
) -> Result<DeploymentRecord, TxError> {
    let namespace = deployment.name;
    let membership = membership(conn, namespace, deployment.digest).await?;
    let Some(admission) = rules::admit(deployment, current.as_ref(), membership) else {
        let owner = match current {
            Some(current) => current.digest,
            None => latest_member(conn, namespace).await?.unwrap_or_default(),
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
    )
    .await?;
    let row = conn
        .query_one(
            "INSERT INTO deployments
                 (name, digest, authority, admission, deployed_at, source, version, in_flight,
                  exports)
             SELECT $1, $2, $3, $4, $5, $6,
                    coalesce((SELECT max(version) FROM deployments WHERE name = $1), 0) + 1,
                    $7, $8
             RETURNING version",
            &[
                &deployment.name,
                &deployment.digest,
                &deployment.authority,
                &admission.as_str(),
                &conn.now,
                &deployment.source,
                &rollout.in_flight.as_str(),
                &rollout.exports,
            ],
        )
        .await?;
    Ok(DeploymentRecord {
        name: deployment.name.to_owned(),
        digest: deployment.digest.to_owned(),
        authority: deployment.authority.to_vec(),
        deployed_at: conn.now,
        admission,
        source: deployment.source.map(str::to_owned),
        version: super::u64_col(&row, 0)?,
        in_flight: rollout.in_flight,
        exports: rollout.exports.map(str::to_owned),
    })
}

/// What a name points at now.
pub(super) async fn deployment(
    conn: &Conn,
    name: &str,
) -> Result<Option<DeploymentRecord>, TxError> {
    match conn
        .query_opt(
            "SELECT name, digest, authority, admission, deployed_at, source, version, in_flight,
                    exports
             FROM deployments WHERE name = $1 ORDER BY id DESC LIMIT 1",
            &[&name],
        )
        .await?
    {
        Some(row) => Ok(Some(record(&row)?)),
        None => Ok(None),
    }
}

/// Every name and what it points at now, by name.
pub(super) async fn deployments(conn: &Conn) -> Result<Vec<DeploymentRecord>, TxError> {
    let rows = conn
        .query(
            "SELECT DISTINCT ON (name COLLATE \"C\") name, digest, authority, admission,
                    deployed_at, source, version, in_flight, exports
             FROM deployments ORDER BY name COLLATE \"C\", id DESC",
            &[],
        )
        .await?;
    rows.iter().map(record).collect()
}

/// `None` if the namespace has no member, else whether `digest` is one.
pub(super) async fn admitted(
    conn: &Conn,
    namespace: &str,
    digest: &str,
) -> Result<Option<bool>, TxError> {
    let (members, is_member) = membership(conn, namespace, digest).await?;
    Ok((members > 0).then_some(is_member))
}

async fn membership(conn: &Conn, namespace: &str, digest: &str) -> Result<(i64, bool), TxError> {
    let row = conn
        .query_one(
            "SELECT count(*), coalesce(bool_or(digest = $2), false) FROM namespace_members
             WHERE namespace = $1",
            &[&namespace, &digest],
        )
        .await?;
    Ok((row.try_get(0)?, row.try_get(1)?))
}

async fn latest_member(conn: &Conn, namespace: &str) -> Result<Option<String>, TxError> {
    match conn
        .query_opt(
            "SELECT digest FROM namespace_members WHERE namespace = $1
             ORDER BY at DESC, digest COLLATE \"C\" LIMIT 1",
            &[&namespace],
        )
        .await?
    {
        Some(row) => Ok(Some(row.try_get(0)?)),
        None => Ok(None),
    }
}

/// Reads `name, digest, authority, admission, deployed_at, source, version, in_flight,
/// exports` at 0..9.
pub(super) fn record(row: &Row) -> Result<DeploymentRecord, TxError> {
    let admission: String = row.try_get(3)?;
    let in_flight: String = row.try_get(7)?;
    Ok(DeploymentRecord {
        name: row.try_get(0)?,
        digest: row.try_get(1)?,
        authority: row.try_get(2)?,
        admission: Admission::from_name(&admission).ok_or_else(|| {
            TxError::Store(StoreError::Backend {
                op: "read a deployment",
                source: format!("unknown admission {admission:?}").into(),
            })
        })?,
        deployed_at: row.try_get(4)?,
        source: row.try_get(5)?,
        version: super::u64_col(row, 6)?,
        in_flight: InFlight::from_name(&in_flight).ok_or_else(|| {
            TxError::Store(StoreError::Backend {
                op: "read a deployment",
                source: format!("unknown in-flight policy {in_flight:?}").into(),
            })
        })?,
        exports: row.try_get(8)?,
    })
}
