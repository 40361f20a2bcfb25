//! What the engine hears: Alertmanager's alerts split into single ones,
//! pulled telemetry (Prometheus, dcgm-exporter), the windows it is kept in,
//! the triggers watching them and the brain that holds both, the plot
//! history, and the backlog of batches taken in and not yet handled. State
//! and evaluation only: taking a batch in and turning a fire into a run is
//! `ingest.rs` and `alert_intake.rs`, above `core`.

pub(crate) mod alerts;
pub(crate) mod backlog;
pub(crate) mod brain;
pub(crate) mod history;
pub(crate) mod sources;
pub(crate) mod telemetry;
pub(crate) mod triggers;
