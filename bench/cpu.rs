//! CPU time per job from `/proc`, shared by `cargo xtask bench` and the
//! peers it measures (`bench/peers`), so that both report it alike: this
//! process (the worker), Postgres (every process named `postgres` on this
//! machine, with the backends that exited meanwhile), and the rest of the
//! machine (mostly the kernel's network work for the loopback, which no
//! process is charged for).

/// CPU time per job, in µs: the worker, Postgres, and the rest of the
/// machine; for the worker and Postgres also the part spent in the kernel
/// on their behalf (system calls: sockets, WAL writes and flushes).
pub struct CpuPerJob {
    pub worker_us: f64,
    pub worker_kernel_us: f64,
    pub postgres_us: f64,
    pub postgres_kernel_us: f64,
    pub rest_us: f64,
}

impl std::fmt::Display for CpuPerJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CPU/job: worker {:.0} µs ({:.0} in the kernel), Postgres {:.0} µs ({:.0} in the kernel), \
             rest of machine {:.0} µs",
            self.worker_us,
            self.worker_kernel_us,
            self.postgres_us,
            self.postgres_kernel_us,
            self.rest_us
        )
    }
}

/// User and kernel CPU ticks.
#[derive(Clone, Copy, Default)]
struct Ticks {
    user: u64,
    kernel: u64,
}

impl Ticks {
    fn total(self) -> u64 {
        self.user + self.kernel
    }

    fn since(self, earlier: Ticks) -> Ticks {
        Ticks {
            user: self.user.saturating_sub(earlier.user),
            kernel: self.kernel.saturating_sub(earlier.kernel),
        }
    }
}

/// Busy CPU ticks of the whole machine, of this process and of Postgres.
#[derive(Clone, Copy)]
pub struct CpuSample {
    machine: u64,
    this_process: Ticks,
    postgres: Ticks,
}

/// One process's line of `/proc/<pid>/stat`: its command name, its parent,
/// its own ticks and those of its children it has waited for.
struct ProcessStat {
    command: String,
    parent: u32,
    own: Ticks,
    children: Ticks,
}

fn process_stat(path: &std::path::Path) -> Option<ProcessStat> {
    let line = std::fs::read_to_string(path).ok()?;
    let (head, rest) = line.rsplit_once(')')?;
    let command = head.split_once('(')?.1.to_owned();
    // Fields after the parenthesised command name: state is the 3rd of the
    // whole line, ppid the 4th, utime, stime, cutime and cstime the 14th to
    // the 17th.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(ProcessStat {
        command,
        parent: u32::try_from(field(4)?).ok()?,
        own: Ticks {
            user: field(14)?,
            kernel: field(15)?,
        },
        children: Ticks {
            user: field(16)?,
            kernel: field(17)?,
        },
    })
}

/// Every `postgres` process's ticks, and for each postmaster (a `postgres`
/// whose parent is not one) those of the backends it has reaped, so that a
/// connection that closed between two samples still counts.
fn postgres_ticks() -> Option<Ticks> {
    let mut processes = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(stat) = process_stat(&entry.path().join("stat")) {
            processes.insert(pid, stat);
        }
    }
    let mut ticks = Ticks::default();
    for stat in processes.values().filter(|s| s.command == "postgres") {
        ticks.user += stat.own.user;
        ticks.kernel += stat.own.kernel;
        let parent_is_postgres = processes
            .get(&stat.parent)
            .is_some_and(|p| p.command == "postgres");
        if !parent_is_postgres {
            ticks.user += stat.children.user;
            ticks.kernel += stat.children.kernel;
        }
    }
    Some(ticks)
}

impl CpuSample {
    /// `None` where `/proc` is not Linux's.
    pub fn now() -> Option<CpuSample> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let cpu: Vec<u64> = stat
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .filter_map(|v| v.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal ...
        let busy = cpu.iter().sum::<u64>() - cpu.get(3)? - cpu.get(4)?;
        let own = process_stat(std::path::Path::new("/proc/self/stat"))?;
        Some(CpuSample {
            machine: busy,
            this_process: own.own,
            postgres: postgres_ticks()?,
        })
    }

    /// Per job from `start` (a sample taken before `jobs` ran) until now;
    /// `None` where `/proc` is not Linux's.
    pub fn per_job_since(start: Option<CpuSample>, jobs: usize) -> Option<CpuPerJob> {
        Some(start?.per_job(CpuSample::now()?, jobs))
    }

    /// Per job between `self` and `later`, in µs (USER_HZ is 100 on Linux).
    fn per_job(self, later: CpuSample, jobs: usize) -> CpuPerJob {
        let us = |ticks: u64| ticks as f64 * 10_000.0 / jobs as f64;
        let worker = later.this_process.since(self.this_process);
        let postgres = later.postgres.since(self.postgres);
        let machine = later.machine.saturating_sub(self.machine);
        CpuPerJob {
            worker_us: us(worker.total()),
            worker_kernel_us: us(worker.kernel),
            postgres_us: us(postgres.total()),
            postgres_kernel_us: us(postgres.kernel),
            rest_us: us(machine
                .saturating_sub(worker.total())
                .saturating_sub(postgres.total())),
        }
    }
}
