//! CPU time per job from `/proc`, shared by `cargo xtask bench` and the
//! peers it measures (`bench/peers`), so that both report it alike: this
//! process (the worker) and the rest of the machine (Postgres, mostly).

/// CPU time per job: this process (the worker) and the rest of the machine
/// (Postgres, mostly), from `/proc`.
pub struct CpuPerJob {
    pub worker_us: f64,
    pub rest_us: f64,
}

impl std::fmt::Display for CpuPerJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CPU/job: worker {:.0} µs, rest of machine {:.0} µs",
            self.worker_us, self.rest_us
        )
    }
}

/// Busy CPU ticks of the whole machine and of this process.
#[derive(Clone, Copy)]
pub struct CpuSample {
    machine: u64,
    this_process: u64,
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
        let own = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the parenthesised command name; utime and stime are
        // the 14th and 15th of the whole line.
        let rest = own.rsplit_once(')')?.1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let utime: u64 = fields.get(11)?.parse().ok()?;
        let stime: u64 = fields.get(12)?.parse().ok()?;
        Some(CpuSample {
            machine: busy,
            this_process: utime + stime,
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
        let worker = later.this_process.saturating_sub(self.this_process);
        let machine = later.machine.saturating_sub(self.machine);
        CpuPerJob {
            worker_us: us(worker),
            rest_us: us(machine.saturating_sub(worker)),
        }
    }
}
