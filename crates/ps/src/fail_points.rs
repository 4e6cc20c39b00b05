//! Test fail points of the PS process (`elastrec_common::fail_points`: set by environment
//! variables, compiled in only for tests).

use std::time::Duration;

use elastrec_common::fail_points;

/// Test fail point `ELASTREC_FAIL_PS_GROWTH=BYTES`: every pushed row makes this server
/// hold `BYTES` more memory, as a server whose embedding tables grow with new ids does
/// (its memory grows with the rows routed to it, so adding servers slows each one's
/// growth).
pub(crate) fn fail_point_grow(rows: usize) {
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    static HELD: parking_lot::Mutex<Vec<Vec<u8>>> = parking_lot::Mutex::new(Vec::new());
    let per_row = *BYTES
        .get_or_init(|| fail_points::number("ELASTREC_FAIL_PS_GROWTH").map_or(0, |b| b as usize));
    if per_row > 0 && rows > 0 {
        // Written, so the pages are resident.
        HELD.lock().push(vec![1u8; rows * per_row]);
    }
}

/// Node id of this PS process, for fail points that name one process (set at start).
pub(crate) static NODE_ID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

/// Test fail point `ELASTREC_FAIL_SLOW_PS=NODE:US`: PS process `NODE` spends `US`
/// microseconds more per row on every pull and push, as an overloaded or throttled server
/// would (a server started later, even for the same index, is another node).
pub(crate) async fn fail_point_slow_rows(rows: u64) {
    static US: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    let us = *US.get_or_init(|| fail_points::for_node("ELASTREC_FAIL_SLOW_PS", *NODE_ID.get()?));
    if let Some(us) = us.filter(|_| rows > 0) {
        tokio::time::sleep(Duration::from_micros(us * rows)).await;
    }
}

/// Test fail point `ELASTREC_FAIL_HANG_CHECKPOINT=INDEX`: PS `INDEX` never answers its
/// first checkpoint request (a hung server), and answers later ones normally.
pub(crate) fn fail_point_hang_checkpoint(index: u32) -> bool {
    static USED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    fail_points::number("ELASTREC_FAIL_HANG_CHECKPOINT") == Some(u64::from(index))
        && !USED.swap(true, std::sync::atomic::Ordering::AcqRel)
}

/// Test fail point `ELASTREC_FAIL_MUTE_HEARTBEAT=NODE:MS`: PS process `NODE` sends no
/// heartbeat for its first `MS` milliseconds of serving, while it serves as usual, as a
/// server whose heartbeats are starved or lost on the way to the master would.
pub(crate) fn fail_point_heartbeat_muted(serving_since: std::time::Instant) -> bool {
    static MS: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    let ms =
        *MS.get_or_init(|| fail_points::for_node("ELASTREC_FAIL_MUTE_HEARTBEAT", *NODE_ID.get()?));
    ms.is_some_and(|ms| serving_since.elapsed() < Duration::from_millis(ms))
}

/// Test fail point `ELASTREC_FAIL_SLOW_BUILD=NODE:MS`: PS process `NODE` takes `MS`
/// milliseconds more to build its tables, as a server of very large tables does.
pub(crate) fn fail_point_slow_build() {
    if let Some(ms) = NODE_ID
        .get()
        .and_then(|&node| fail_points::for_node("ELASTREC_FAIL_SLOW_BUILD", node))
    {
        std::thread::sleep(Duration::from_millis(ms));
    }
}

/// Test fail point `ELASTREC_FAIL_BLOCK_RUNTIME=NODE:MS`: once PS process `NODE` serves,
/// every thread of its main runtime is blocked for `MS` milliseconds (a long synchronous
/// step, a lock held across a copy): it neither serves nor answers a probe meanwhile.
pub(crate) fn fail_point_block_runtime() {
    let Some(ms) = NODE_ID
        .get()
        .and_then(|&node| fail_points::for_node("ELASTREC_FAIL_BLOCK_RUNTIME", node))
    else {
        return;
    };
    // One blocking task per worker thread of the runtime: an idle worker takes each.
    for _ in 0..tokio::runtime::Handle::current().metrics().num_workers() {
        tokio::spawn(async move { std::thread::sleep(Duration::from_millis(ms)) });
    }
}
