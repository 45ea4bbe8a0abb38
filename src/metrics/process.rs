//! The process's own figures, as Prometheus' client libraries export them under `process_*`:
//! CPU seconds, resident and virtual memory, threads, open and allowed file descriptors, start
//! time.
//!
//! Read from `/proc/self` on Linux at every scrape; elsewhere there are none. `prometheus-client`
//! has no process collector, and the crates that do (`metrics-process`) bring the `metrics`
//! facade and `procfs` for a handful of numbers in two files.

/// One reading of the process's figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Figures {
    /// User and system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Resident memory, in bytes.
    pub resident_bytes: u64,
    /// Virtual memory, in bytes.
    pub virtual_bytes: u64,
    /// Threads of the process.
    pub threads: u64,
    /// File descriptors open now.
    pub open_fds: u64,
    /// The soft limit on open file descriptors.
    pub max_fds: Option<u64>,
    /// When the process started, in seconds since the Unix epoch.
    pub start_time_seconds: f64,
}

/// The process's figures now, or `None` where `/proc` cannot tell.
#[cfg(target_os = "linux")]
pub(crate) fn read() -> Option<Figures> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let boot = std::fs::read_to_string("/proc/stat").ok()?;
    let limits = std::fs::read_to_string("/proc/self/limits").ok();
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    // SAFETY: sysconf only reads a configuration value; it takes no pointers.
    let (ticks, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let (ticks, page) = (u64::try_from(ticks).ok()?, u64::try_from(page).ok()?);
    parse(&stat, &boot, limits.as_deref(), open_fds, ticks, page)
}

/// The process's figures now, or `None` where `/proc` cannot tell.
#[cfg(not(target_os = "linux"))]
pub(crate) fn read() -> Option<Figures> {
    None
}

/// Figures from the texts of `/proc/self/stat`, `/proc/stat` and `/proc/self/limits`, with the
/// count of open descriptors, clock ticks per second and the page size.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn parse(
    stat: &str,
    boot: &str,
    limits: Option<&str>,
    open_fds: u64,
    ticks: u64,
    page: u64,
) -> Option<Figures> {
    if ticks == 0 {
        return None;
    }
    // The command name (field 2) is in parentheses and may hold spaces or parentheses itself;
    // fields are counted from the last closing one, where field 3 (the state) starts.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |number: usize| -> Option<u64> { fields.get(number - 3)?.parse().ok() };
    let (utime, stime) = (field(14)?, field(15)?);
    let boot_time: u64 = boot
        .lines()
        .find_map(|line| line.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    let max_fds = limits.and_then(|text| {
        let line = text.lines().find(|l| l.starts_with("Max open files"))?;
        line["Max open files".len()..]
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    });
    Some(Figures {
        cpu_seconds: (utime + stime) as f64 / ticks as f64,
        resident_bytes: field(24)? * page,
        virtual_bytes: field(23)?,
        threads: field(20)?,
        open_fds,
        max_fds,
        start_time_seconds: boot_time as f64 + field(22)? as f64 / ticks as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (nsq (dedupe) x) S 1 4242 4242 0 -1 4194560 1500 0 0 0 \
                        250 50 0 0 20 0 7 0 123456 104857600 2560 18446744073709551615";
    const BOOT: &str = "cpu  1 2 3\nintr 5\nbtime 1700000000\nprocesses 9\n";
    const LIMITS: &str = "Limit                     Soft Limit           Hard Limit           Units\n\
                          Max open files            1024                 524288               files\n";

    #[test]
    fn reads_the_fields_after_a_name_with_spaces_and_parentheses() {
        let figures = parse(STAT, BOOT, Some(LIMITS), 12, 100, 4096).unwrap();
        assert_eq!(
            figures,
            Figures {
                cpu_seconds: 3.0,
                resident_bytes: 2560 * 4096,
                virtual_bytes: 104_857_600,
                threads: 7,
                open_fds: 12,
                max_fds: Some(1024),
                start_time_seconds: 1_700_000_000.0 + 1234.56,
            }
        );
    }

    #[test]
    fn a_damaged_text_gives_none_not_a_panic() {
        assert_eq!(parse("4242 (x) S 1", BOOT, None, 1, 100, 4096), None);
        assert_eq!(parse("no parenthesis", BOOT, None, 1, 100, 4096), None);
        assert_eq!(parse(STAT, "cpu 1\n", None, 1, 100, 4096), None);
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(
            parse(STAT, BOOT, Some(unlimited), 1, 100, 4096)
                .unwrap()
                .max_fds,
            None
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn reads_this_process() {
        let figures = read().expect("/proc/self is readable");
        assert!(figures.resident_bytes > 0 && figures.threads >= 1 && figures.open_fds >= 3);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            figures.start_time_seconds <= now + 1.0 && figures.start_time_seconds > now - 86_400.0
        );
    }
}
