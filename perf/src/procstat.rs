//! What `/proc` says about processes and the machine: CPU time (utime + stime), resident memory,
//! the load average and whether anything else busy is running.

use std::{path::Path, sync::OnceLock, time::Duration};

use anyhow::Context as _;

/// Clock ticks per second of `/proc/PID/stat` times (`getconf CLK_TCK`; 100 on Linux x86).
pub fn clock_ticks_per_second() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .and_then(|text| text.trim().parse().ok())
            .filter(|ticks| *ticks > 0)
            .unwrap_or(100)
    })
}

/// User plus system CPU time a process has used so far, all its threads together.
pub fn cpu_time(pid: u32) -> anyhow::Result<Duration> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    // The command name (field 2) is in parentheses and may hold spaces; fields 14 and 15 (utime,
    // stime) are the 12th and 13th after the closing parenthesis.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .with_context(|| format!("{path} has no command name"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> anyhow::Result<u64> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .with_context(|| format!("{path} field {} is not a number", i + 3))
    };
    let ticks = field(11)? + field(12)?;
    Ok(Duration::from_micros(
        ticks * 1_000_000 / clock_ticks_per_second(),
    ))
}

/// The summed CPU time of several processes.
pub fn total_cpu_time(pids: &[u32]) -> anyhow::Result<Duration> {
    pids.iter().map(|pid| cpu_time(*pid)).sum()
}

/// Resident memory of a process in KiB (`VmRSS`).
pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    status_number(pid, "VmRSS")
}

/// The number of threads of a process (`Threads`).
pub fn threads(pid: u32) -> anyhow::Result<u64> {
    status_number(pid, "Threads")
}

/// The number in the field `name` of `/proc/PID/status` (a unit such as `kB` left out).
fn status_number(pid: u32, name: &str) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("{path} has no {name}"))
}

/// The number of file descriptors a process holds open (entries of `/proc/PID/fd`), sockets
/// included.
pub fn open_fds(pid: u32) -> anyhow::Result<usize> {
    let path = format!("/proc/{pid}/fd");
    Ok(std::fs::read_dir(&path)
        .with_context(|| format!("reading {path}"))?
        .count())
}

/// A process and its descendants (through `/proc/PID/task/*/children`), parents first.
pub fn process_tree(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut next = 0;
    while next < all.len() {
        let parent = all[next];
        next += 1;
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let Ok(children) = std::fs::read_to_string(task.path().join("children")) else {
                continue;
            };
            all.extend(children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
        }
    }
    all
}

/// `(busy, total)` jiffies of all CPUs together since boot, from `/proc/stat`: busy is user +
/// nice + system + irq + softirq + steal, total adds idle and iowait. `(0, 0)` if unreadable.
pub fn machine_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let get = |i: usize| fields.get(i).copied().unwrap_or(0);
    let busy = get(0) + get(1) + get(2) + get(5) + get(6) + get(7);
    (busy, busy + get(3) + get(4))
}

/// The machine's CPU busy share (0–1, all CPUs together) over the next `over` (sleeps).
pub fn machine_busy(over: Duration) -> f64 {
    let (busy0, total0) = machine_jiffies();
    std::thread::sleep(over);
    let (busy1, total1) = machine_jiffies();
    if total1 > total0 {
        (busy1 - busy0) as f64 / (total1 - total0) as f64
    } else {
        0.0
    }
}

/// The 1-, 5- and 15-minute load averages.
pub fn load_average() -> anyhow::Result<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").context("reading /proc/loadavg")?;
    let mut fields = text.split_whitespace().map(str::parse::<f64>);
    let mut next = || -> anyhow::Result<f64> {
        fields
            .next()
            .context("/proc/loadavg is too short")?
            .context("/proc/loadavg is not numeric")
    };
    Ok([next()?, next()?, next()?])
}

/// The running processes whose command name (`/proc/PID/comm`) is one of `names`, as
/// `(pid, name)`.
pub fn processes_named(names: &[&str]) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("comm")).ok()?;
            let comm = comm.trim();
            names.contains(&comm).then(|| (pid, comm.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_cpu_time_memory_and_a_tree() {
        let me = std::process::id();
        let before = cpu_time(me).unwrap_or_default();
        let mut x = 0u64;
        for i in 0..50_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        assert!(x > 0);
        assert!(cpu_time(me).unwrap_or_default() >= before);
        assert!(rss_kib(me).unwrap_or(0) > 0);
        assert!(threads(me).unwrap_or(0) >= 1);
        // stdin, stdout and stderr at least.
        assert!(open_fds(me).unwrap_or(0) >= 3);
        assert_eq!(process_tree(me).first(), Some(&me));
        assert!(load_average().is_ok());
    }
}
