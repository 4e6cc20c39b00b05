//! The master's lease on a parameter server: a server serves only while it knows the
//! master still counts it as alive, so a server the master declared dead (and replaced)
//! has stopped changing anything before its replacement starts.
//!
//! The master declares a server dead only after hearing nothing from it for
//! `cluster.dead_after_ms` (then probing it). The server measures its lease from the moment
//! it *sent* the last heartbeat the master acknowledged, which is no later than the moment
//! the master received it, so with a lease shorter than `dead_after_ms`
//! (`ClusterConfig::lease`) the server's lease runs out before the master's verdict can
//! come. From then on it refuses pulls, pushes and checkpoints and sends no replica
//! updates, until an acknowledged heartbeat renews the lease; the reply to a dead server's
//! heartbeat says "unknown" and never renews it, so the server exits without serving again.
//!
//! The lease is a local safeguard against a server that was cut off (a partition, a
//! long stall). Against a process that stalls *between* checking its lease and acting,
//! the receivers also fence by generation (node ids, see `replica.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::error::PsError;

/// Unarmed: a server started without a master (tests, tools) is never fenced.
const UNARMED: u64 = u64::MAX;

/// The lease: armed once the server registered; renewed by acknowledged heartbeats.
#[derive(Debug)]
pub struct Lease {
    /// The lease's length in ms ([`UNARMED`] until armed).
    length_ms: AtomicU64,
    /// When the last acknowledged heartbeat was sent, in ms since `origin`.
    renewed_ms: AtomicU64,
    origin: OnceLock<Instant>,
}

impl Default for Lease {
    fn default() -> Self {
        Self {
            length_ms: AtomicU64::new(UNARMED),
            renewed_ms: AtomicU64::new(0),
            origin: OnceLock::new(),
        }
    }
}

impl Lease {
    /// Arms the lease at `length`, counted from `sent` (the registration that the master
    /// answered).
    pub fn arm(&self, length: Duration, sent: Instant) {
        self.renew(sent);
        self.length_ms
            .store(length.as_millis() as u64, Ordering::Release);
    }

    /// An acknowledged heartbeat sent at `sent` renews the lease (an older one than the
    /// last renewal changes nothing).
    pub fn renew(&self, sent: Instant) {
        let origin = *self.origin.get_or_init(|| sent);
        let at = sent.saturating_duration_since(origin).as_millis() as u64;
        self.renewed_ms.fetch_max(at, Ordering::AcqRel);
    }

    /// How long ago the lease was last renewed, when it has run out.
    pub fn expired(&self) -> Option<Duration> {
        let length = self.length_ms.load(Ordering::Acquire);
        if length == UNARMED {
            return None;
        }
        let origin = *self.origin.get()?;
        let now = origin.elapsed().as_millis() as u64;
        let since = now.saturating_sub(self.renewed_ms.load(Ordering::Acquire));
        (since >= length).then(|| Duration::from_millis(since))
    }

    /// Refuses with [`PsError::Fenced`] when the lease has run out.
    pub fn check(&self) -> Result<(), PsError> {
        match self.expired() {
            Some(since) => Err(PsError::Fenced {
                since_ms: since.as_millis() as u64,
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unarmed_lease_never_fences() {
        let lease = Lease::default();
        assert!(lease.check().is_ok());
        lease.renew(Instant::now() - Duration::from_secs(3600));
        assert!(lease.check().is_ok());
    }

    #[test]
    fn a_lease_runs_out_its_length_after_the_last_acknowledged_send() {
        let lease = Lease::default();
        let long_ago = Instant::now() - Duration::from_secs(10);
        lease.arm(Duration::from_secs(5), long_ago);
        let Err(PsError::Fenced { since_ms }) = lease.check() else {
            panic!("a lease renewed 10 s ago with a length of 5 s still holds");
        };
        assert!(since_ms >= 10_000, "{since_ms}");
        // A reply to a heartbeat sent just now renews it; a late reply to an older
        // heartbeat does not take it back.
        lease.renew(Instant::now());
        lease.renew(long_ago);
        assert!(lease.check().is_ok());
    }
}
