//! The direct probe of a suspected node (`elastrec_control::job`'s liveness): a request
//! to its metrics endpoint, which the node serves itself, apart from its calls to the
//! master. Any HTTP reply, even a refusal for a missing token, shows the process alive
//! and answering; a refused connection shows it gone. No answer within the timeout is
//! left to the state machine, which declares the node dead when its suspicion lasts
//! `dead_after_ms`.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::core::MasterCore;

/// Probes every node the state machine suspected since the last call, each in its own
/// task.
pub fn start_due(core: &Arc<MasterCore>) {
    let due = core.take_probes();
    if due.is_empty() {
        return;
    }
    let timeout = Duration::from_millis(core.job.lock().policy().dead_after_ms.max(1));
    for node in due {
        let core = core.clone();
        tokio::spawn(async move {
            let outcome = tokio::time::timeout(timeout, http_reply(&node.metrics_addr)).await;
            let answer = match outcome {
                Ok(answer) => answer,
                // Silent: the state machine's clock decides.
                Err(_) => return,
            };
            let recorded = core
                .run(|job, cx| match &answer {
                    Ok(()) => job.probe_answered(node.id, cx),
                    Err(why) => job.probe_failed(node.id, why, cx),
                })
                .await;
            if let Err(e) = recorded {
                tracing::warn!(node = node.id, "recording a probe's answer failed: {e}");
            }
        });
    }
}

/// Sends `GET /metrics` to `addr` and reads the start of the reply: `Ok` when it is
/// HTTP, else why not.
pub async fn http_reply(addr: &str) -> Result<(), String> {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connecting: {e}"))?;
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    s.write_all(request.as_bytes())
        .await
        .map_err(|e| format!("sending: {e}"))?;
    let mut head = [0u8; 7];
    s.read_exact(&mut head)
        .await
        .map_err(|e| format!("reading the reply: {e}"))?;
    if &head == b"HTTP/1." {
        Ok(())
    } else {
        Err(format!(
            "the reply is not HTTP (starts with {:?})",
            String::from_utf8_lossy(&head)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A metrics endpoint answers (401 without the token is an answer); a port where
    /// nothing listens, or a server that speaks something else, fails naming why.
    #[tokio::test]
    async fn a_probe_tells_a_live_endpoint_from_a_dead_port_and_a_stranger() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = elastrec_metrics::serve_on(
            listener,
            elastrec_metrics::Access::token("secret"),
            String::new,
        )
        .unwrap();
        assert_eq!(http_reply(&endpoint.addr().to_string()).await, Ok(()));
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead = free.local_addr().unwrap().to_string();
        drop(free);
        let err = http_reply(&dead).await.unwrap_err();
        assert!(err.starts_with("connecting:"), "{err}");
        let stranger = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = stranger.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = stranger.accept().await.unwrap();
            s.write_all(b"SSH-2.0-x\r\n").await.unwrap();
        });
        let err = http_reply(&addr).await.unwrap_err();
        assert!(err.contains("not HTTP"), "{err}");
    }
}
