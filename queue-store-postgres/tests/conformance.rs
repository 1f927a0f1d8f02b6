//! The store conformance suite of `queue-core`, unchanged, against the
//! Postgres store in both execution modes, with the table's bookkeeping
//! columns, with a bookkeeping table carrying them, on a default table
//! partitioned by finish time, and on one laid out for claims in place;
//! each case in its own schema.

mod support;

mod lease {
    use super::support::PgHarness;
    use queue_store_postgres::ExecutionMode;

    queue_core::conformance_tests!(match PgHarness::connect(
        ExecutionMode::Lease,
        "conformance (lease)"
    )
    .await
    {
        Some(harness) => harness,
        None => return,
    });
}

mod transactional {
    use super::support::PgHarness;
    use queue_store_postgres::ExecutionMode;

    queue_core::conformance_tests!(match PgHarness::connect(
        ExecutionMode::Transactional,
        "conformance (transactional)"
    )
    .await
    {
        Some(harness) => harness,
        None => return,
    });
}

mod lease_with_a_bookkeeping_table {
    use super::support::PgHarness;
    use queue_store_postgres::ExecutionMode;

    queue_core::conformance_tests!(match PgHarness::with_bookkeeping_table(
        ExecutionMode::Lease,
        "conformance (lease, bookkeeping table)"
    )
    .await
    {
        Some(harness) => harness,
        None => return,
    });
}

mod transactional_with_a_bookkeeping_table {
    use super::support::PgHarness;
    use queue_store_postgres::ExecutionMode;

    queue_core::conformance_tests!(match PgHarness::with_bookkeeping_table(
        ExecutionMode::Transactional,
        "conformance (transactional, bookkeeping table)"
    )
    .await
    {
        Some(harness) => harness,
        None => return,
    });
}

mod lease_partitioned {
    use super::support::PgHarness;
    use queue_store_postgres::ExecutionMode;

    queue_core::conformance_tests!(match PgHarness::partitioned(
        ExecutionMode::Lease,
        "conformance (lease, partitioned)"
    )
    .await
    {
        Some(harness) => harness,
        None => return,
    });
}

mod transactional_partitioned {
    use super::support::PgHarness;
    use queue_store_postgres::ExecutionMode;

    queue_core::conformance_tests!(match PgHarness::partitioned(
        ExecutionMode::Transactional,
        "conformance (transactional, partitioned)"
    )
    .await
    {
        Some(harness) => harness,
        None => return,
    });
}

mod lease_in_place {
    use super::support::PgHarness;
    use queue_store_postgres::ExecutionMode;

    queue_core::conformance_tests!(match PgHarness::in_place(
        ExecutionMode::Lease,
        "conformance (lease, claims in place)"
    )
    .await
    {
        Some(harness) => harness,
        None => return,
    });
}

mod transactional_in_place {
    use super::support::PgHarness;
    use queue_store_postgres::ExecutionMode;

    queue_core::conformance_tests!(match PgHarness::in_place(
        ExecutionMode::Transactional,
        "conformance (transactional, claims in place)"
    )
    .await
    {
        Some(harness) => harness,
        None => return,
    });
}
