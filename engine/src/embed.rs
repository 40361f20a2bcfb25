//! What the simulator and the measuring tools (`nightshift backtest`,
//! `nightshift-bench`) drive the engine's parts with directly — the
//! telemetry store and the triggers without an engine around them, the
//! runbook loader and the script engine (`nightshift runbooks validate`),
//! the Prometheus pull's query and samples, the HA lease — named here so
//! web and the CLI reach them through one door (issue 44). The simulator,
//! the fuzz targets and the integration tests take the engine's parts from
//! here too: the modules that own them are `pub(crate)`.

pub use crate::base::metrics::{METRICS, MetricId, ids, metric, metric_id, metric_names};
pub use crate::fleet::inventory::{Inventory, NodeSpec};
pub use crate::ha::{Leadership, LeaseConfig, campaign, renew};
pub use crate::health::{FaultKind, HealthState, Lifecycle, XidAction, XidPolicy};
pub use crate::runbooks::manifest::{LoadError, Manifest, Mode, Trigger, locate};
pub use crate::runbooks::modes::{FleetMode, load_modes};
pub use crate::runbooks::runbook::load_dir;
pub use crate::runbooks::runbook::{RunbookSet, load_file};
pub use crate::runbooks::script::ScriptLimits;
pub use crate::runbooks::script::{Reading, RunCtx, RunInfo, ScriptHost, TextKind, build_engine, compile, execute};
pub use crate::runstate::admission::{approval_reason, nodes_changed};
pub use crate::server::reload::{reload, reload_with};
pub use crate::shadow::ShadowFire;
pub use crate::signals::alerts::{WebhookPayload, format_rfc3339_ms, parse_rfc3339_ms};
pub use crate::signals::sources::{
    DCGM_NAMES, DcgmField, add_memory_need, dcgm_metric, host_of, map_samples, parse_exposition, parse_query_response,
    thermal_slowdown,
};
pub use crate::signals::sources::{PromSample, prometheus_query};
pub use crate::signals::telemetry::{SeriesKey, TelemetryStore, samples_from};
pub use crate::signals::triggers::Compiled;
pub use crate::signals::triggers::TriggerSet;
