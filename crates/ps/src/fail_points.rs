//! Test fail points of the PS process, set by environment variables (tests hold or slow a
//! server at a known point with them instead of racing it).

use std::time::Duration;

/// Test fail point `ELASTREC_FAIL_PS_GROWTH=BYTES`: every pushed row makes this server
/// hold `BYTES` more memory, as a server whose embedding tables grow with new ids does
/// (its memory grows with the rows routed to it, so adding servers slows each one's
/// growth).
pub(crate) fn fail_point_grow(rows: usize) {
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    static HELD: parking_lot::Mutex<Vec<Vec<u8>>> = parking_lot::Mutex::new(Vec::new());
    let per_row = *BYTES.get_or_init(|| {
        std::env::var("ELASTREC_FAIL_PS_GROWTH")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    });
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
    let us = *US.get_or_init(|| {
        let v = std::env::var("ELASTREC_FAIL_SLOW_PS").ok()?;
        let (who, us) = v.split_once(':')?;
        (Some(&who.parse::<u32>().ok()?) == NODE_ID.get())
            .then(|| us.parse().ok())
            .flatten()
    });
    if let Some(us) = us.filter(|_| rows > 0) {
        tokio::time::sleep(Duration::from_micros(us * rows)).await;
    }
}

/// Test fail point `ELASTREC_FAIL_HANG_CHECKPOINT=INDEX`: PS `INDEX` never answers its
/// first checkpoint request (a hung server), and answers later ones normally.
pub(crate) fn fail_point_hang_checkpoint(index: u32) -> bool {
    static USED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    std::env::var("ELASTREC_FAIL_HANG_CHECKPOINT")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        == Some(index)
        && !USED.swap(true, std::sync::atomic::Ordering::AcqRel)
}
