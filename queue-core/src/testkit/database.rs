//! The test database: where tests that need Postgres find it, and what they
//! do when there is none.

/// The URL of the test database (`DATABASE_URL`), or `None` when it is not
/// set: the test named `test` then announces that it is skipped. Under
/// `cargo xtask test-pg` (`QUEUE_TEST_REQUIRE_POSTGRES=1`) a missing
/// database fails the test instead, so Postgres tests never pass by
/// skipping there.
pub fn database_url(test: &str) -> Option<String> {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(
                std::env::var("QUEUE_TEST_REQUIRE_POSTGRES").as_deref() != Ok("1"),
                "{test}: DATABASE_URL is not set but QUEUE_TEST_REQUIRE_POSTGRES=1; run the tests with `cargo xtask test-pg`"
            );
            eprintln!("{test}: skipped: DATABASE_URL is not set (run `cargo xtask test-pg` to include the Postgres tests)");
            None
        }
    }
}
