//! The figures of a run and how they are shown: the results as each
//! scenario adds them, the headline table (the answer first), every row,
//! the ratios against their targets, and the section of
//! `docs/benchmarks.md` a full run rewrites.

use std::borrow::Cow;
use std::fmt::Write as _;

use anyhow::{Context, Result};

/// One line of the results table (kept in a run's progress file between
/// its parts, [`super::progress`]).
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct Row {
    section: String,
    what: String,
    /// A figure that is not a number (a ratio of nothing) is kept as null.
    #[serde(with = "number_or_null")]
    value: f64,
    unit: String,
    note: String,
    /// `(at least, at most)`, for a figure that carries its own target
    /// into the table of ratios.
    target: Option<(Option<f64>, Option<f64>)>,
    /// The part of a full run that measured it (0 for the first, and for
    /// a run in one part; [`super::progress`]).
    #[serde(default)]
    part: usize,
}

/// Every figure of a run, in the order measured.
#[derive(Default, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct Results {
    rows: Vec<Row>,
    /// The part the figures added now belong to.
    #[serde(skip)]
    part: usize,
}

impl Results {
    /// Adds a figure (and prints it, so a long run shows progress).
    pub(super) fn add(
        &mut self,
        section: &'static str,
        what: impl Into<String>,
        value: f64,
        unit: &'static str,
        note: impl Into<String>,
    ) {
        let row = Row {
            section: section.to_owned(),
            what: what.into(),
            value,
            unit: unit.to_owned(),
            note: note.into(),
            target: None,
            part: self.part,
        };
        println!(
            "  {:<11} {:<48} {:>12} {:<6} {}",
            row.section,
            row.what,
            figure(row.value),
            row.unit,
            row.note
        );
        self.rows.push(row);
    }

    /// Adds a figure with its own `target` (`(at least, at most)`), which
    /// the table of ratios then lists.
    pub(super) fn add_against(
        &mut self,
        section: &'static str,
        what: impl Into<String>,
        value: f64,
        unit: &'static str,
        note: impl Into<String>,
        target: (Option<f64>, Option<f64>),
    ) {
        self.add(section, what, value, unit, note);
        if let Some(row) = self.rows.last_mut() {
            row.target = Some(target);
        }
    }

    /// A row with the median of rounds' figures, listing them all.
    pub(super) fn add_median(
        &mut self,
        section: &'static str,
        what: &str,
        unit: &'static str,
        values: &[f64],
    ) {
        self.add(
            section,
            what,
            median(values),
            unit,
            format!("median of {}: {}", values.len(), list(values)),
        );
    }

    /// The figures added from now on were measured in `part` of a run
    /// resumed after it was cut short (the first is 0).
    pub(super) fn begin_part(&mut self, part: usize) {
        self.part = part;
    }

    pub(super) fn get(&self, what: &str) -> Option<f64> {
        self.rows.iter().find(|r| r.what == what).map(|r| r.value)
    }

    /// Whether figures `a` and `b` were measured in different parts of a
    /// run (possibly on machines of different speeds).
    pub(super) fn across_parts(&self, a: &str, b: &str) -> bool {
        let part = |what: &str| self.rows.iter().find(|r| r.what == what).map(|r| r.part);
        matches!((part(a), part(b)), (Some(x), Some(y)) if x != y)
    }

    /// Whether the figures come from more than one part of a run.
    fn in_parts(&self) -> bool {
        self.rows.iter().any(|r| r.part != 0)
    }

    /// What the machine's pgbench ceiling was at the start of each part:
    /// the run's ceiling for the part it was measured in, and each
    /// resumed part's own calibration.
    fn ceilings_by_part(&self) -> Vec<(usize, f64)> {
        let mut out: Vec<(usize, f64)> = (self.rows.iter())
            .filter(|r| r.what == rows::CEILING || r.what == rows::PART_CEILING)
            .map(|r| (r.part, r.value))
            .collect();
        out.sort_by_key(|(part, _)| *part);
        out.dedup_by_key(|(part, _)| *part);
        out
    }

    /// The first and the last figure of a section.
    fn first_and_last(&self, section: &str) -> Option<(f64, f64)> {
        let first = self.rows.iter().find(|r| r.section == section)?;
        let last = self.rows.iter().rfind(|r| r.section == section)?;
        Some((first.value, last.value))
    }

    fn ratio(&self, a: &str, b: &str) -> Option<f64> {
        Some(self.get(a)? / self.get(b)?)
    }
}

/// JSON has no NaN or infinity: such a figure is written as null and read
/// back as NaN.
mod number_or_null {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(value: &f64, s: S) -> Result<S::Ok, S::Error> {
        if value.is_finite() {
            s.serialize_f64(*value)
        } else {
            s.serialize_none()
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
    }
}

/// A figure with two decimals below 10 (latencies of a fraction of a
/// millisecond), one above.
fn figure(value: f64) -> String {
    if value.abs() < 10.0 {
        format!("{value:.2}")
    } else {
        format!("{value:.1}")
    }
}

/// Figures as a comma-separated list, rounded to whole units.
pub(super) fn list(values: &[f64]) -> String {
    values
        .iter()
        .map(|x| format!("{x:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

/// A ratio the report states (or a figure with a target of its own), with
/// its target.
struct Ratio {
    name: Cow<'static, str>,
    value: Option<f64>,
    /// `(at least, at most)`.
    target: (Option<f64>, Option<f64>),
    /// `×` for a ratio, else the figure's unit.
    unit: &'static str,
    /// Whether it divides figures measured in different parts of the run.
    across_parts: bool,
}

impl Ratio {
    fn target_text(&self) -> String {
        match self.target {
            (Some(min), None) => format!("≥ {min}{}", self.unit),
            (None, Some(max)) => format!("≤ {max}{}", self.unit),
            _ => String::new(),
        }
    }

    fn verdict(&self) -> &'static str {
        match (self.value, self.target) {
            (Some(v), (Some(min), _)) if v < min => "missed",
            (Some(v), (_, Some(max))) if v > max => "missed",
            (Some(_), (None, None)) | (None, _) => "",
            _ => "met",
        }
    }
}

/// The names of the rows the ratios and the headline read.
pub(super) mod rows {
    pub const CEILING: &str = "pgbench single-row UPDATE, 8 clients";
    /// The same, measured again at the start of each resumed part of a
    /// full run, so that the report can say how fast each part's machine
    /// was.
    pub const PART_CEILING: &str =
        "pgbench single-row UPDATE, 8 clients, at the start of a resumed part";
    pub const BOOKKEEPING_LEASE: &str =
        "lease drain, 16 handlers, table as it is (bookkeeping table), alternating";
    pub const CHANGED_LEASE: &str =
        "lease drain, 16 handlers, same table with the columns added, alternating";
    pub const BOOKKEEPING_TRANSACTIONAL: &str =
        "transactional drain, 16 handlers, table as it is (bookkeeping table), alternating";
    pub const CHANGED_TRANSACTIONAL: &str =
        "transactional drain, 16 handlers, same table with the columns added, alternating";
    pub const LEASE_16: &str = "lease, 16 handlers";
    pub const TRANSACTIONAL_16: &str = "transactional, 16 handlers";
    /// The lease drain with `CompletedJobs::Delete`: what graphile_worker
    /// does with a completed job.
    pub const LEASE_DELETING_16: &str = "lease, 16 handlers, completed jobs deleted";
    pub const LEASE_PLAIN_BESIDE_TLS: &str = "lease, 16 handlers, plain, alternating with TLS";
    pub const LEASE_TLS: &str = "lease, 16 handlers, over TLS (sslmode=require), alternating";
    pub const ALTERNATING_CEILING: &str = "pgbench ceiling, alternating with the drains";
    pub const ALTERNATING_LEASE: &str = "lease drain, 16 handlers, alternating with the ceiling";
    pub const ALTERNATING_TRANSACTIONAL: &str =
        "transactional drain, 16 handlers, alternating with the ceiling";
    /// The same on the table laid out for claims in place, completed jobs
    /// deleted: a completion that writes no new row version.
    pub const ALTERNATING_TRANSACTIONAL_IN_PLACE_DELETING: &str =
        "transactional drain, 16 handlers, claims in place, completed jobs deleted, alternating with the ceiling";
    pub const DUE_ALONE: &str = "lease drain, 16 handlers, alone (alternating)";
    pub const DUE_BESIDE: &str =
        "lease drain, 16 handlers, beside jobs scheduled a day ahead (alternating)";
    pub const CLAIM_NONE_WAITING: &str = "claim p50, no job waiting for its time";
    pub const CLAIM_SCHEDULED: &str = "claim p50 beside jobs scheduled a day ahead";
    pub const CLAIM_RETRYING: &str = "claim p50 beside failed jobs waiting an hour to retry";
    pub const WAKE_P50: &str = "enqueue commit to handler start, p50";
    pub const WAKE_P99: &str = "enqueue commit to handler start, p99";
    pub const SPARSE_WAKE_P50: &str = "jobs 1.5 s apart: enqueue commit to handler start, p50";
    pub const SPARSE_WAKE_MAX: &str = "jobs 1.5 s apart: enqueue commit to handler start, max";
    pub const DUE_P50: &str = "scheduled 2 s ahead: due time to handler start, p50";
    pub const DUE_MAX: &str = "scheduled 2 s ahead: due time to handler start, max";
    pub const MEMORY_PER_JOB: &str = "RSS per in-flight job";
    pub const ENQUEUE_BATCH: &str = "batch inserts (5,000 per statement)";
    pub const ENQUEUE_UNIQUE_BATCH: &str = "unique jobs, batches of 5,000";
    pub const ENQUEUE_DIRECT_16: &str = "single inserts, 16 connections";
    pub const ENQUEUE_HTTP: &str = "over HTTP (queue serve), 16 keep-alive clients";
    pub const VERSUS_OURS: &str = "lease drain, 16 handlers, alternating with graphile_worker";
    pub const VERSUS_DELETING: &str =
        "lease drain, 16 handlers, completed jobs deleted, alternating with graphile_worker";
    pub const VERSUS_IN_PLACE: &str =
        "lease drain, 16 handlers, claims in place, alternating with graphile_worker";
    pub const VERSUS_IN_PLACE_DELETING: &str =
        "lease drain, 16 handlers, claims in place, completed jobs deleted, alternating with graphile_worker";
    pub const VERSUS_PEER: &str = "graphile_worker drain, 16 handlers, alternating";
    pub const PEER_WAKE_P50: &str = "graphile_worker: wake p50";
    pub const PEER_WAKE_P99: &str = "graphile_worker: wake p99";
    /// awa's fastest drain of those its peer run tries.
    pub const AWA_BEST_DRAIN: &str = "awa: best drain";
    pub const AWA_WAKE_P99: &str = "awa: wake p99";

    /// The cold drain of `jobs` jobs, ours.
    pub fn cold_ours(jobs: usize) -> String {
        format!("cold lease drain, 16 handlers, {jobs} jobs")
    }

    /// This queue's cold drain of `jobs` jobs on the table laid out for
    /// claims in place, completed jobs deleted (like graphile_worker).
    pub fn cold_ours_in_place_deleting(jobs: usize) -> String {
        format!(
            "cold lease drain, 16 handlers, claims in place, completed jobs deleted, {jobs} jobs"
        )
    }

    /// The cold drain of `jobs` jobs, graphile_worker's at its best.
    pub fn cold_peer(jobs: usize) -> String {
        format!("graphile_worker cold drain at its best, 16 handlers, {jobs} jobs")
    }

    /// The cold drain of `jobs` jobs, graphile_worker's as a user meets it.
    pub fn cold_peer_as_met(jobs: usize) -> String {
        format!("graphile_worker cold drain as met, 16 handlers, {jobs} jobs")
    }
}

fn ratios(results: &Results, cold_sizes: &[usize]) -> Vec<Ratio> {
    use rows::*;
    let r = |name: &'static str, value, target| Ratio {
        name: name.into(),
        value,
        target,
        unit: "×",
        across_parts: false,
    };
    // Figure `a` ÷ figure `b`.
    let q = |name: &str, a: &str, b: &str, target| Ratio {
        name: name.to_owned().into(),
        value: results.ratio(a, b),
        target,
        unit: "×",
        across_parts: results.across_parts(a, b),
    };
    let mut out = vec![
        Ratio {
            name: "a job scheduled 2 s ahead, from its due time to its start, at most".into(),
            value: results.get(DUE_MAX),
            target: (None, Some(50.0)),
            unit: " ms",
            across_parts: false,
        },
        q(
            "lease drain (16) ÷ pgbench ceiling, alternating runs (medians)",
            ALTERNATING_LEASE,
            ALTERNATING_CEILING,
            (Some(2.0), None),
        ),
        q(
            "transactional drain (16) ÷ pgbench ceiling, alternating runs (medians)",
            ALTERNATING_TRANSACTIONAL,
            ALTERNATING_CEILING,
            (Some(0.8), None),
        ),
        q(
            "transactional drain (16), claims in place, completed jobs deleted ÷ pgbench ceiling, alternating runs (medians)",
            ALTERNATING_TRANSACTIONAL_IN_PLACE_DELETING,
            ALTERNATING_CEILING,
            (None, None),
        ),
        q(
            "lease drain of a table as it is ÷ the same table with the columns added (medians)",
            BOOKKEEPING_LEASE,
            CHANGED_LEASE,
            (Some(0.7), None),
        ),
        q(
            "transactional drain of a table as it is ÷ the same table with the columns added (medians)",
            BOOKKEEPING_TRANSACTIONAL,
            CHANGED_TRANSACTIONAL,
            (Some(0.8), None),
        ),
        q(
            "lease drain (16) over TLS ÷ the same in plain text, alternating runs (medians)",
            LEASE_TLS,
            LEASE_PLAIN_BESIDE_TLS,
            (Some(0.9), None),
        ),
        q(
            "lease drain (16) ÷ pgbench ceiling, single runs",
            LEASE_16,
            CEILING,
            (None, None),
        ),
        q(
            "transactional drain (16) ÷ pgbench ceiling, single runs",
            TRANSACTIONAL_16,
            CEILING,
            (None, None),
        ),
        r(
            "claim p50, largest table of finished jobs ÷ empty table",
            results
                .first_and_last("growth")
                .map(|(first, last)| last / first),
            (None, Some(1.2)),
        ),
        q(
            "claim p50 beside jobs scheduled ahead ÷ none waiting",
            CLAIM_SCHEDULED,
            CLAIM_NONE_WAITING,
            (None, Some(1.2)),
        ),
        q(
            "claim p50 beside failed jobs waiting to retry ÷ none waiting",
            CLAIM_RETRYING,
            CLAIM_NONE_WAITING,
            (None, Some(1.2)),
        ),
        q(
            "drain of due jobs beside jobs scheduled ahead ÷ alone, alternating runs (medians)",
            DUE_BESIDE,
            DUE_ALONE,
            (Some(0.8), None),
        ),
        q(
            "enqueue over HTTP ÷ single inserts on 16 connections",
            ENQUEUE_HTTP,
            ENQUEUE_DIRECT_16,
            (Some(0.8), None),
        ),
        q(
            "lease drain (16) ÷ graphile_worker drain (16), alternating runs (medians)",
            VERSUS_OURS,
            VERSUS_PEER,
            (Some(2.3), None),
        ),
        q(
            "wake-up p50 ÷ graphile_worker's",
            WAKE_P50,
            PEER_WAKE_P50,
            (None, Some(1.0)),
        ),
        Ratio {
            name: "wake-up p99".into(),
            value: results.get(WAKE_P99),
            target: (None, Some(1.0)),
            unit: " ms",
            across_parts: false,
        },
        q(
            "lease drain (16) ÷ awa's best drain, single runs",
            LEASE_16,
            AWA_BEST_DRAIN,
            (Some(1.5), None),
        ),
        q(
            "wake-up p99 ÷ awa's",
            WAKE_P99,
            AWA_WAKE_P99,
            (None, Some(1.0)),
        ),
        q(
            "lease drain (16), completed jobs deleted ÷ graphile_worker drain (16), alternating runs (medians)",
            VERSUS_DELETING,
            VERSUS_PEER,
            (None, None),
        ),
        q(
            "lease drain (16), claims in place ÷ graphile_worker drain (16), alternating runs (medians)",
            VERSUS_IN_PLACE,
            VERSUS_PEER,
            (None, None),
        ),
        q(
            "lease drain (16), claims in place, completed jobs deleted ÷ graphile_worker drain (16), \
             alternating runs (medians)",
            VERSUS_IN_PLACE_DELETING,
            VERSUS_PEER,
            // Like for like: graphile_worker deletes the jobs it completes,
            // and this is this queue's fastest setup doing the same.
            (Some(2.3), None),
        ),
    ];
    for &jobs in cold_sizes {
        let jobs_text = super::cluster::thousands(jobs as u64);
        out.push(q(
            &format!("cold lease drain ÷ graphile_worker cold drain, {jobs_text} jobs (medians)"),
            &cold_ours(jobs),
            &cold_peer(jobs),
            (Some(2.0), None),
        ));
        // Like for like: graphile_worker deletes the jobs it completes.
        out.push(q(
            &format!(
                "cold lease drain, claims in place, completed jobs deleted ÷ graphile_worker cold \
                 drain, {jobs_text} jobs (medians)"
            ),
            &cold_ours_in_place_deleting(jobs),
            &cold_peer(jobs),
            (Some(2.0), None),
        ));
    }
    for peer in ["graphile_worker", "sqlxmq", "apalis", "awa"] {
        let setup = if peer == "awa" {
            ", its adapter's setup"
        } else {
            ""
        };
        out.push(q(
            &format!("lease drain (16) ÷ {peer} drain (16{setup}), single runs"),
            LEASE_16,
            &format!("{peer}: drain, 16 handlers"),
            (None, None),
        ));
    }
    // The figures that carry their own targets (the pressure scenarios).
    for row in &results.rows {
        if let Some(target) = row.target {
            out.push(Ratio {
                name: row.what.clone().into(),
                value: Some(row.value),
                target,
                unit: match row.unit.as_str() {
                    "x" => "×",
                    "ms" => " ms",
                    "s" => " s",
                    _ => "",
                },
                across_parts: false,
            });
        }
    }
    out
}

/// Which build and day a run measured.
pub(super) fn provenance() -> String {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".into());
    let dirty = std::process::Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .is_some_and(|o| !o.stdout.is_empty());
    format!(
        "{}, commit {commit}{}",
        chrono::Utc::now().format("%Y-%m-%d"),
        if dirty {
            " with uncommitted changes"
        } else {
            ""
        }
    )
}

/// The headline: the figures a reader comes for, each against what it is
/// compared with in the same run.
fn headline(results: &Results, cold_sizes: &[usize]) -> String {
    use rows::*;
    let mut out =
        String::from("| measure | this queue | compared with | ratio |\n|---|---:|---|---:|\n");
    // Figure `ours` against figure `theirs` (named `name`), if measured.
    let mut line = |what: &str, ours: &str, unit: &str, other: Option<(&str, &str)>| {
        let Some(value) = results.get(ours) else {
            return;
        };
        let (against, ratio) =
            match other.and_then(|(name, row)| Some((name, row, results.get(row)?))) {
                Some((name, row, theirs)) => (
                    format!("{name}: {} {unit}", figure(theirs)),
                    format!(
                        "{:.2}×{}",
                        value / theirs,
                        mark(results.across_parts(ours, row))
                    ),
                ),
                None => (String::new(), String::new()),
            };
        let _ = writeln!(
            out,
            "| {what} | {} {unit} | {against} | {ratio} |",
            figure(value)
        );
    };
    line(
        "lease drain, 16 handlers (alternating medians)",
        ALTERNATING_LEASE,
        "jobs/s",
        Some(("pgbench ceiling (tps)", ALTERNATING_CEILING)),
    );
    line(
        "transactional drain, 16 handlers (alternating medians)",
        ALTERNATING_TRANSACTIONAL,
        "jobs/s",
        Some(("pgbench ceiling (tps)", ALTERNATING_CEILING)),
    );
    line(
        "lease drain, 16 handlers, prepared (alternating medians)",
        VERSUS_OURS,
        "jobs/s",
        Some(("graphile_worker", VERSUS_PEER)),
    );
    line(
        "the same, claims in place, completed jobs deleted (like graphile_worker)",
        VERSUS_IN_PLACE_DELETING,
        "jobs/s",
        Some(("graphile_worker", VERSUS_PEER)),
    );
    for &jobs in cold_sizes {
        line(
            &format!("cold lease drain of {jobs} jobs (medians)"),
            &cold_ours(jobs),
            "jobs/s",
            Some(("graphile_worker cold, at its best", &cold_peer(jobs))),
        );
        line(
            &format!(
                "the same, claims in place, completed jobs deleted (like graphile_worker), \
                 {jobs} jobs"
            ),
            &cold_ours_in_place_deleting(jobs),
            "jobs/s",
            Some(("graphile_worker cold, at its best", &cold_peer(jobs))),
        );
    }
    for (what, ours, theirs) in [
        ("wake-up, enqueue to start, p50", WAKE_P50, PEER_WAKE_P50),
        ("wake-up, enqueue to start, p99", WAKE_P99, PEER_WAKE_P99),
    ] {
        line(what, ours, "ms", Some(("graphile_worker", theirs)));
    }
    line(
        "lease drain, 16 handlers (single run)",
        LEASE_16,
        "jobs/s",
        Some(("awa, its best setup", AWA_BEST_DRAIN)),
    );
    line(
        "wake-up, enqueue to start, p99",
        WAKE_P99,
        "ms",
        Some(("awa", AWA_WAKE_P99)),
    );
    line(
        "wake-up of jobs 1.5 s apart, enqueue to start, p50",
        SPARSE_WAKE_P50,
        "ms",
        Some(("jobs 20 ms apart", WAKE_P50)),
    );
    line(
        "a job scheduled 2 s ahead: due time to start, p50",
        DUE_P50,
        "ms",
        None,
    );
    line(
        "claim p50 beside jobs scheduled ahead",
        CLAIM_SCHEDULED,
        "ms",
        Some(("none waiting", CLAIM_NONE_WAITING)),
    );
    line(
        "claim p50 beside failed jobs waiting to retry",
        CLAIM_RETRYING,
        "ms",
        Some(("none waiting", CLAIM_NONE_WAITING)),
    );
    line(
        "drain of due jobs beside jobs scheduled ahead",
        DUE_BESIDE,
        "jobs/s",
        Some(("alone", DUE_ALONE)),
    );
    line(
        "batch enqueue, unique keys",
        ENQUEUE_UNIQUE_BATCH,
        "jobs/s",
        Some(("plain", ENQUEUE_BATCH)),
    );
    line("memory per in-flight job", MEMORY_PER_JOB, "KB", None);
    out
}

/// The whole report: headline, every row, ratios; `provenance` says which
/// build and day (taken when the run started).
pub(super) fn report(
    provenance: &str,
    machine: &str,
    results: &Results,
    quick: bool,
    cold_sizes: &[usize],
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Measured {provenance}.\n\n{machine}");
    if quick {
        let _ = writeln!(out, "(quick run: tiny sizes, figures are not comparable)");
    }
    let _ = writeln!(out, "\n{}", headline(results, cold_sizes));
    let _ = writeln!(
        out,
        "| ratio or figure | value | target | |\n|---|---:|---|---|"
    );
    for ratio in ratios(results, cold_sizes) {
        if let Some(v) = ratio.value {
            let _ = writeln!(
                out,
                "| {} | {v:.2}{}{} | {} | {} |",
                ratio.name,
                ratio.unit,
                mark(ratio.across_parts),
                ratio.target_text(),
                ratio.verdict()
            );
        }
    }
    if results.in_parts() {
        let _ = writeln!(out, "\n{}", parts_footnote(results));
    }
    let _ = writeln!(
        out,
        "\nEvery figure:\n\n| section | measurement | value | unit | notes |\n|---|---|---:|---|---|"
    );
    for r in &results.rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            r.section,
            r.what,
            figure(r.value),
            r.unit,
            r.note
        );
    }
    out
}

/// The mark of a ratio whose figures come from different parts of a run.
fn mark(across_parts: bool) -> &'static str {
    if across_parts {
        " †"
    } else {
        ""
    }
}

/// What a † in the tables means: the figures of that ratio were measured
/// in different parts of the run, and how fast the machine was at the
/// start of each part.
fn parts_footnote(results: &Results) -> String {
    let ceilings: Vec<String> = (results.ceilings_by_part().into_iter())
        .map(|(part, tps)| format!("part {}: {} tps", part + 1, figure(tps)))
        .collect();
    let speeds = if ceilings.is_empty() {
        String::new()
    } else {
        format!(
            " The pgbench ceiling at the start of each part: {}.",
            ceilings.join(", ")
        )
    };
    format!(
        "† divides figures measured in different parts of the run, which may have run on \
         machines of different speeds: compare it with care.{speeds}"
    )
}

const BEGIN: &str = "<!-- figures: written by cargo xtask bench; edit the text around them -->";
const END: &str = "<!-- end of figures -->";

/// The share of the recorded run's pgbench ceiling below which a full
/// run's machine is too slow to replace the record: the figures in
/// `docs/benchmarks.md` are floors in absolute units, and a slow day
/// lowers every one of them (pgbench on these machines has read from
/// about 4,000 to 16,000 tps).
const FIT_FOR_THE_RECORD: f64 = 0.9;

fn record_path() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/benchmarks.md")
}

/// The pgbench ceiling of the run recorded in `doc`: the slowest of its
/// parts' (its own ceiling and each resumed part's calibration), read
/// from the figures between the markers.
fn recorded_ceiling(doc: &str) -> Option<f64> {
    let (_, rest) = doc.split_once(BEGIN)?;
    let (figures, _) = rest.split_once(END)?;
    (figures.lines())
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            match cells.as_slice() {
                ["", "ceiling", what, value, "tps", ..] if *what == rows::CEILING => {
                    value.parse().ok()
                }
                ["", "calibration", what, value, "tps", ..] if *what == rows::PART_CEILING => {
                    value.parse().ok()
                }
                _ => None,
            }
        })
        .reduce(f64::min)
}

/// Whether a full run whose machine measured `results`' ceilings is as
/// fast as the one recorded in `doc` (within [`FIT_FOR_THE_RECORD`]):
/// `Err` says how much slower it is. A document without a recorded
/// ceiling, or a run without one yet, sets no bar.
fn fit_for(doc: &str, results: &Results) -> std::result::Result<(), String> {
    let recorded = recorded_ceiling(doc);
    let slowest = (results.ceilings_by_part().into_iter())
        .map(|(_, tps)| tps)
        .reduce(f64::min);
    match (slowest, recorded) {
        (Some(now), Some(then)) if now < FIT_FOR_THE_RECORD * then => Err(format!(
            "this machine measures a pgbench ceiling of {} tps, {:.0} % of the {} tps of the run \
             recorded in docs/benchmarks.md (at least {:.0} % keeps the record comparable): \
             its figures would lower the floors there",
            figure(now),
            100.0 * now / then,
            figure(then),
            100.0 * FIT_FOR_THE_RECORD
        )),
        _ => Ok(()),
    }
}

/// Stops a full run on a machine slower than the recorded run's, as soon
/// as its ceiling says so, unless `slow_day` asks to run anyway (its
/// figures then go beside the record, [`write_doc`]).
pub(super) fn refuse_a_slow_day(results: &Results, slow_day: bool) -> Result<()> {
    let path = record_path();
    let doc =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    match fit_for(&doc, results) {
        Ok(()) => Ok(()),
        Err(why) if slow_day => {
            println!("{why}; running anyway (--slow-day): the figures will go beside the record");
            Ok(())
        }
        Err(why) => anyhow::bail!(
            "{why}. Run it on a faster day, or pass --slow-day to run anyway and write its \
             figures to docs/benchmarks-<day>.md instead (a run in progress resumes where it \
             stopped either way)"
        ),
    }
}

/// Puts `report` between the markers of `docs/benchmarks.md`, keeping the
/// text around them; or, when the run's machine was slower than the
/// recorded run's ([`fit_for`]), into a document of its own beside it
/// (`docs/benchmarks-<day>.md`), so that the record keeps its floors.
pub(super) fn write_doc(report: &str, results: &Results, day: &str) -> Result<()> {
    write_doc_at(&record_path(), report, results, day)
}

/// [`write_doc`] with the record at `path`.
fn write_doc_at(path: &std::path::Path, report: &str, results: &Results, day: &str) -> Result<()> {
    let doc =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    if let Err(why) = fit_for(&doc, results) {
        let beside = beside_the_record(path, day);
        let text = format!(
            "# A full run slower than the record\n\n\
             `cargo xtask bench` wrote these figures here and not into \
             [docs/benchmarks.md](benchmarks.md): {why}.\n\n{report}"
        );
        std::fs::write(&beside, text).with_context(|| format!("writing {}", beside.display()))?;
        println!(
            "{why}: written to {} (the record is unchanged)",
            beside.display()
        );
        return Ok(());
    }
    let (before, rest) = doc.split_once(BEGIN).with_context(|| {
        format!(
            "{} has no line {BEGIN:?} to put the figures after",
            path.display()
        )
    })?;
    let (_, after) = rest
        .split_once(END)
        .with_context(|| format!("{} has no line {END:?} after the figures", path.display()))?;
    std::fs::write(path, format!("{before}{BEGIN}\n\n{report}\n{END}{after}"))
        .with_context(|| format!("writing {}", path.display()))?;
    println!("written to {}", path.display());
    Ok(())
}

/// `docs/benchmarks-<day>.md` beside `record`, or with `-2`, `-3`.. when
/// a run of that day is there already.
fn beside_the_record(record: &std::path::Path, day: &str) -> std::path::PathBuf {
    let dir = record.parent().unwrap_or(std::path::Path::new("."));
    (1..)
        .map(|n| match n {
            1 => dir.join(format!("benchmarks-{day}.md")),
            n => dir.join(format!("benchmarks-{day}-{n}.md")),
        })
        .find(|path| !path.exists())
        .unwrap_or_else(|| dir.join(format!("benchmarks-{day}.md")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run in two parts: the first measured the ceiling, the drain and
    /// this queue's wake-up, the second (resumed on a slower machine) its
    /// own ceiling and graphile_worker's wake-up.
    fn two_parts() -> Results {
        let mut results = Results::default();
        results.add("ceiling", rows::CEILING, 10_000.0, "tps", "");
        results.add("drain", rows::LEASE_16, 40_000.0, "jobs/s", "");
        results.add("wake", rows::WAKE_P50, 0.4, "ms", "");
        results.begin_part(1);
        results.add("calibration", rows::PART_CEILING, 7_000.0, "tps", "");
        results.add("peers", rows::PEER_WAKE_P50, 0.5, "ms", "");
        results
    }

    /// A ratio whose two figures came from different parts is marked, in
    /// the headline and in the table of ratios, and the footnote gives
    /// each part's ceiling; a ratio within one part is not marked.
    #[test]
    fn ratios_across_the_parts_of_a_run_are_marked_with_each_parts_speed() {
        let report = report("today", "machine", &two_parts(), false, &[]);
        assert!(
            report.contains("| wake-up p50 ÷ graphile_worker's | 0.80× † | ≤ 1× | met |"),
            "{report}"
        );
        assert!(
            report.contains(
                "| wake-up, enqueue to start, p50 | 0.40 ms | graphile_worker: 0.50 ms | 0.80× † |"
            ),
            "{report}"
        );
        assert!(
            report.contains("| lease drain (16) ÷ pgbench ceiling, single runs | 4.00× |  |  |"),
            "{report}"
        );
        assert!(
            report.contains(
                "The pgbench ceiling at the start of each part: part 1: 10000.0 tps, part 2: 7000.0 tps."
            ),
            "{report}"
        );
    }

    /// A run in one part has no marks and no footnote.
    #[test]
    fn a_run_in_one_part_marks_nothing() {
        let mut results = two_parts();
        for row in &mut results.rows {
            row.part = 0;
        }
        let report = report("today", "machine", &results, false, &[]);
        assert!(!report.contains('†'), "{report}");
        assert!(
            report.contains("| wake-up p50 ÷ graphile_worker's | 0.80× | ≤ 1× | met |"),
            "{report}"
        );
    }

    /// A document holding `results`' report between the markers, as a
    /// full run writes it.
    fn recorded(results: &Results) -> String {
        let report = report("today", "machine", results, false, &[]);
        format!("# Benchmarks\n\n{BEGIN}\n\n{report}\n{END}\n\nText after.\n")
    }

    fn one_part(ceiling: f64) -> Results {
        let mut results = Results::default();
        results.add("ceiling", rows::CEILING, ceiling, "tps", "10 s");
        results.add("drain", rows::LEASE_16, 40_000.0, "jobs/s", "");
        results
    }

    /// The record's ceiling is read back from the table of every figure
    /// the program wrote, and is the slowest of its parts'.
    #[test]
    fn the_recorded_ceiling_is_read_from_the_figures_the_run_wrote() {
        assert_eq!(
            recorded_ceiling(&recorded(&one_part(10_395.6))),
            Some(10_395.6)
        );
        assert_eq!(recorded_ceiling(&recorded(&two_parts())), Some(7_000.0));
        // Outside the markers a ceiling is only text.
        let outside = format!("| ceiling | {} | 99.0 | tps | |\n", rows::CEILING);
        assert_eq!(recorded_ceiling(&outside), None);
    }

    /// A run on a machine below 90 % of the recorded run's ceiling is not
    /// fit for the record, and says by how much; one as fast (or faster),
    /// one without a record to compare with, or one whose ceiling is not
    /// measured yet, is.
    #[test]
    fn a_run_slower_than_the_record_is_told_apart_by_its_ceiling() {
        let record = recorded(&one_part(10_000.0));
        let why = fit_for(&record, &one_part(8_000.0)).unwrap_err();
        assert!(why.contains("8000.0 tps, 80 % of the 10000.0 tps"), "{why}");
        // A resumed part on a slow day makes the whole run slow.
        let why = fit_for(&record, &two_parts()).unwrap_err();
        assert!(why.contains("7000.0 tps, 70 %"), "{why}");
        assert_eq!(fit_for(&record, &one_part(9_500.0)), Ok(()));
        assert_eq!(fit_for(&record, &one_part(16_000.0)), Ok(()));
        assert_eq!(fit_for("# Benchmarks\n", &one_part(4_000.0)), Ok(()));
        assert_eq!(fit_for(&record, &Results::default()), Ok(()));
    }

    /// A slow run's document goes beside the record without replacing an
    /// earlier one of the same day.
    #[test]
    fn a_slow_runs_document_goes_beside_the_record_under_a_free_name() {
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join("benchmarks.md");
        let first = beside_the_record(&record, "2026-12-03");
        assert_eq!(first, dir.path().join("benchmarks-2026-12-03.md"));
        std::fs::write(&first, "an earlier run").unwrap();
        assert_eq!(
            beside_the_record(&record, "2026-12-03"),
            dir.path().join("benchmarks-2026-12-03-2.md")
        );
    }

    /// A run as fast as the record's replaces the figures between the
    /// markers and keeps the text around them; a slower one leaves the
    /// record as it was and writes its report, with the reason, beside it.
    #[test]
    fn a_full_run_replaces_the_record_only_when_as_fast_as_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("benchmarks.md");
        let record = recorded(&one_part(10_000.0));
        std::fs::write(&path, &record).unwrap();

        let slow = one_part(6_000.0);
        let slow_report = report("slow day", "machine", &slow, false, &[]);
        write_doc_at(&path, &slow_report, &slow, "2026-12-03").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), record);
        let beside = std::fs::read_to_string(dir.path().join("benchmarks-2026-12-03.md")).unwrap();
        assert!(
            beside.contains("6000.0 tps, 60 % of the 10000.0 tps"),
            "{beside}"
        );
        assert!(beside.contains(&slow_report), "{beside}");

        let fast = one_part(11_000.0);
        let fast_report = report("fast day", "machine", &fast, false, &[]);
        write_doc_at(&path, &fast_report, &fast, "2026-12-04").unwrap();
        let written = std::fs::read_to_string(&path).unwrap();
        assert!(written.contains(&fast_report), "{written}");
        assert!(!written.contains("Measured today"), "{written}");
        assert!(written.starts_with("# Benchmarks\n\n") && written.ends_with("Text after.\n"));
        assert_eq!(recorded_ceiling(&written), Some(11_000.0));
        assert!(!dir.path().join("benchmarks-2026-12-04.md").exists());
    }
}
