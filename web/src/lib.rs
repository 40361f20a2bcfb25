//! nightshift-web: the audit UI, JSON API, SSE, Alertmanager webhook and /metrics.
#![forbid(unsafe_code)]
