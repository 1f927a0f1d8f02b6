//! The config file's `[[schedules]]`: periodic jobs `queue serve` enqueues
//! (`queue_worker::Scheduler`, one job per occurrence however many
//! processes run the same schedules).

use std::sync::Arc;

use anyhow::{bail, Context as _, Result};
use queue_core::{CancellationToken, NewJob};
use queue_store_postgres::{CatchUpConfig, ScheduleConfig};
use queue_worker::{CatchUp, Schedule, Scheduler, SchedulerOptions, WorkerError};

use crate::serve::TextAdmin;

/// The schedules `configs` describe; refused with the schedule's name and
/// the problem (neither or both of `cron` and `every`, a zone or cron
/// expression that does not parse).
pub fn from_config(configs: &[ScheduleConfig]) -> Result<Vec<Schedule>> {
    configs.iter().map(schedule).collect()
}

fn schedule(config: &ScheduleConfig) -> Result<Schedule> {
    let name = &config.name;
    let mut job = NewJob::new(
        config.kind.clone(),
        config
            .payload
            .clone()
            .unwrap_or_else(|| serde_json::json!({})),
    );
    if let Some(priority) = config.priority {
        job = job.priority(priority);
    }
    let schedule = match (&config.cron, config.every) {
        (Some(cron), None) => cron_in_zone(name, cron, config.zone.as_deref(), job)?,
        (None, Some(every)) => {
            if config.zone.is_some() {
                bail!("schedules.{name}: zone applies to cron schedules only, not to every");
            }
            Schedule::every(name, every, job)?
        }
        (Some(_), Some(_)) => bail!("schedules.{name}: give either cron or every, not both"),
        (None, None) => bail!("schedules.{name}: give cron (an expression) or every (such as 5m)"),
    };
    Ok(schedule.catch_up(match config.catch_up {
        Some(CatchUpConfig::Once) => CatchUp::Once,
        Some(CatchUpConfig::Skip) | None => CatchUp::Skip,
    }))
}

/// `cron` in `zone`: UTC, a fixed offset (`+02:00`) or an IANA name.
fn cron_in_zone(name: &str, cron: &str, zone: Option<&str>, job: NewJob) -> Result<Schedule> {
    let schedule = match zone {
        None | Some("UTC" | "utc" | "Z") => Schedule::cron(name, cron, chrono::Utc, job),
        Some(zone) if zone.starts_with(['+', '-']) => {
            let offset: chrono::FixedOffset = zone.parse().with_context(|| {
                format!("schedules.{name}: zone {zone:?} is not an offset such as +02:00")
            })?;
            Schedule::cron(name, cron, offset, job)
        }
        Some(zone) => {
            let tz: chrono_tz::Tz = zone.parse().map_err(|_| {
                anyhow::anyhow!(
                    "schedules.{name}: zone {zone:?} is not UTC, an offset such as +02:00, or an IANA name such as Europe/Berlin"
                )
            })?;
            Schedule::cron(name, cron, tz, job)
        }
    };
    schedule.map_err(|e: WorkerError| anyhow::anyhow!("{e}"))
}

/// Runs `schedules` over `admin` until `shutdown`, logging what stops it.
pub fn spawn(
    admin: Arc<TextAdmin>,
    schedules: Vec<Schedule>,
    shutdown: CancellationToken,
) -> Result<Option<tokio::task::JoinHandle<()>>> {
    if schedules.is_empty() {
        return Ok(None);
    }
    let names: Vec<String> = schedules.iter().map(|s| s.name().to_owned()).collect();
    let scheduler = Scheduler::<TextAdmin>::new(admin, schedules, SchedulerOptions::default())?;
    tracing::info!(?names, "running the config's schedules");
    Ok(Some(tokio::spawn(async move {
        if let Err(error) = scheduler.run(shutdown).await {
            tracing::error!(%error, "the scheduler stopped");
        }
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<Schedule>> {
        let config = queue_store_postgres::PgConfig::parse("q.toml", text)?;
        from_config(&config.schedules)
    }

    #[test]
    fn schedules_come_from_the_config_file() {
        let schedules = parse(
            "[[schedules]]\nname = \"nightly\"\ncron = \"0 3 * * *\"\nzone = \"Europe/Berlin\"\nkind = \"report\"\ncatch_up = \"once\"\n\n\
             [[schedules]]\nname = \"sync\"\nevery = \"5m\"\nkind = \"sync\"\npayload = { full = true }\n\n\
             [[schedules]]\nname = \"offset\"\ncron = \"0 9 * * *\"\nzone = \"+02:00\"\nkind = \"k\"\n",
        )
        .expect("valid schedules");
        let names: Vec<&str> = schedules.iter().map(Schedule::name).collect();
        assert_eq!(names, ["nightly", "sync", "offset"]);
        let at = |s: &str| chrono::DateTime::parse_from_rfc3339(s).unwrap().to_utc();
        // 03:00 in Berlin in winter is 02:00 UTC.
        assert_eq!(
            schedules[0].next_after(at("2026-11-24T12:00:00Z")),
            Some(at("2026-11-25T02:00:00Z"))
        );
        assert_eq!(
            schedules[1].next_after(at("2026-11-24T12:01:00Z")),
            Some(at("2026-11-24T12:05:00Z"))
        );
        assert_eq!(
            schedules[2].next_after(at("2026-11-24T12:00:00Z")),
            Some(at("2026-11-25T07:00:00Z"))
        );
    }

    #[test]
    fn a_schedule_that_cannot_work_names_itself_and_the_problem() {
        let refused = |text: &str| parse(text).unwrap_err().to_string();
        let both = refused(
            "[[schedules]]\nname = \"x\"\ncron = \"* * * * *\"\nevery = \"1s\"\nkind = \"k\"\n",
        );
        assert!(
            both.contains("schedules.x: give either cron or every"),
            "{both}"
        );
        let neither = refused("[[schedules]]\nname = \"x\"\nkind = \"k\"\n");
        assert!(neither.contains("give cron"), "{neither}");
        let zone = refused("[[schedules]]\nname = \"x\"\ncron = \"* * * * *\"\nzone = \"Mars/Base\"\nkind = \"k\"\n");
        assert!(zone.contains("\"Mars/Base\" is not UTC"), "{zone}");
        let cron = refused("[[schedules]]\nname = \"x\"\ncron = \"61 * * * *\"\nkind = \"k\"\n");
        assert!(cron.contains("does not parse"), "{cron}");
    }
}
