//! The front door's plain types (issue 44, first slice): what a person's
//! tools — the web crate and the CLI — hand to the engine and get back,
//! named here rather than reached through the modules that own them. The
//! owning modules are `pub(crate)`; the architecture test
//! (`tests/tests/it/architecture.rs::web_and_cli_reach_only_the_engines_front_modules`)
//! keeps web and the CLI from naming new ones.

pub use crate::alerts::{WebhookPayload, format_rfc3339_ms, parse_rfc3339_ms};
pub use crate::control::{ControlOutcome, Person, ReleaseWhat};
pub use crate::evidence::EvidenceReadError;
pub use crate::health::HealthState;
pub use crate::inventory::{Inventory, NodeDefaults, NodeSpec};
pub use crate::manifest::{Manifest, Mode};
pub use crate::metrics::{MetricDef, MetricId, ids, metric, metric_id};
pub use crate::modes::{FleetMode, modes_path};
pub use crate::node_filter::{NodeFilter, NodeStateFilter, parse_label};
pub use crate::reload::{ReloadError, reload, reload_with};
pub use crate::views::NodeView;
pub use crate::windows::WindowSpec;
pub use nightshift_audit::runs::{RunOutcome, RunState, RunSummary, Target};
