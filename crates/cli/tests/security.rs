//! Transport security and roles, end to end: a job whose master and nodes sit on two
//! different loopback addresses (two "hosts"), with TLS on. It trains exactly once to the
//! single-process AUC; a client without the job's certificate cannot talk to it; a worker's
//! token cannot make the master's or a parameter server's administrative calls.
//!
//! One test per binary: it installs the job's TLS material in this process.

mod common;

use std::time::Duration;

use common::*;
use elastrec_proto::master::PauseRequest;
use elastrec_proto::ps::CheckpointRequest;
use elastrec_rpc::{self as rpc, Caller};

const CLUSTER: &str = r#"
[cluster]
ps = 2
workers = 2
staleness = 0
batches_per_shard = 4
heartbeat_ms = 200
dead_after_ms = 2000
bind = "127.0.0.1"
[engine.network]
bind = "127.0.0.2"
[engine.tls]
mode = "on"
"#;

#[test]
fn tls_job_across_two_addresses_trains_exactly_once_and_roles_are_enforced() {
    let _g = serial();
    let (job, dir) = write_job("tls", CLUSTER);
    let log = dir.with_extension("log");
    let at = (fixture().train_rows / 2).to_string();
    let mut g = Group::spawn(
        &["run", job.to_str().unwrap(), "--pause-at-samples", &at],
        &log,
    );
    // `elastrec status` speaks TLS with the job's certificate from the job directory.
    let s = wait_held(&dir);
    let master_addr = std::fs::read_to_string(dir.join("master.addr")).unwrap();
    assert!(master_addr.starts_with("127.0.0.1:"), "{master_addr}");
    let ps_addrs: Vec<String> = s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["role"] == "ps")
        .map(|n| n["addr"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ps_addrs.len(), 2, "{s}");
    assert!(
        ps_addrs.iter().all(|a| a.starts_with("127.0.0.2:")),
        "the parameter servers serve on the other host's address: {ps_addrs:?}"
    );
    let secret = std::fs::read_to_string(dir.join("token")).unwrap();
    let secret = secret.trim();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let pause = || PauseRequest {
        version: rpc::version(),
        at_samples: None,
        release: false,
    };
    // Without TLS, even the owner's secret gets nowhere.
    let plain = rt.block_on(async {
        let mut m =
            rpc::master_client_with_timeout(&master_addr, secret, 1 << 20, Duration::from_secs(5))
                .unwrap();
        m.pause(pause()).await
    });
    assert!(plain.is_err(), "a plain-text call reached a TLS job");
    let tls = elastrec_rpc::tls::TlsMaterial::load(&dir.join("tls"))
        .unwrap()
        .expect("the master issued the job's TLS material");
    elastrec_rpc::tls::install(tls).unwrap();
    let worker_token = rpc::role_token(secret, Caller::Worker);
    rt.block_on(async {
        let mut m = rpc::master_client_with_timeout(
            &master_addr,
            &worker_token,
            1 << 20,
            Duration::from_secs(10),
        )
        .unwrap();
        let e = m.pause(pause()).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        let mut ps = rpc::ps_client(
            &ps_addrs[0],
            &worker_token,
            1 << 20,
            Duration::from_secs(10),
        )
        .unwrap();
        let e = ps
            .checkpoint(CheckpointRequest {
                version: rpc::version(),
                id: 99,
                location: "/tmp/elastrec-not-allowed".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    });
    assert!(!std::path::Path::new("/tmp/elastrec-not-allowed").exists());
    unpause(&dir);
    g.wait_success(&log);
    check_result(&dir, &log, 0.005);
}
