//! Rate limits on SQLite: classes' buckets, and the token a step's rate wait reserves.
//! Every reservation is made in the one write transaction of the database's writer,
//! so no two steps are handed one token.

use rusqlite::{Connection, OptionalExtension, params};

use super::TxError;
use crate::store::{Bucket, Millis, RateLimit, RateSetting, check_rate};

/// Sets a class's limit; the bucket keeps the tokens reserved so far.
pub(super) fn set_rate(
    conn: &Connection,
    setting: &RateSetting<'_>,
    now: Millis,
) -> Result<RateLimit, TxError> {
    let period_ms = check_rate(setting).map_err(TxError::Store)?;
    let tokens = i64::from(setting.limit);
    let tat = bucket(conn, setting.class)?.map_or(0, |old| old.rescaled(tokens));
    conn.prepare_cached(
        "INSERT INTO rate_limits (class, tokens, period_ms, burst, tat, updated)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (class) DO UPDATE SET tokens = excluded.tokens,
             period_ms = excluded.period_ms, burst = excluded.burst, tat = excluded.tat,
             updated = excluded.updated",
    )?
    .execute(params![
        setting.class,
        tokens,
        period_ms,
        setting.burst,
        tat,
        now
    ])?;
    let kept = Bucket {
        limit: tokens,
        period_ms,
        burst: i64::from(setting.burst),
        tat,
    };
    Ok(kept.shown(setting.class.to_string(), now, now))
}

/// A class's bucket, if it has a limit.
fn bucket(conn: &Connection, class: &str) -> Result<Option<Bucket>, TxError> {
    Ok(conn
        .prepare_cached("SELECT tokens, period_ms, burst, tat FROM rate_limits WHERE class = ?1")?
        .query_row([class], |row| {
            Ok(Bucket {
                limit: row.get(0)?,
                period_ms: row.get(1)?,
                burst: row.get(2)?,
                tat: row.get(3)?,
            })
        })
        .optional()?)
}

/// Reserves a token of `class` at `now`: when it is free (`now` for a class with no
/// limit).
pub(super) fn reserve(conn: &Connection, class: &str, now: Millis) -> Result<Millis, TxError> {
    let Some(bucket) = bucket(conn, class)? else {
        return Ok(now);
    };
    let (at, tat) = bucket.reserve(now);
    conn.prepare_cached("UPDATE rate_limits SET tat = ?2 WHERE class = ?1")?
        .execute(params![class, tat])?;
    Ok(at)
}

/// Clears a class's limit; whether it had one.
pub(super) fn clear_rate(conn: &Connection, class: &str) -> Result<bool, TxError> {
    let cleared = conn
        .prepare_cached("DELETE FROM rate_limits WHERE class = ?1")?
        .execute([class])?;
    Ok(cleared > 0)
}

/// Every class's limit, by class.
pub(super) fn rates(conn: &Connection, now: Millis) -> Result<Vec<RateLimit>, TxError> {
    let rows = conn
        .prepare_cached(
            "SELECT class, tokens, period_ms, burst, tat, updated FROM rate_limits ORDER BY class",
        )?
        .query_map([], |row| {
            let bucket = Bucket {
                limit: row.get(1)?,
                period_ms: row.get(2)?,
                burst: row.get(3)?,
                tat: row.get(4)?,
            };
            Ok((row.get::<_, String>(0)?, bucket, row.get::<_, Millis>(5)?))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows
        .into_iter()
        .map(|(class, bucket, updated)| bucket.shown(class, updated, now))
        .collect())
}
