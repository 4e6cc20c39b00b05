//! Was the machine quiet? The foreign CPU load while a benchmark round ran.
//!
//! A ratio between two implementations means something only when nothing else used the
//! CPU while they ran: on a shared VM one busy neighbour turned a 1.20x into a 1.73x.
//! A [`LoadProbe`] reads, at the start and at the end of a round, the machine's busy time
//! (`/proc/stat`: user, nice, system, irq, softirq and steal, the time a hypervisor gave
//! our CPUs to someone else) and this process's own CPU time with that of the children it
//! has waited for (`/proc/self/stat`). What the machine spent beyond this process tree is
//! foreign load. A child still running at the end counts as foreign: wait for it first.
//!
//! Linux only; elsewhere [`LoadProbe::start`] returns `None` and a round cannot be judged.

use std::time::Instant;

/// `/proc` counts CPU time in clock ticks of `USER_HZ`, which Linux fixes at 100 per second
/// in its user-space interface on every architecture it ships for.
const TICKS_PER_S: f64 = 100.0;

/// Readings at the start of a round.
#[derive(Debug, Clone, Copy)]
pub struct LoadProbe {
    machine_busy: u64,
    own: u64,
    at: Instant,
}

/// CPU use over a round.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Load {
    /// Wall time of the round, seconds.
    pub wall_s: f64,
    /// CPU seconds the whole machine was busy (every core).
    pub machine_busy_s: f64,
    /// CPU seconds of this process and its waited-for children.
    pub own_s: f64,
    /// CPU seconds of everything else.
    pub foreign_s: f64,
    /// Cores of the machine.
    pub cores: usize,
}

impl Load {
    /// Foreign CPU as a share of what the machine could do over the round, 0..1.
    pub fn foreign_share(&self) -> f64 {
        let capacity = self.wall_s * self.cores.max(1) as f64;
        if capacity > 0.0 {
            (self.foreign_s / capacity).clamp(0.0, 1.0)
        } else {
            0.0
        }
    }

    /// True when foreign load stayed at or below `max_share` of the machine.
    pub fn is_quiet(&self, max_share: f64) -> bool {
        self.foreign_share() <= max_share
    }
}

impl LoadProbe {
    /// Takes the start readings (`None` where `/proc` cannot be read).
    pub fn start() -> Option<Self> {
        Some(Self {
            machine_busy: machine_busy_ticks()?,
            own: own_ticks()?,
            at: Instant::now(),
        })
    }

    /// The load since [`LoadProbe::start`].
    pub fn stop(&self) -> Option<Load> {
        let machine = machine_busy_ticks()?.saturating_sub(self.machine_busy);
        let own = own_ticks()?.saturating_sub(self.own);
        Some(Load {
            wall_s: self.at.elapsed().as_secs_f64(),
            machine_busy_s: machine as f64 / TICKS_PER_S,
            own_s: own as f64 / TICKS_PER_S,
            // Both counters tick on their own; a tick of difference is not load.
            foreign_s: machine.saturating_sub(own) as f64 / TICKS_PER_S,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        })
    }
}

/// Busy ticks of every CPU together, from the first line of `/proc/stat`.
fn machine_busy_ticks() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    parse_machine_busy(text.lines().next()?)
}

/// `cpu  user nice system idle iowait irq softirq steal guest guest_nice`: everything but
/// idle and iowait (guest time is already inside user and nice).
fn parse_machine_busy(line: &str) -> Option<u64> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = fields
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    if v.len() < 8 {
        return None;
    }
    Some(v[0] + v[1] + v[2] + v[5] + v[6] + v[7])
}

/// This process's user and system ticks, with those of its waited-for children.
fn own_ticks() -> Option<u64> {
    parse_own(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// Fields 14-17 of `/proc/PID/stat` (utime, stime, cutime, cstime). The command name in
/// field 2 may hold spaces and parentheses, so counting starts after its last `)`.
fn parse_own(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state), so field n is at index n - 3.
    let tick = |n: usize| f.get(n - 3)?.parse::<i64>().ok();
    let total = tick(14)? + tick(15)? + tick(16)? + tick(17)?;
    u64::try_from(total).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_lines_parse_into_busy_and_own_ticks() {
        let cpu = "cpu  100 5 50 9000 7 3 2 11 0 0";
        assert_eq!(parse_machine_busy(cpu), Some(100 + 5 + 50 + 3 + 2 + 11));
        assert_eq!(parse_machine_busy("cpu0 1 2 3 4 5 6 7 8"), None);
        assert_eq!(parse_machine_busy("cpu  1 2 3"), None);
        let stat = "42 (odd) name) S 1 42 42 0 -1 4194560 100 0 0 0 250 40 7 3 20 0 1 0";
        assert_eq!(parse_own(stat), Some(250 + 40 + 7 + 3));
    }

    fn spin_for(cpu: std::time::Duration) {
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed() < cpu {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }

    /// Work this process does is its own; a child it waited for is its own too; a child
    /// still running when the round ends is foreign. Other load on the machine only adds
    /// to the foreign side, so the bounds below hold on a busy machine too.
    #[test]
    fn own_work_and_waited_children_are_not_foreign_but_a_running_child_is() {
        let p = LoadProbe::start().expect("/proc is readable on Linux");
        // Spin until the probe counts 0.2 s of this process's CPU (on a busy machine a
        // wall-clock spin of 0.3 s got 0.15 s of it); every spin shows up as own time.
        let t = Instant::now();
        let l = loop {
            spin_for(std::time::Duration::from_millis(50));
            let l = p.stop().unwrap();
            if l.own_s >= 0.2 {
                break l;
            }
            assert!(t.elapsed().as_secs() < 60, "own work never counted: {l:?}");
        };
        assert!(l.machine_busy_s >= l.own_s - 0.02, "{l:?}");

        let spin = "while :; do :; done";
        let p = LoadProbe::start().unwrap();
        // `timeout` ends the spinning shell after 0.6 s and waits for it, so its time
        // reaches this process once `timeout` itself is waited for.
        let status = std::process::Command::new("timeout")
            .args(["0.6", "sh", "-c", spin])
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(124), "timeout ended the spin");
        let waited = p.stop().unwrap();
        assert!(
            waited.own_s >= 0.1,
            "a waited child is this process's own: {waited:?}"
        );

        let p = LoadProbe::start().unwrap();
        let mut child = std::process::Command::new("sh")
            .args(["-c", spin])
            .spawn()
            .unwrap();
        let t = Instant::now();
        // Poll (not sleep a guess): the child must have burnt CPU before the round ends.
        let mut running = None;
        while running.is_none() {
            let l = p.stop().unwrap();
            if l.foreign_s >= 0.1 {
                running = Some(l);
            }
            assert!(
                t.elapsed().as_secs() < 60,
                "the child never showed as load: {l:?}"
            );
            std::thread::yield_now();
        }
        let _ = child.kill();
        let _ = child.wait();
        let l = running.unwrap();
        assert!(l.foreign_share() > 0.0 && !l.is_quiet(0.0), "{l:?}");
    }
}
