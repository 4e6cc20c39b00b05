//! Heartbeats on a thread of their own: a runtime with one thread and its own connection
//! to the master, which nothing else of the node uses. The master counts a node alive
//! while its heartbeats arrive; beats sent from the node's main runtime stop when its
//! threads are busy (a long synchronous step, a lock held across a checkpoint copy, a
//! starved scheduler), and a live node was declared dead for it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::Master;

/// The heartbeat thread of a node; stopped when dropped.
#[derive(Debug)]
pub struct Beats {
    stop: Arc<Notify>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Calls `beat(master, seq)` every `every` (at least 1 ms; seq 1, 2, ...) on a thread named `name`, with
/// a client of the master at `addr` made there: whether or not the previous beat was
/// answered, since a reply may wait for the master's disk, and waiting for it before the
/// next beat let a slow master declare live nodes dead. Each beat runs as a task of that
/// thread; it may hand its reply to the node's main runtime through a channel.
pub fn spawn<F, Fut>(
    name: &str,
    addr: &str,
    token: &str,
    every: Duration,
    mut beat: F,
) -> anyhow::Result<Beats>
where
    F: FnMut(Master, u64) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Made in the runtime's context: a channel's connection is driven by the runtime it
    // was made in (entering it does not block, so the caller may be async).
    let master = {
        let _in_runtime = runtime.enter();
        crate::master_client(addr, token, 64 << 20)?
    };
    let stop = Arc::new(Notify::new());
    let stopped = stop.clone();
    let thread = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            runtime.block_on(async move {
                let mut tick = tokio::time::interval(every.max(Duration::from_millis(1)));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                for seq in 1u64.. {
                    tokio::select! {
                        _ = tick.tick() => {}
                        _ = stopped.notified() => break,
                    }
                    tokio::spawn(beat(master.clone(), seq));
                }
            });
            // Beats still in flight end with the runtime, unsent or unanswered.
        })?;
    Ok(Beats {
        stop,
        thread: Some(thread),
    })
}

impl Drop for Beats {
    fn drop(&mut self) {
        // A permit is kept when the thread is not waiting yet: it stops at its next turn.
        self.stop.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beats_go_on_while_the_callers_runtime_is_blocked_and_end_when_dropped() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        // Started from async code, as the nodes start it. Nobody listens at the address:
        // a beat needs no answer to be sent.
        let beats = rt
            .block_on(async {
                spawn(
                    "test-beats",
                    "127.0.0.1:9",
                    "secret",
                    Duration::from_millis(5),
                    move |_, seq| {
                        let tx = tx.clone();
                        async move {
                            let _ = tx.send(seq);
                        }
                    },
                )
            })
            .unwrap();
        // The caller's only runtime thread blocks until five beats came: they come from
        // elsewhere (a beat of this runtime would never come).
        let seen: Vec<u64> = rt.block_on(async {
            (0..5)
                .map(|_| rx.recv_timeout(Duration::from_secs(30)).expect("a beat"))
                .collect()
        });
        assert_eq!(seen.len(), 5);
        drop(beats);
        // The thread has ended and dropped every sender: what it sent before is left,
        // then the channel is closed.
        let left = rx.try_iter().count();
        assert_eq!(
            rx.try_recv(),
            Err(std::sync::mpsc::TryRecvError::Disconnected),
            "beats after the drop ({left} before it)"
        );
    }
}
