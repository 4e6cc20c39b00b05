//! What a benchmark's numbers depend on: the CPU (model, vector extensions, cache), the
//! kernels the math libraries pick on it at run time, and the CPUs a process may run on
//! (its affinity, which child processes inherit).

use serde::Serialize;

/// Vector and matrix extensions that decide which kernels run (the x86-64 names of
/// `/proc/cpuinfo`); the others are left out of reports.
pub const SIMD_FLAGS: &[&str] = &[
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512cd",
    "avx512dq",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "sve",
    "sve2",
];

/// The CPU as `/proc/cpuinfo` and sysfs describe it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CpuInfo {
    /// `model name` (x86) or the implementer and part (`CPU implementer`, ARM).
    pub model: String,
    /// Logical CPUs the machine has.
    pub logical_cpus: usize,
    /// The [`SIMD_FLAGS`] this CPU has, in that order.
    pub simd: Vec<String>,
    /// Level-2 cache of CPU 0, KiB.
    pub l2_kib: Option<u64>,
    /// The GEMM kernel set the `gemm` crate dispatches to on this CPU.
    pub gemm_kernels: String,
}

impl CpuInfo {
    /// This machine's CPU (`None` where `/proc/cpuinfo` cannot be read).
    pub fn of_this_machine() -> Option<Self> {
        let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
        let l2 = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cache/index2/size").ok();
        Some(Self::parse(&text, l2.as_deref()))
    }

    /// From the text of `/proc/cpuinfo` and of sysfs's L2 `size` (`2048K`).
    pub fn parse(cpuinfo: &str, l2_size: Option<&str>) -> Self {
        let field = |name: &str| {
            cpuinfo.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == name).then(|| v.trim().to_string())
            })
        };
        let model = field("model name")
            .or_else(|| {
                let implementer = field("CPU implementer")?;
                Some(format!(
                    "implementer {implementer}, part {}",
                    field("CPU part").unwrap_or_default()
                ))
            })
            .unwrap_or_else(|| "unknown".into());
        let flags = field("flags")
            .or_else(|| field("Features"))
            .unwrap_or_default();
        let has: std::collections::HashSet<&str> = flags.split_whitespace().collect();
        let simd: Vec<String> = SIMD_FLAGS
            .iter()
            .filter(|f| has.contains(**f))
            .map(|f| f.to_string())
            .collect();
        let logical_cpus = cpuinfo
            .lines()
            .filter(|l| l.split(':').next().is_some_and(|k| k.trim() == "processor"))
            .count();
        let l2_kib = l2_size.and_then(|s| {
            let s = s.trim();
            let (digits, scale) = match s.strip_suffix('K') {
                Some(d) => (d, 1),
                None => match s.strip_suffix('M') {
                    Some(d) => (d, 1024),
                    None => (s, 1),
                },
            };
            digits.parse::<u64>().ok().map(|n| n * scale)
        });
        Self {
            model,
            logical_cpus,
            gemm_kernels: gemm_kernels(&has).to_string(),
            simd,
            l2_kib,
        }
    }
}

/// The kernel set the `gemm` crate picks at run time for these CPU flags: its x86-64-v4
/// kernels need every AVX-512 subset `pulp`'s V4 checks, its v3 kernels AVX2 and FMA.
fn gemm_kernels(has: &std::collections::HashSet<&str>) -> &'static str {
    let all = |names: &[&str]| names.iter().all(|n| has.contains(n));
    if all(&[
        "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx2", "fma",
    ]) {
        "AVX-512 (x86-64-v4)"
    } else if all(&["avx2", "fma"]) {
        "AVX2 + FMA (x86-64-v3)"
    } else if has.contains("asimd") {
        "NEON"
    } else {
        "scalar / SSE"
    }
}

/// The CPUs this process may run on (its affinity), in order.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set, and sched_getaffinity writes at
    // most its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Confines the calling thread, and every thread and process it starts from now on, to
/// `cpus` (call it before starting thread pools).
pub fn pin_to(cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: as in `allowed_cpus`; CPU_SET is given indices below CPU_SETSIZE only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            if c >= libc::CPU_SETSIZE as usize {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "CPU {c} is beyond the {} a CPU set holds",
                        libc::CPU_SETSIZE
                    ),
                ));
            }
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A CPU list as the kernel writes one (`0-3,6`): ranges and single CPUs.
pub fn parse_cpu_list(text: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("{part:?} is not a CPU or a range of CPUs (e.g. 0-3,6)");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if a > b {
                    return Err(bad());
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().map_err(|_| bad())?),
        }
    }
    if cpus.is_empty() {
        return Err("the CPU list is empty".into());
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// `cpus` as a kernel CPU list (`0-3,6`).
pub fn format_cpu_list(cpus: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let start = cpus[i];
        while i + 1 < cpus.len() && cpus[i + 1] == cpus[i] + 1 {
            i += 1;
        }
        parts.push(if cpus[i] == start {
            start.to_string()
        } else {
            format!("{start}-{}", cpus[i])
        });
        i += 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    const XEON: &str = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n\
        flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl \
        avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8\n\nprocessor\t: 1\n\
        model name\t: Intel(R) Xeon(R) Platinum 8480+\n";
    const EPYC: &str = "processor\t: 0\nmodel name\t: AMD EPYC 7B12\nflags\t\t: fpu sse4_2 avx \
        avx2 fma\n";

    #[test]
    fn the_cpu_model_its_vector_extensions_and_gemm_kernels_are_read_from_cpuinfo() {
        let xeon = CpuInfo::parse(XEON, Some("2048K\n"));
        assert_eq!(xeon.model, "Intel(R) Xeon(R) Platinum 8480+");
        assert_eq!(xeon.logical_cpus, 2);
        assert_eq!(xeon.l2_kib, Some(2048));
        assert!(xeon.simd.contains(&"amx_bf16".to_string()), "{xeon:?}");
        assert!(!xeon.simd.contains(&"fpu".to_string()), "{xeon:?}");
        assert_eq!(xeon.gemm_kernels, "AVX-512 (x86-64-v4)");
        let epyc = CpuInfo::parse(EPYC, Some("1M"));
        assert_eq!(epyc.gemm_kernels, "AVX2 + FMA (x86-64-v3)");
        assert_eq!(epyc.l2_kib, Some(1024));
        assert_eq!(epyc.simd, ["sse4_2", "avx", "avx2", "fma"]);
    }

    #[test]
    fn cpu_lists_read_and_write_as_the_kernel_writes_them() {
        assert_eq!(parse_cpu_list("0-3,6").unwrap(), [0, 1, 2, 3, 6]);
        assert_eq!(parse_cpu_list("5, 1,1").unwrap(), [1, 5]);
        assert_eq!(format_cpu_list(&[0, 1, 2, 3, 6, 8, 9]), "0-3,6,8-9");
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("a").unwrap_err().contains("\"a\""));
        assert!(parse_cpu_list("").is_err());
    }

    #[test]
    fn this_process_may_run_on_the_cpus_it_is_confined_to() {
        let allowed = allowed_cpus();
        assert!(!allowed.is_empty());
        // In a thread of its own: the affinity is the calling thread's.
        let first = allowed[0];
        let seen = std::thread::spawn(move || {
            pin_to(&[first]).unwrap();
            allowed_cpus()
        })
        .join()
        .unwrap();
        assert_eq!(seen, [first]);
        assert!(pin_to(&[usize::MAX]).is_err());
    }
}
