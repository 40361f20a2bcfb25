//! The front door's plain types (issue 44, first slice): what a person's
//! tools — the web crate and the CLI — hand to the engine and get back,
//! named here rather than reached through the modules that own them. The
//! owning modules are `pub(crate)`; the architecture test
//! (`tests/tests/it/architecture.rs::web_and_cli_reach_only_the_engines_front_modules`)
//! keeps web and the CLI from naming new ones.
//!
//! [`requests`] and [`replies`] are the HTTP API's bodies, one plain type
//! each: the web crate serves them, the CLI sends and reads them in both
//! its modes (a server, or the engine in its own process).

mod facade;
mod replies;
mod requests;

pub use facade::*;
pub use replies::*;
pub use requests::*;

pub use crate::base::counters::{CounterSnapshot, Histogram};
pub use crate::base::metrics::{MetricDef, MetricId, ids, metric, metric_id};
pub use crate::control::{ControlAction, ControlOutcome, Person, ReleaseWhat};
pub use crate::engine::EvidenceReadError;
pub use crate::fleet::FleetChange;
pub use crate::fleet::inventory::{Inventory, NodeDefaults, NodeSpec};
pub use crate::fleet::windows::Window;
pub use crate::fleet::windows::WindowSpec;
pub use crate::health::{Fault, FaultKind, HealthState, Lifecycle, Phases};
pub use crate::node_filter::{NodeFilter, NodeStateFilter, parse_label};
pub use crate::repair::{GpuHealthView, LifecycleView, NodeHealth, PastLifecycle};
pub use crate::run::executor::Plan;
pub use crate::runbooks::manifest::{Manifest, Mode};
pub use crate::runbooks::modes::{FleetMode, modes_path};
pub use crate::server::reload::ReloadReport;
pub use crate::server::reload::{ReloadError, reload, reload_with};
pub use crate::shadow::{ShadowFire, WouldAct};
pub use crate::signals::alerts::{WebhookPayload, format_rfc3339_ms, parse_rfc3339_ms};
pub use crate::views::{Gauges, HaStatus, NodeView, RunbookView};
pub use nightshift_audit::runs::{RunOutcome, RunState, RunSummary, Target};
