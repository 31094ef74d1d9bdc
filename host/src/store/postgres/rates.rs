//! Rate limits on PostgreSQL: classes' buckets, and the token a step's rate wait
//! reserves. A reservation locks its class's row (`FOR UPDATE`) for the rest of its
//! transaction, so steps on many workers are handed their tokens one after another
//! and never one token twice.

use super::TxError;
use super::conn::Conn;
use crate::store::{Bucket, Millis, RateLimit, RateSetting, check_rate};

/// Sets a class's limit; the bucket keeps the tokens reserved so far.
pub(super) async fn set_rate(conn: &Conn, setting: &RateSetting<'_>) -> Result<RateLimit, TxError> {
    let period_ms = check_rate(setting).map_err(TxError::Store)?;
    let tokens = i64::from(setting.limit);
    let tat = bucket(conn, setting.class)
        .await?
        .map_or(0, |old| old.rescaled(tokens));
    let burst = i64::from(setting.burst);
    conn.execute(
        "INSERT INTO rate_limits (class, tokens, period_ms, burst, tat, updated)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (class) DO UPDATE SET tokens = excluded.tokens,
             period_ms = excluded.period_ms, burst = excluded.burst, tat = excluded.tat,
             updated = excluded.updated",
        &[&setting.class, &tokens, &period_ms, &burst, &tat, &conn.now],
    )
    .await?;
    let kept = Bucket {
        limit: tokens,
        period_ms,
        burst,
        tat,
    };
    Ok(kept.shown(setting.class.to_string(), conn.now, conn.now))
}

/// A class's bucket, if it has a limit, locked until the transaction ends.
async fn bucket(conn: &Conn, class: &str) -> Result<Option<Bucket>, TxError> {
    let row = conn
        .query_opt(
            "SELECT tokens, period_ms, burst, tat FROM rate_limits WHERE class = $1 FOR UPDATE",
            &[&class],
        )
        .await?;
    row.map(|row| {
        Ok(Bucket {
            limit: row.try_get(0)?,
            period_ms: row.try_get(1)?,
            burst: row.try_get(2)?,
            tat: row.try_get(3)?,
        })
    })
    .transpose()
}

/// Reserves a token of `class`: when it is free (now for a class with no limit).
pub(super) async fn reserve(conn: &Conn, class: &str) -> Result<Millis, TxError> {
    let Some(bucket) = bucket(conn, class).await? else {
        return Ok(conn.now);
    };
    let (at, tat) = bucket.reserve(conn.now);
    conn.execute(
        "UPDATE rate_limits SET tat = $2 WHERE class = $1",
        &[&class, &tat],
    )
    .await?;
    Ok(at)
}

/// Clears a class's limit; whether it had one.
pub(super) async fn clear_rate(conn: &Conn, class: &str) -> Result<bool, TxError> {
    let cleared = conn
        .execute("DELETE FROM rate_limits WHERE class = $1", &[&class])
        .await?;
    Ok(cleared > 0)
}

/// Every class's limit, by class.
pub(super) async fn rates(conn: &Conn) -> Result<Vec<RateLimit>, TxError> {
    let rows = conn
        .query(
            "SELECT class, tokens, period_ms, burst, tat, updated FROM rate_limits ORDER BY class",
            &[],
        )
        .await?;
    rows.iter()
        .map(|row| {
            let bucket = Bucket {
                limit: row.try_get(1)?,
                period_ms: row.try_get(2)?,
                burst: row.try_get(3)?,
                tat: row.try_get(4)?,
            };
            Ok(bucket.shown(row.try_get(0)?, row.try_get(5)?, conn.now))
        })
        .collect()
}
