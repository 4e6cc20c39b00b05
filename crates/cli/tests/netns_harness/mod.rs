//! Hosts with network stacks of their own, on one machine: each host is a Linux network
//! namespace with one interface (`eth0`, its own subnet 10.200.N.0/24 and a default route)
//! joined by a veth pair to a router: a namespace of its own that forwards between the
//! hosts, so no address of the test network exists outside the namespaces made here.
//!
//! Faults, each made inside the namespaces:
//! - a partition drops, on arrival at a host, what another sends it (nftables): packets
//!   leave and are lost, as on a real network, instead of failing at the sender;
//! - packet loss drops a share of what arrives at every host, at random;
//! - latency: this kernel has no `netem`, so the router sends every packet through a delay
//!   line instead (a TUN device the harness reads, holds each packet for the one-way delay,
//!   and writes back through a second TUN device, policy routing telling the two apart).
//!
//! Needs root, `ip` (iproute2) and `nft` (nftables); `scripts/test.sh` installs both and
//! requires them in CI (`ELASTREC_REQUIRE_NETNS`). Everything made is removed on drop,
//! after the processes still inside the namespaces are killed.
#![allow(dead_code)]

use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod delay_line;

/// The test network's hosts.
pub struct Net {
    /// Prefix of every namespace this network made (unique per test process).
    pub prefix: String,
    /// The router's namespace.
    router: String,
    /// Hosts by name, in creation order.
    hosts: Vec<Host>,
    /// The delay line's thread and its stop flag, while one runs.
    delay: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
}

/// One host: its namespace and address.
#[derive(Debug, Clone)]
pub struct Host {
    /// Short name (`master`, `ps0`, `worker1`).
    pub name: String,
    /// Its network namespace.
    pub netns: String,
    /// Its address on the test network.
    pub addr: String,
}

/// Runs `program args`, returning its output or why it could not run.
fn run(program: &str, args: &[&str]) -> Result<Output, String> {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program}: {e}"))
}

/// Runs `ip args`, failing with its stderr.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = run("ip", args)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Sets `key` to `value` in namespace `netns`.
fn sysctl(netns: &str, key: &str, value: &str) -> Result<(), String> {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    let out = run(
        "ip",
        &[
            "netns",
            "exec",
            netns,
            "sh",
            "-c",
            &format!("echo {value} > {path}"),
        ],
    )?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{key} = {value} in {netns}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Why this machine cannot make test hosts, if it cannot.
fn unavailable() -> Option<String> {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("network namespaces need root".into());
    }
    for (tool, package) in [("ip", "iproute2"), ("nft", "nftables")] {
        if run(tool, &["-V"]).is_err() {
            return Some(format!(
                "`{tool}` is missing (Debian's {package}; scripts/test.sh installs it)"
            ));
        }
    }
    None
}

impl Net {
    /// Makes hosts `names` behind one router, or skips the running test (saying why) where
    /// this machine cannot.
    pub fn create(names: &[&str]) -> Option<Self> {
        if let Some(why) = unavailable() {
            elastrec_common::skip::skip_test("NETNS", &why);
            return None;
        }
        let prefix = format!("er{}-", std::process::id());
        let mut net = Net {
            router: format!("{prefix}net"),
            prefix,
            hosts: Vec::new(),
            delay: None,
        };
        if let Err(why) = net.build(names) {
            // Drop removes what was made before the failure.
            drop(net);
            elastrec_common::skip::skip_test("NETNS", &format!("making test hosts: {why}"));
            return None;
        }
        Some(net)
    }

    fn build(&mut self, names: &[&str]) -> Result<(), String> {
        let r = self.router.clone();
        ip(&["netns", "add", &r])?;
        ip(&["-n", &r, "link", "set", "lo", "up"])?;
        // A router: forwards, and takes packets back from the delay line whatever
        // interface their source's route names.
        sysctl(&r, "net.ipv4.ip_forward", "1")?;
        sysctl(&r, "net.ipv4.conf.all.rp_filter", "0")?;
        sysctl(&r, "net.ipv4.conf.default.rp_filter", "0")?;
        for (i, name) in names.iter().enumerate() {
            let netns = format!("{}{name}", self.prefix);
            let addr = format!("10.200.{i}.2");
            let gateway = format!("10.200.{i}.1");
            let port = format!("r{i}");
            ip(&["netns", "add", &netns])?;
            self.hosts.push(Host {
                name: name.to_string(),
                netns: netns.clone(),
                addr: addr.clone(),
            });
            ip(&[
                "-n", &r, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                &netns,
            ])?;
            ip(&[
                "-n",
                &r,
                "addr",
                "add",
                &format!("{gateway}/24"),
                "dev",
                &port,
            ])?;
            ip(&["-n", &r, "link", "set", &port, "up"])?;
            ip(&["-n", &netns, "link", "set", "lo", "up"])?;
            ip(&[
                "-n",
                &netns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &netns, "link", "set", "eth0", "up"])?;
            // Every other host through the router; a node finds its own address as the
            // source of its route to a public address (no packet is sent).
            ip(&["-n", &netns, "route", "add", "default", "via", &gateway])?;
        }
        Ok(())
    }

    /// Holds every packet between two hosts for `one_way` (a round trip takes twice it)
    /// until [`Net::undelay`]. Only one delay at a time.
    pub fn delay(&mut self, one_way: Duration) {
        assert!(self.delay.is_none(), "a delay runs already");
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let router = self.router.clone();
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("netns-delay".into())
            .spawn(move || delay_line::run(&router, one_way, &flag, ready_tx))
            .unwrap();
        ready_rx
            .recv()
            .expect("the delay line started")
            .expect("the delay line made its devices");
        let r = &self.router;
        for dev in [delay_line::IN, delay_line::OUT] {
            ip(&["-n", r, "link", "set", dev, "up"]).unwrap();
        }
        sysctl(
            r,
            &format!("net.ipv4.conf.{}.rp_filter", delay_line::OUT),
            "0",
        )
        .unwrap();
        ip(&[
            "-n",
            r,
            "route",
            "add",
            "default",
            "dev",
            delay_line::IN,
            "table",
            "100",
        ])
        .unwrap();
        for i in 0..self.hosts.len() {
            ip(&[
                "-n",
                r,
                "rule",
                "add",
                "iif",
                &format!("r{i}"),
                "lookup",
                "100",
            ])
            .unwrap();
        }
        self.delay = Some((stop, thread));
    }

    /// Ends the delay: packets go straight through the router again.
    pub fn undelay(&mut self) {
        let Some((stop, thread)) = self.delay.take() else {
            return;
        };
        for i in 0..self.hosts.len() {
            let _ = ip(&[
                "-n",
                &self.router,
                "rule",
                "del",
                "iif",
                &format!("r{i}"),
                "lookup",
                "100",
            ]);
        }
        stop.store(true, Ordering::Release);
        let _ = thread.join();
    }

    /// The host `name`.
    pub fn host(&self, name: &str) -> &Host {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no test host {name}"))
    }

    /// The host whose address is `addr`.
    pub fn host_at(&self, addr: &str) -> Option<&Host> {
        self.hosts.iter().find(|h| h.addr == addr)
    }

    /// `program args` to run on host `name`.
    pub fn command(&self, name: &str, program: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.host(name).netns, program])
            .args(args);
        cmd
    }

    /// Loses what `from` sends `to`, on arrival at `to`; `to` still reaches `from` (an
    /// asymmetric partition) and every other host reaches both.
    pub fn cut(&self, from: &str, to: &str) {
        self.add_rule(to, &format!("ip saddr {} drop", self.host(from).addr));
    }

    /// Cuts `a` and `b` apart both ways.
    pub fn partition(&self, a: &str, b: &str) {
        self.cut(a, b);
        self.cut(b, a);
    }

    /// Loses `per_mille` of the packets arriving at every host, at random.
    pub fn lose(&self, per_mille: u32) {
        for h in &self.hosts {
            self.add_rule(
                &h.name,
                &format!("numgen random mod 1000 < {per_mille} drop"),
            );
        }
    }

    /// Ends every fault made on host `name` (what it was made to lose), if any.
    pub fn heal(&self, name: &str) {
        // Declared first, so that a host without faults has a table to delete.
        self.nft(
            name,
            "add table inet elastrec_fault\ndelete table inet elastrec_fault\n",
        );
    }

    /// Adds `rule` to the input filter of host `name`.
    fn add_rule(&self, name: &str, rule: &str) {
        self.nft(
            name,
            &format!(
                "table inet elastrec_fault {{\n  chain input {{\n    type filter hook input \
                 priority 0; policy accept;\n    {rule}\n  }}\n}}\n"
            ),
        );
    }

    /// Loads `rules` into host `name`'s nftables.
    fn nft(&self, name: &str, rules: &str) {
        let mut nft = self.command(name, "nft", &["-f", "-"]);
        let out = crate::common::output_with_stdin(&mut nft, rules.as_bytes()).expect("run nft");
        assert!(
            out.status.success(),
            "nft on {name}: {}\n{rules}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// How long a TCP connection from host `from` to `addr` (`ip:port`) takes to open:
    /// one round trip.
    pub fn connect_time(&self, from: &str, addr: &str) -> Duration {
        let netns = format!("/run/netns/{}", self.host(from).netns);
        let addr: std::net::SocketAddr = addr.parse().unwrap();
        std::thread::spawn(move || {
            use std::os::fd::AsRawFd;
            let ns = std::fs::File::open(&netns).unwrap();
            // SAFETY: setns(2) on an open namespace file; it moves this thread only.
            assert_eq!(
                unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) },
                0
            );
            let t0 = std::time::Instant::now();
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
            t0.elapsed()
        })
        .join()
        .unwrap()
    }

    /// Processes still running in any of this network's namespaces.
    pub fn processes(&self) -> Vec<i32> {
        self.hosts
            .iter()
            .flat_map(|h| {
                run("ip", &["netns", "pids", &h.netns])
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default()
                    .split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.undelay();
        for pid in self.processes() {
            // SAFETY: plain kill(2) of a process inside a namespace this test made.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        for h in &self.hosts {
            let _ = ip(&["netns", "del", &h.netns]);
        }
        let _ = ip(&["netns", "del", &self.router]);
    }
}
