//! The router's delay line: every packet the router forwards is routed into the TUN device
//! [`IN`], read here, held for the one-way delay, and written to the TUN device [`OUT`],
//! from which the router forwards it to its destination (packets arriving on `OUT` take
//! the main routing table, those from the hosts' ports the table that leads into `IN`).
//! A constant delay keeps the packets' order.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

/// The device packets enter the line by.
pub const IN: &str = "dl-in";
/// The device they leave it by.
pub const OUT: &str = "dl-out";

/// `TUNSETIFF` of `<linux/if_tun.h>`.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;

/// `struct ifreq` as TUNSETIFF reads it: a name and the flags, padded to its size.
#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// A TUN device named `name`, made in the calling thread's network namespace.
fn tun(name: &str) -> std::io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")?;
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: IFF_TUN | IFF_NO_PI,
        _pad: [0; 22],
    };
    for (d, s) in req.name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: TUNSETIFF reads an `ifreq` that lives across the call.
    if unsafe { libc::ioctl(f.as_raw_fd(), TUNSETIFF, &mut req) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(f)
}

/// Enters namespace `router`, makes the two devices (said on `ready`), then delays every
/// packet by `one_way` until `stop` is set.
pub fn run(router: &str, one_way: Duration, stop: &AtomicBool, ready: Sender<Result<(), String>>) {
    let made = (|| -> std::io::Result<(File, File)> {
        let ns = File::open(format!("/run/netns/{router}"))?;
        // SAFETY: setns(2) on an open namespace file; it moves this thread only.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok((tun(IN)?, tun(OUT)?))
    })();
    let (mut input, mut output) = match made {
        Ok(devices) => {
            let _ = ready.send(Ok(()));
            devices
        }
        Err(e) => {
            let _ = ready.send(Err(e.to_string()));
            return;
        }
    };
    let mut held: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    let mut buf = vec![0u8; 65_536];
    while !stop.load(Ordering::Acquire) {
        let now = Instant::now();
        while held.front().is_some_and(|(due, _)| *due <= now) {
            let (_, packet) = held.pop_front().unwrap();
            // A packet the router refuses is lost, as on a real line.
            let _ = output.write(&packet);
        }
        let wait = held.front().map_or(Duration::from_millis(50), |(due, _)| {
            due.saturating_duration_since(now)
        });
        let mut fds = libc::pollfd {
            fd: input.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = wait.as_micros().div_ceil(1000).min(50) as libc::c_int;
        // SAFETY: one pollfd that lives across the call.
        if unsafe { libc::poll(&mut fds, 1, ms) } > 0 && fds.revents & libc::POLLIN != 0 {
            if let Ok(n) = input.read(&mut buf) {
                held.push_back((Instant::now() + one_way, buf[..n].to_vec()));
            }
        }
    }
}
