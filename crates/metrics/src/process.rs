//! This process's own resource use, read from `/proc/self` (Linux). Every role reports it
//! in its heartbeat; the master turns the differences into CPU and memory profiles.

/// CPU time and resident memory of this process.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// User + system CPU time since the process started, seconds.
    pub cpu_s: f64,
    /// Resident set size now, bytes.
    pub rss_bytes: u64,
}

/// The current usage; zeros where `/proc` is not available (the profile then simply lacks
/// CPU and memory, training is not affected).
pub fn usage() -> Usage {
    let ticks = clock_ticks_per_s();
    let cpu_s = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| parse_stat_cpu_ticks(&s))
        .map_or(0.0, |t| t as f64 / ticks);
    let rss_bytes = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * page_size());
    Usage { cpu_s, rss_bytes }
}

/// The process's CPU time and memory on `/metrics` (`process_cpu_seconds_total`,
/// `process_resident_memory_bytes` under the role's prefix), read again at each render.
pub struct ProcessMetrics {
    cpu: prometheus_client::metrics::counter::Counter<f64, std::sync::atomic::AtomicU64>,
    rss: prometheus_client::metrics::gauge::Gauge,
    /// CPU seconds counted so far (the counter only goes up by differences).
    counted: std::sync::Mutex<f64>,
}

impl ProcessMetrics {
    /// Registers both in `registry`.
    pub fn register(registry: &mut prometheus_client::registry::Registry) -> Self {
        let m = Self {
            cpu: Default::default(),
            rss: Default::default(),
            counted: std::sync::Mutex::new(0.0),
        };
        registry.register(
            "process_cpu_seconds",
            "User and system CPU time of this process",
            m.cpu.clone(),
        );
        registry.register(
            "process_resident_memory_bytes",
            "Resident memory of this process",
            m.rss.clone(),
        );
        m
    }

    /// Reads `/proc/self` again.
    pub fn refresh(&self) {
        let u = usage();
        let mut counted = self.counted.lock().unwrap_or_else(|e| e.into_inner());
        if u.cpu_s > *counted {
            self.cpu.inc_by(u.cpu_s - *counted);
            *counted = u.cpu_s;
        }
        self.rss.set(i64::try_from(u.rss_bytes).unwrap_or(i64::MAX));
    }
}

fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// utime + stime (fields 14 and 15) of a `/proc/PID/stat` line. The command name (field
/// 2) is in parentheses and may hold spaces, so fields are counted after its closing one.
fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // `rest` starts at field 3 (state): utime is field 14, the 12th from here.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        let line = "4242 (a (weird) name) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0 100 0 0";
        assert_eq!(parse_stat_cpu_ticks(line), Some(300));
        assert_eq!(parse_stat_cpu_ticks("garbage"), None);
    }

    #[test]
    fn this_process_uses_memory_and_cpu() {
        // Busy for 100 ms of wall time: at least a few clock ticks of CPU time.
        let t0 = std::time::Instant::now();
        let mut x = 0u64;
        while t0.elapsed() < std::time::Duration::from_millis(100) {
            for i in 0..10_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
        }
        let u = usage();
        assert!(u.rss_bytes > 1 << 20, "{u:?}");
        assert!(u.cpu_s > 0.0, "{u:?}");
    }
}
