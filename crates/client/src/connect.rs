//! A client of a running job's master, from what its job directory holds.

use anyhow::Context as _;
use elastrec_rpc::{self as rpc, Master};

use crate::JobDir;

/// A client of the job's master in `dir`, from the address, token and TLS material its
/// master wrote there.
pub fn connect(dir: &std::path::Path) -> anyhow::Result<Master> {
    connect_with_timeout(dir, rpc::MASTER_CALL_TIMEOUT)
}

/// [`connect`] with calls that may take up to `call_timeout`.
pub fn connect_with_timeout(
    dir: &std::path::Path,
    call_timeout: std::time::Duration,
) -> anyhow::Result<Master> {
    let dir = JobDir(dir.to_path_buf());
    let addr = std::fs::read_to_string(dir.addr())
        .with_context(|| format!("{} holds no running job (no master.addr)", dir.0.display()))?;
    let token = std::fs::read_to_string(dir.token())
        .with_context(|| format!("reading the job token {}", dir.token().display()))?;
    // A job whose channels use TLS: this command speaks TLS with the job's certificate.
    if let Some(m) = elastrec_rpc::tls::TlsMaterial::load(&dir.tls())? {
        elastrec_rpc::tls::install(m)?;
    }
    rpc::master_client_with_timeout(addr.trim(), token.trim(), 64 << 20, call_timeout).with_context(
        || {
            format!(
                "{} is corrupt: it must hold the token that the job's master wrote",
                dir.token().display()
            )
        },
    )
}
