//! Fail points: named places where a test holds, slows or stops a process at a known
//! moment instead of racing it (a worker killed right after a push, a PS that never
//! answers its first checkpoint). Tests set them through the environment of the processes
//! they start, `ELASTREC_FAIL_<NAME>=...`.
//!
//! They exist only in builds with the `fail-points` feature, which `elastrec-cli`'s tests
//! turn on (a dev-dependency, so `cargo test` builds the binary with them and `cargo build`
//! without). Without it every lookup is a constant `None` and the compiler drops the code
//! behind it (every lookup is inlined, so not even a fail point's name is left): a
//! release binary reads no such variable.

/// Whether this build has fail points.
pub const ENABLED: bool = cfg!(feature = "fail-points");

/// The fail point's raw setting, when this build has fail points and it is set.
#[inline(always)]
pub fn value(name: &str) -> Option<String> {
    if ENABLED {
        std::env::var(name).ok()
    } else {
        None
    }
}

/// Whether the fail point is set (to anything).
#[inline(always)]
pub fn is_set(name: &str) -> bool {
    value(name).is_some()
}

/// A fail point set to one number (`ELASTREC_FAIL_SLOW_EXECUTOR=20`).
#[inline(always)]
pub fn number(name: &str) -> Option<u64> {
    if !ENABLED {
        return None;
    }
    value(name)?.trim().parse().ok()
}

/// A fail point set per node, `NODE:N` entries separated by commas (`*`: any node), for
/// node `node`: its first entry that names it. `5:250,*:20` gives node 5 250 and every
/// other node 20.
#[inline(always)]
pub fn for_node(name: &str, node: u32) -> Option<u64> {
    if !ENABLED {
        return None;
    }
    per_node(&value(name)?, node)
}

/// [`for_node`]'s reading of a setting.
pub fn per_node(spec: &str, node: u32) -> Option<u64> {
    spec.split(',').find_map(|entry| {
        let (who, n) = entry.trim().split_once(':')?;
        (who == "*" || who.parse::<u32>().ok()? == node)
            .then(|| n.parse::<u64>().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_list_applies_its_first_entry_naming_the_node() {
        assert_eq!(per_node("5:250,*:20", 5), Some(250));
        assert_eq!(per_node("5:250,*:20", 3), Some(20));
        assert_eq!(per_node("*:20,5:250", 5), Some(20));
        assert_eq!(per_node("5:250", 3), None);
        assert_eq!(per_node("x:1,4:7", 4), Some(7));
        assert_eq!(per_node("4:slow", 4), None);
        assert_eq!(per_node("nonsense", 5), None);
    }

    #[test]
    fn a_build_without_fail_points_reads_none() {
        // The variable is this process's own, set for this test alone.
        let name = "ELASTREC_FAIL_COMMON_UNIT_TEST";
        std::env::set_var(name, "7");
        assert_eq!(number(name), ENABLED.then_some(7));
        assert_eq!(is_set(name), ENABLED);
        std::env::remove_var(name);
    }
}
