//! A full run's progress, kept in `bench/full-run.json` after each
//! scenario, so that a run cut short (a session's end, a reboot) resumes
//! where it stopped instead of starting over: a full `--peers --big` run
//! takes about three hours. A run resumes only on the same code (nothing
//! but `docs/` and the progress file changed since the commit it started
//! on) and with the same flags; the report then says it ran in parts and
//! on which days. The file is removed when the run writes its figures.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use super::report::Results;

/// The progress file, beside the peers' workspace (it may be committed so
/// that a run survives a fresh machine).
const FILE: &str = "bench/full-run.json";

/// What a full run has measured so far.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct Progress {
    /// The full hash of the commit the run measures.
    commit: String,
    peers: bool,
    big: bool,
    /// The machine line of the run's first part.
    pub(super) machine: String,
    /// Each part's day, and the scenario it started with.
    parts: Vec<(String, String)>,
    /// The scenarios measured, in order.
    done: Vec<String>,
    results: Results,
    /// Whether this process has measured a scenario yet (its part is then
    /// in `parts`).
    #[serde(skip)]
    part_begun: bool,
    /// Where it is kept.
    #[serde(skip)]
    path: PathBuf,
}

impl Progress {
    /// The progress of the run these flags ask for: the one in the file,
    /// resumed, or a new one on `machine`. Refuses to mix figures of other
    /// code or other flags.
    pub(super) fn resume_or_start(peers: bool, big: bool, machine: &str) -> Result<Self> {
        let head = git(&["rev-parse", "HEAD"])?;
        let code = Code {
            head: &head,
            same_as: &same_code,
        };
        Self::kept_in(root().join(FILE), peers, big, machine, code)
    }

    /// [`Progress::resume_or_start`] with the progress file at `path`.
    fn kept_in(path: PathBuf, peers: bool, big: bool, machine: &str, code: Code) -> Result<Self> {
        let commit = code.head.to_owned();
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let Some(text) = text else {
            if !(code.same_as)("HEAD")? {
                bail!(
                    "the work tree has uncommitted changes outside docs/: commit them first, so \
                     that the run's figures name the code they measured"
                );
            }
            return Ok(Progress {
                commit,
                peers,
                big,
                machine: machine.to_owned(),
                parts: Vec::new(),
                done: Vec::new(),
                results: Results::default(),
                part_begun: false,
                path,
            });
        };
        let mut progress: Progress = serde_json::from_str(&text).with_context(|| {
            format!(
                "reading the progress of a cut-short run in {}; remove it to start the run over",
                path.display()
            )
        })?;
        if (progress.peers, progress.big) != (peers, big) {
            bail!(
                "{} holds a run with {}; resume it with the same flags, or remove the file to \
                 start over",
                path.display(),
                flags(progress.peers, progress.big)
            );
        }
        if !(code.same_as)(&progress.commit)? {
            bail!(
                "{} holds a run of commit {}, and the code has changed since (git diff {} -- . \
                 ':!docs'); check that commit out to resume it, or remove the file to start over",
                path.display(),
                short(&progress.commit),
                short(&progress.commit)
            );
        }
        progress.path = path;
        println!(
            "resuming the run of commit {} begun {}: {} scenarios measured ({})",
            short(&progress.commit),
            progress.parts.first().map_or("", |(day, _)| day.as_str()),
            progress.done.len(),
            progress.done.join(", ")
        );
        Ok(progress)
    }

    /// The figures of the earlier parts.
    pub(super) fn results(&self) -> Results {
        self.results.clone()
    }

    /// The index of this process's part of the run: how many parts
    /// measured something before it (0 for a run not resumed).
    pub(super) fn this_part(&self) -> usize {
        self.parts.len() - usize::from(self.part_begun)
    }

    /// Whether `scenario` was measured in an earlier part.
    pub(super) fn measured(&self, scenario: &str) -> bool {
        self.done.iter().any(|d| d == scenario)
    }

    /// Notes that `scenarios` are measured, with every figure so far in
    /// `results`, and saves the progress.
    pub(super) fn finished(&mut self, scenarios: &[&str], results: &Results) -> Result<()> {
        if let Some(first) = scenarios.first() {
            let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
            if !self.part_begun {
                self.parts.push((today, (*first).to_owned()));
                self.part_begun = true;
            }
        }
        self.done.extend(scenarios.iter().map(|s| (*s).to_owned()));
        self.results = results.clone();
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(&self.path, text).with_context(|| format!("writing {}", self.path.display()))
    }

    /// Which build and days the run measured, for the report.
    pub(super) fn provenance(&self) -> String {
        let days: Vec<&str> = self.parts.iter().map(|(day, _)| day.as_str()).collect();
        let when = match (days.first(), days.last()) {
            (Some(first), Some(last)) if first != last => format!("{first} to {last}"),
            (Some(first), _) => (*first).to_owned(),
            _ => chrono::Utc::now().format("%Y-%m-%d").to_string(),
        };
        let mut out = format!("{when}, commit {}", short(&self.commit));
        if self.parts.len() > 1 {
            let starts: Vec<String> = (self.parts.iter().skip(1))
                .map(|(day, scenario)| format!("from {scenario} on {day}"))
                .collect();
            out.push_str(&format!(
                ", in {} parts (the run was cut short and resumed on the same code: {})",
                self.parts.len(),
                starts.join("; ")
            ));
        }
        out
    }

    /// The run is written: its progress file goes.
    pub(super) fn remove(self) -> Result<()> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e).with_context(|| format!("removing {}", self.path.display())),
        }
    }
}

/// The code a run measures: the commit checked out, and whether the work
/// tree's code is a given commit's.
struct Code<'a> {
    head: &'a str,
    same_as: &'a dyn Fn(&str) -> Result<bool>,
}

/// Whether the work tree's code is `commit`'s: nothing but `docs/` and
/// the progress file differs.
fn same_code(commit: &str) -> Result<bool> {
    let status = std::process::Command::new("git")
        .args(["diff", "--quiet", commit, "--", "."])
        .args([":(exclude)docs", &format!(":(exclude){FILE}")])
        .current_dir(root())
        .status()
        .context("running git diff")?;
    Ok(status.success())
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn flags(peers: bool, big: bool) -> String {
    match (peers, big) {
        (false, false) => "no flags".into(),
        (true, false) => "--peers".into(),
        (false, true) => "--big".into(),
        (true, true) => "--peers --big".into(),
    }
}

fn short(commit: &str) -> &str {
    commit.get(..7).unwrap_or(commit)
}

fn git(args: &[&str]) -> Result<String> {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(root())
        .output()
        .context("running git")?;
    if !out.status.success() {
        bail!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run cut short after two scenarios resumes with their figures and
    /// skips them; the report names both parts; a run with other flags is
    /// refused rather than mixed in.
    #[test]
    fn a_cut_short_run_resumes_with_its_figures() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("full-run.json");
        let same = |_: &str| Ok(true);
        let code = || Code {
            head: "0123456789abcdef",
            same_as: &same,
        };
        let mut first = Progress::kept_in(path.clone(), true, false, "machine one", code())?;
        assert!(!first.measured("ceiling"));
        assert_eq!(first.this_part(), 0);
        let mut results = Results::default();
        results.add("ceiling", "pgbench", 100.0, "tps", "10 s");
        first.finished(&["ceiling"], &results)?;
        results.add("drain", "lease", f64::NAN, "jobs/s", "");
        first.finished(&["drain-lease"], &results)?;
        assert_eq!(
            first.this_part(),
            0,
            "still the first part once it measured"
        );
        drop(first);

        let err = Progress::kept_in(path.clone(), true, true, "machine two", code()).err();
        assert!(
            err.is_some_and(|e| e.to_string().contains("--peers")),
            "other flags are refused, naming the run's"
        );
        let changed = |_: &str| Ok(false);
        let other_code = Code {
            head: "fedcba9876543210",
            same_as: &changed,
        };
        let err = Progress::kept_in(path.clone(), true, false, "machine two", other_code).err();
        assert!(
            err.is_some_and(|e| e.to_string().contains("commit 0123456")),
            "changed code is refused, naming the run's commit"
        );

        let mut second = Progress::kept_in(path.clone(), true, false, "machine two", code())?;
        assert!(second.measured("ceiling") && second.measured("drain-lease"));
        assert!(!second.measured("wake"));
        assert_eq!(second.machine, "machine one", "the first part's machine");
        assert_eq!(
            second.this_part(),
            1,
            "the resumed process is the second part"
        );
        let mut resumed = second.results();
        resumed.begin_part(second.this_part());
        assert_eq!(resumed.get("pgbench"), Some(100.0));
        assert!(resumed.get("lease").is_some_and(f64::is_nan));
        resumed.add("wake", "p50", 0.5, "ms", "");
        second.finished(&["wake"], &resumed)?;
        assert_eq!(second.parts.len(), 2);
        assert_eq!(second.this_part(), 1);
        let kept = Progress::kept_in(path.clone(), true, false, "machine two", code())?.results();
        assert!(
            kept.across_parts("pgbench", "p50") && !kept.across_parts("pgbench", "lease"),
            "each figure keeps the part that measured it through the file"
        );
        assert!(second.provenance().contains("commit 0123456, in 2 parts"));
        assert!(second.provenance().contains("from wake on"));
        second.remove()?;
        assert!(!path.exists());
        Ok(())
    }
}
