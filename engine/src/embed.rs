//! What the simulator and the measuring tools (`nightshift backtest`,
//! `nightshift bench`) drive the engine's parts with directly — the
//! telemetry store and the triggers without an engine around them, the
//! runbook loader and the script engine (`nightshift runbooks validate`),
//! the Prometheus pull's query and samples, the HA lease — named here so
//! web and the CLI reach them through one door (issue 44).

pub use crate::ha::{Leadership, LeaseConfig, campaign, renew};
pub use crate::runbook::load_dir;
pub use crate::script::{Reading, RunCtx, RunInfo, ScriptHost, TextKind, build_engine, compile, execute};
pub use crate::sources::{PromSample, prometheus_query};
pub use crate::telemetry::{SeriesKey, TelemetryStore, samples_from};
pub use crate::triggers::TriggerSet;
