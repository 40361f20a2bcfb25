//! Shared helpers for the cross-process tests in `tests/tests/`.
#![forbid(unsafe_code)]
