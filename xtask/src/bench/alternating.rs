//! Figures compared across minutes on a machine whose speed drifts by a
//! fifth within them: measured in alternating rounds, medians. The ceiling
//! with both drains, the drain of due jobs alone and beside jobs scheduled
//! ahead, and the rotation the head-to-heads share ([`rotating`]).

use std::future::Future;

use anyhow::Result;
use sqlx::PgPool;

use super::cluster::pgbench;
use super::drain::{
    drain, StoreSetup, LEASE, LEASE_DELETING, TRANSACTIONAL, TRANSACTIONAL_IN_PLACE_DELETING,
};
use super::report::{list, median, rows, Results};
use super::Sizes;
use crate::pg::Postgres;

/// The ceiling and both drains at 16 handlers, one after the other for a
/// few rounds (one in a quick run), medians: the targets' ratios are taken
/// from these, so that the machine's drift hits the ceiling and the drains
/// alike. The transactional drain runs twice: on the default table, and
/// on the layout whose completion writes no index entry (claims in place,
/// completed jobs deleted), which shows what the completion's new row
/// version costs the mode against the ceiling.
pub(super) async fn ceiling_and_drains(
    pg: &Postgres,
    pool: &PgPool,
    sizes: &Sizes,
    results: &mut Results,
) -> Result<()> {
    let rounds = sizes.rounds;
    let drains = [
        (rows::ALTERNATING_LEASE, LEASE),
        (rows::ALTERNATING_TRANSACTIONAL, TRANSACTIONAL),
        (
            rows::ALTERNATING_TRANSACTIONAL_IN_PLACE_DELETING,
            TRANSACTIONAL_IN_PLACE_DELETING,
        ),
    ];
    let mut ceiling = Vec::new();
    let mut drained: [Vec<f64>; 3] = Default::default();
    for round in 1..=rounds {
        println!("alternating: round {round} of {rounds}");
        ceiling.push(pgbench(pg, sizes.pgbench_seconds).await?);
        for ((_, setup), figures) in drains.iter().zip(&mut drained) {
            figures.push(
                drain(pool, *setup, 16, sizes.drain_jobs)
                    .await?
                    .jobs_per_second,
            );
        }
    }
    results.add_median("alternate", rows::ALTERNATING_CEILING, "tps", &ceiling);
    for ((what, _), figures) in drains.iter().zip(&drained) {
        results.add_median("alternate", what, "jobs/s", figures);
    }
    Ok(())
}

/// The lease drain (16 handlers) of due jobs in a table of their own, and
/// behind `sizes.waiting_rows` jobs scheduled a day ahead (inserted before
/// them, so that they come first in key order), alternating for up to
/// three rounds, medians.
pub(super) async fn beside_scheduled(
    pool: &PgPool,
    sizes: &Sizes,
    results: &mut Results,
) -> Result<()> {
    let rounds = sizes.rounds.min(3);
    let beside = StoreSetup {
        scheduled_ahead: sizes.waiting_rows,
        ..LEASE
    };
    let (mut alone, mut behind) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        println!("due drains: round {round} of {rounds}");
        alone.push(
            drain(pool, LEASE, 16, sizes.drain_jobs)
                .await?
                .jobs_per_second,
        );
        behind.push(
            drain(pool, beside, 16, sizes.drain_jobs)
                .await?
                .jobs_per_second,
        );
    }
    results.add_median("scheduled", rows::DUE_ALONE, "jobs/s", &alone);
    results.add_median("scheduled", rows::DUE_BESIDE, "jobs/s", &behind);
    Ok(())
}

/// The drains at 16 handlers on the default table as released and on one
/// laid out for claims in place (`JobTable::in_place_claims`), lease
/// (keeping and deleting completed jobs) and transactional, in rotating
/// rounds; medians, and each layout's ratio to the released one.
pub(super) async fn in_place(pool: &PgPool, sizes: &Sizes, results: &mut Results) -> Result<()> {
    let setups = [
        ("lease drain (16)", LEASE),
        ("lease drain (16), completed jobs deleted", LEASE_DELETING),
        ("transactional drain (16)", TRANSACTIONAL),
    ];
    let figures: [Vec<f64>; 6] = rotating("claims in place", sizes.rounds, |which| {
        let (_, setup) = setups[which / 2];
        let setup = StoreSetup {
            in_place: which % 2 == 1,
            ..setup
        };
        async move {
            Ok(drain(pool, setup, 16, sizes.drain_jobs)
                .await?
                .jobs_per_second)
        }
    })
    .await?;
    for (n, (what, _)) in setups.iter().enumerate() {
        let (released, in_place) = (&figures[2 * n], &figures[2 * n + 1]);
        results.add_median(
            "in-place",
            &format!("{what}, the table as released"),
            "jobs/s",
            released,
        );
        results.add_median(
            "in-place",
            &format!("{what}, claims in place"),
            "jobs/s",
            in_place,
        );
        results.add(
            "in-place",
            format!("{what}, claims in place / as released"),
            median(in_place) / median(released),
            "x",
            format!(
                "medians of {} rotating rounds; as released {}, in place {}",
                released.len(),
                list(released),
                list(in_place)
            ),
        );
    }
    Ok(())
}

/// `N` measurements, `measure(which)` for `which` in `0..N`, in `rounds`
/// rounds, each round starting with the next of them so that none always
/// follows the same one (on two cores, the drain that followed
/// graphile_worker's in every round measured about a tenth slower than the
/// same drain elsewhere in the run); each one's figures, in round order.
pub(super) async fn rotating<const N: usize, F, Fut>(
    label: &str,
    rounds: usize,
    mut measure: F,
) -> Result<[Vec<f64>; N]>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<f64>>,
{
    let mut figures: [Vec<f64>; N] = std::array::from_fn(|_| Vec::new());
    for round in 1..=rounds {
        println!("{label}: round {round} of {rounds}");
        for turn in 0..N {
            let which = (round + turn) % N;
            figures[which].push(measure(which).await?);
        }
    }
    Ok(figures)
}
