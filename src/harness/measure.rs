//! What a harness run costs the process: CPU time and memory, read the same way by
//! every run (the head-to-head load, the probe at scale, the replay of a day).

pub use crate::exposition::process_cpu_time;

/// Resident set size now, in bytes (0 where `/proc` has none).
pub fn rss_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else { return 0 };
    let pages = statm.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64
}

/// The largest resident set size the process has had, in bytes (`VmHWM`), where `/proc`
/// says.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_grows_with_work_and_memory_is_seen() {
        let before = process_cpu_time();
        let mut x = 0u64;
        let until = std::time::Instant::now() + std::time::Duration::from_millis(30);
        while std::time::Instant::now() < until {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        assert!(process_cpu_time() > before, "{x}");
        assert!(rss_bytes() > 0);
        assert!(peak_rss_bytes().is_some_and(|peak| peak >= rss_bytes() / 2));
    }
}
