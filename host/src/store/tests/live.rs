//! Runs' live streams: chunks numbered per run and read after a sequence number, the
//! oldest trimmed beyond the bytes (and rows) a run keeps, the newest always kept,
//! numbers never reused; a stale fence is refused in `leases.rs`, gc in `gc.rs`.

use super::Env;
use crate::store::LiveText;
use crate::store::rules::LIVE_ROWS;

fn text(key: &str, text: &str) -> LiveText {
    LiveText {
        key: key.into(),
        text: text.into(),
    }
}

/// `(seq, key, text)` of what the store keeps of the run after `after`.
async fn kept(env: &Env<'_>, run_id: &str, after: Option<u64>) -> Vec<(u64, String, String)> {
    env.store
        .live(run_id, after, 10_000)
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.seq, c.key, c.text))
        .collect()
}

fn row(seq: u64, key: &str, text: &str) -> (u64, String, String) {
    (seq, key.to_owned(), text.to_owned())
}

pub(super) async fn live_chunks_are_numbered_per_run_and_read_after_a_number(env: &Env<'_>) {
    let store = env.store;
    let r1 = env.lease("r1").await;
    let r2 = env.lease("r2").await;
    assert!(kept(env, "r1", None).await.is_empty());
    store
        .append_live(&r1, &[text("a", "hello"), text("a", " world")], 1024)
        .await
        .unwrap();
    store
        .append_live(&r2, &[text("x", "elsewhere")], 1024)
        .await
        .unwrap();
    // Nothing to append writes nothing (and takes no number).
    store.append_live(&r1, &[], 1024).await.unwrap();
    store
        .append_live(&r1, &[text("b", "ünïcode ✓")], 1024)
        .await
        .unwrap();
    assert_eq!(
        kept(env, "r1", None).await,
        [
            row(0, "a", "hello"),
            row(1, "a", " world"),
            row(2, "b", "ünïcode ✓")
        ]
    );
    assert_eq!(
        kept(env, "r1", Some(0)).await,
        [row(1, "a", " world"), row(2, "b", "ünïcode ✓")]
    );
    assert!(kept(env, "r1", Some(2)).await.is_empty());
    assert!(kept(env, "r1", Some(u64::MAX >> 1)).await.is_empty());
    assert_eq!(kept(env, "r2", None).await, [row(0, "x", "elsewhere")]);
    assert!(kept(env, "ghost", None).await.is_empty());
    // A limit reads the oldest first.
    let first = store.live("r1", None, 1).await.unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].seq, 0);
}

pub(super) async fn live_streams_keep_their_newest_bytes_and_rows(env: &Env<'_>) {
    let store = env.store;
    let run = env.lease("r1").await;
    // Forty chunks of ten bytes, a hundred kept: the newest ten.
    for i in 0..40u64 {
        let chunk = text("k", &format!("{i:>10}"));
        store.append_live(&run, &[chunk], 100).await.unwrap();
    }
    let rows = kept(env, "r1", None).await;
    assert_eq!(rows.len(), 10);
    assert_eq!(rows.first().map(|r| r.0), Some(30));
    assert_eq!(rows.last().map(|r| r.0), Some(39));
    assert!(rows.iter().all(|r| r.2 == format!("{:>10}", r.0)));
    // A chunk longer than what is kept stays alone; numbers go on, never reused.
    let long = "y".repeat(150);
    store
        .append_live(&run, &[text("k", &long)], 100)
        .await
        .unwrap();
    assert_eq!(kept(env, "r1", None).await, [row(40, "k", &long)]);
    // One append that overflows trims within itself.
    let many: Vec<LiveText> = (0..5).map(|i| text("m", &format!("{i:>30}"))).collect();
    store.append_live(&run, &many, 100).await.unwrap();
    let rows = kept(env, "r1", None).await;
    assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), [43, 44, 45]);
    // However small its chunks, a run keeps at most `LIVE_ROWS` of them.
    let rows = usize::try_from(LIVE_ROWS).unwrap();
    let tiny: Vec<LiveText> = (0..rows + 10).map(|_| text("t", "·")).collect();
    store.append_live(&run, &tiny, 1 << 20).await.unwrap();
    let left = store.live("r1", None, rows * 2).await.unwrap();
    assert_eq!(left.len(), rows);
    assert_eq!(left.last().map(|c| c.seq), Some(45 + (rows as u64) + 10));
}
