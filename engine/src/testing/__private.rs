//! The suites' tests, one function each: what the suites' macros expand to.

pub mod admin_suite;
pub mod claim_suite;
pub mod commit_suite;
